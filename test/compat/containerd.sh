#!/usr/bin/env bash
# containerd.sh: runs containerd's own devmapper snapshotter tests, unchanged,
# against dmfuse's dmsetup (as root, with /dev/fuse and loop devices; no
# dm-mod needed). Fetches github.com/containerd/containerd/v2 through the Go
# module proxy into a throwaway module, builds dmfuse from this checkout,
# links it as dmsetup first on PATH with a private system instance
# (DMFUSE_RUN_DIR), and runs the test binaries of
#
#   plugins/snapshots/devmapper/dmsetup   (TestDMSetup: pool, thin devices,
#                                          snapshot, errnos, info, status)
#   plugins/snapshots/devmapper           (TestPoolDevice, TestSnapshotterSuite,
#                                          TestMultipleXfsMounts, ...)
#
# with -test.root. Usage, from the repository root:
#
#   test/compat/containerd.sh [-run REGEXP] [VERSION]     (default v2.4.2)
#
# Exits with the tests' status. Whatever happens, it stops the daemon,
# unmounts what the tests left mounted under its folder, detaches their
# loop devices and removes the folder. containerd's tests use fixed device
# names (test-pool, thin-1, ...): run one at a time per machine.
set -euo pipefail
run=()
if [ "${1:-}" = -run ]; then
	run=(-test.run "$2")
	shift 2
fi
version=${1:-v2.4.2}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/dmfuse-containerd.XXXXXX)
export DMFUSE_RUN_DIR=$work/run TMPDIR=$work/tmp
mkdir -p "$work/bin" "$work/mod" "$TMPDIR"

cleanup() {
	local m l
	"$work/bin/dmfuse" stop --force >/dev/null 2>&1 || true
	# The tests' mounts and loop devices are under $work (their TempDirs).
	awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" || true; done
	losetup -n -l -O NAME,BACK-FILE | awk -v w="$work/" 'index($2, w) == 1 { print $1 }' |
		while read -r l; do losetup -d "$l" || true; done
	rm -rf "$work"
}
trap cleanup EXIT

echo "== dmfuse from $repo, linked as dmsetup"
(cd "$repo" && go build -o "$work/bin/dmfuse" ./cmd/dmfuse)
ln -s dmfuse "$work/bin/dmsetup"
export PATH="$work/bin:$PATH"

echo "== containerd $version through the Go module proxy"
cd "$work/mod"
go mod init dmfuse-containerd-compat >/dev/null 2>&1
cat >imports.go <<'EOF'
package compat

import (
	_ "github.com/containerd/containerd/v2/plugins/snapshots/devmapper"
	_ "github.com/containerd/containerd/v2/plugins/snapshots/devmapper/dmsetup"
)
EOF
go get "github.com/containerd/containerd/v2@$version" >/dev/null
go mod tidy >/dev/null
pkg=github.com/containerd/containerd/v2/plugins/snapshots/devmapper
status=0
for t in dmsetup:$pkg/dmsetup devmapper:$pkg; do
	name=${t%%:*} path=${t#*:}
	echo "== go test $path"
	go test -c -o "$work/bin/$name.test" "$path"
	# From a folder of its own, as go test runs a test binary.
	mkdir -p "$work/$name" && cd "$work/$name"
	"$work/bin/$name.test" -test.root -test.v -test.count=1 -test.timeout 10m "${run[@]}" || status=1
	cd "$work/mod"
done
exit $status
