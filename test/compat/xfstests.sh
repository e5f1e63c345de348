#!/usr/bin/env bash
# xfstests.sh: runs fstests (xfstests) tests, unchanged, under `dmfuse exec`
# (as root, with /dev/fuse and loop devices; no dm-mod needed): the tests'
# dmsetup and lvm are Debian's, speaking DM ioctls to dmfuse. Takes an
# xfstests source tree (`git clone https://github.com/kdave/xfstests`),
# installs what building and running it needs from Debian's packages,
# builds it there if that was not done yet, builds dmfuse from this
# checkout, makes the test and scratch devices (and a log-writes device) on
# loop devices over sparse files, and runs
#
#   dmfuse exec -- ./check TEST...
#
# once per file system the tests need (generic/* on FSTYP, default xfs;
# btrfs/* on btrfs; ext4/* on ext4), with a private system instance
# (DMFUSE_RUN_DIR). Usage, from the repository root:
#
#   test/compat/xfstests.sh SRC [TEST...]
#
# The default tests are those of the snapshot targets, the thin targets and
# log-writes: generic/081 generic/459 btrfs/291 generic/347 generic/482.
# It prints each test's line from check and its summary, and exits with
# check's status. Whatever happens, it stops the daemon, unmounts and
# detaches what it made and removes its folder.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -x "$1/check" ]; then
	echo "usage: $0 XFSTESTS-TREE [TEST...]" >&2
	exit 2
fi
src=$(cd "$1" && pwd)
shift
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(generic/081 generic/459 btrfs/291 generic/347 generic/482)
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/dmfuse-xfstests.XXXXXX)
export DMFUSE_RUN_DIR=$work/run
loops=()

cleanup() {
	local m l
	awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" || true; done
	"$work/dmfuse" stop --force >/dev/null 2>&1 || true
	# What ran under dmfuse exec (dmeventd) lets go of the devices a
	# moment after the stop.
	for l in "${loops[@]}"; do
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			losetup -d "$l" 2>/dev/null && break
			sleep 0.5
		done
	done
	rm -rf "$work"
}
trap cleanup EXIT

# What building and running the tests needs (Debian's names).
need=(xfslibs-dev uuid-dev libtool-bin automake autoconf libacl1-dev libaio-dev libgdbm-dev
	libcap-dev liburing-dev gawk bc attr acl quota xfsprogs btrfs-progs e2fsprogs fsverity
	dmsetup lvm2 thin-provisioning-tools psmisc)
missing=()
for p in "${need[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "== installing ${missing[*]}"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
for u in fsgqa 123456-fsgqa fsgqa2; do
	id "$u" >/dev/null 2>&1 || useradd -m "$u" 2>/dev/null || true
done

cd "$src"
if [ ! -x ltp/fsstress ]; then
	echo "== building xfstests in $src"
	make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
fi

echo "== dmfuse from $repo"
(cd "$repo" && go build -o "$work/dmfuse" ./cmd/dmfuse)

# No udevd runs under dmfuse exec (nor on most machines without dm-mod),
# and `udevadm wait`, which fstests uses when udevadm has it, waits for
# udevd's database for ever. This udevadm, first on PATH, answers wait by
# watching the node itself (appears, or with --removed goes, within 10 s)
# and hands every other verb to the real one.
mkdir -p "$work/bin"
cat >"$work/bin/udevadm" <<'SHIM'
#!/bin/bash
if [ "$1" != wait ]; then exec /usr/bin/udevadm "$@"; fi
shift
removed=0 paths=()
for a in "$@"; do
	case $a in
	--removed) removed=1 ;;
	-*) ;;
	*) paths+=("$a") ;;
	esac
done
for ((i = 0; i < 1000; i++)); do
	ok=1
	for p in "${paths[@]}"; do
		if [ $removed = 1 ]; then [ -e "$p" ] && ok=0; else [ -e "$p" ] || ok=0; fi
	done
	[ $ok = 1 ] && exit 0
	sleep 0.01
done
exit 1
SHIM
chmod +x "$work/bin/udevadm"
export PATH="$work/bin:$PATH"

# newloop NAME SIZE: a loop device over a new sparse file.
newloop() {
	truncate -s "$2" "$work/$1.img"
	local l
	l=$(losetup -f --show "$work/$1.img")
	loops+=("$l")
	echo "$l"
}
test_dev=$(newloop test 2G)
scratch_dev=$(newloop scratch 2G)
logwrites_dev=$(newloop logwrites 2G)
mkdir -p "$work/test" "$work/scratch"

# run FSTYP TEST...: check's run on one file system.
run() {
	local fstyp=$1
	shift
	"mkfs.$fstyp" -q -f "$test_dev" >/dev/null 2>&1 || "mkfs.$fstyp" -q -F "$test_dev" >/dev/null
	cat >local.config <<EOF
export FSTYP=$fstyp
export TEST_DEV=$test_dev
export TEST_DIR=$work/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$work/scratch
export LOGWRITES_DEV=$logwrites_dev
export RESULT_BASE=$work/results
EOF
	echo "== $fstyp: $*"
	"$work/dmfuse" exec -- ./check "$@"
}

status=0
by_fs() { printf '%s\n' "${tests[@]}" | grep "^$1/" || true; }
generic=$(by_fs generic)
[ -z "$generic" ] || run "${FSTYP:-xfs}" $generic || status=$?
for fs in btrfs ext4 xfs; do
	t=$(by_fs "$fs")
	[ -z "$t" ] || run "$fs" $t || status=$?
done
rm -f local.config
exit $status
