#!/usr/bin/env bash
# lvm2.sh: runs lvm2's own test suite, unchanged, under `dmfuse exec` (as
# root, with /dev/fuse and loop devices; no dm-mod needed). Takes an lvm2
# source tree (a release tarball unpacked, or a checkout such as the one
# `git clone https://github.com/lvmteam/lvm2 && git -C lvm2 checkout v2_03_16`
# gives), configures and builds it there if that was not done yet (lvm,
# dmsetup, dmeventd and the test harness, against thin-provisioning-tools'
# thin_check), builds dmfuse from this checkout, and runs
#
#   dmfuse exec -- make -C SRC/test check_local T=... S=...
#
# with a private system instance (DMFUSE_RUN_DIR): the suite's lvm, dmsetup
# and dmeventd speak DM ioctls to dmfuse, in the private DM_DEV_DIR the suite
# makes, over the loop devices it attaches. Usage, from the repository root:
#
#   test/compat/lvm2.sh SRC [T [S]]
#
# T and S are the suite's own: comma-separated regular expressions of the
# scripts to run and to skip (default: every test/shell script; S defaults
# to the ones for lvmlockd, lvmpolld's D-Bus service and other daemons this
# machine does not run). It prints one line per script (passed, failed,
# skipped, timeout, warnings) and the summary, and exits 0 whatever they
# were (the results are the point); the logs are in SRC/test/results.
# Whatever happens, it stops the daemon, detaches the loop devices the suite
# left and removes its folder.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -f "$1/configure" ] || [ ! -d "$1/test/shell" ]; then
	echo "usage: $0 LVM2-SOURCE-TREE [T [S]]" >&2
	exit 2
fi
src=$(cd "$1" && pwd)
only=${2:-shell/}
skip=${3:-lvmlockd,dbus,lvmpolld,idm,sanlock,dlm,clvmd}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/dmfuse-lvm2.XXXXXX)
export DMFUSE_RUN_DIR=$work/run

cleanup() {
	local l
	"$work/dmfuse" stop --force >/dev/null 2>&1 || true
	# The suite's loop devices are over files in its LVMTEST folders.
	losetup -n -l -O NAME,BACK-FILE | awk 'index($2, "/LVMTEST") > 0 { print $1 }' |
		while read -r l; do losetup -d "$l" || true; done
	rm -rf "$work"
}
trap cleanup EXIT

# What building lvm2 and its harness needs (Debian's names).
missing=()
for pair in gcc:gcc g++:g++ make:make pkg-config:pkg-config /usr/include/libaio.h:libaio-dev \
	/usr/include/blkid/blkid.h:libblkid-dev /usr/sbin/thin_check:thin-provisioning-tools; do
	f=${pair%%:*}
	if [[ $f == /* ]]; then [ -e "$f" ] || missing+=("${pair#*:}"); else command -v "$f" >/dev/null || missing+=("${pair#*:}"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "== installing ${missing[*]}"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cd "$src"
if [ ! -x tools/lvm ] || [ ! -x test/lib/runner ]; then
	echo "== configuring and building lvm2 in $src"
	if [ ! -f make.tmpl ]; then
		./configure --enable-dmeventd --enable-cmdlib --disable-udev_sync \
			--with-thin-check=/usr/sbin/thin_check --with-thin-dump=/usr/sbin/thin_dump \
			--with-thin-repair=/usr/sbin/thin_repair --with-thin-restore=/usr/sbin/thin_restore >"$work/configure.log" 2>&1 ||
			{ tail -20 "$work/configure.log"; exit 1; }
	fi
	make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
	make -C test .tests-stamp >>"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
fi

echo "== dmfuse from $repo"
(cd "$repo" && go build -o "$work/dmfuse" ./cmd/dmfuse)

echo "== lvm2 $(cat VERSION) test suite under dmfuse exec: T=$only S=$skip"
rm -rf test/results
"$work/dmfuse" exec -- make -C test check_local T="$only" S="$skip" >"$work/check.log" 2>&1 || true
if [ -f test/results/list ]; then
	sed -e 's/^ndev-vanilla:shell\///' test/results/list | sort
else
	tail -30 "$work/check.log"
fi
grep '^### [0-9]* tests:' "$work/check.log" || true
