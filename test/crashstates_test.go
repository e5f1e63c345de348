package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/fs/export"
)

// dmfuse crash end to end: workloads recorded through a log-writes device
// with ext4 on it, then every crash state at the cuts checked by mounting
// or fsck-ing it.

// recordExt4 makes a log-writes device of size bytes over data.img and
// log.img in dir, formats ext4 on it through a loop device, sets the mark
// "mkfs", mounts it (with the options opts), runs fn on the mounted
// folder, then unmounts it and removes the device, which completes the log
// (with the target's end mark, dm-log-writes-end).
func recordExt4(t *testing.T, dir string, size int64, opts string, fn func(d *daemon, root string)) {
	t.Helper()
	requireTool(t, "losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
	sparseFile(t, filepath.Join(dir, "data.img"), size)
	sparseFile(t, filepath.Join(dir, "log.img"), 512<<20)
	d := startDaemon(t, dir, fmt.Sprintf("lw,,,rw,0 %d log-writes ./data.img ./log.img;", size/512))
	loop := strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", d.path("lw")))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	run(t, "mkfs.ext4", "-q", "-F", "-b", "4096", loop)
	d.must("message", "lw", "0", "mark", "mkfs")
	root := filepath.Join(dir, "fs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if opts != "" {
		run(t, "mount", "-o", opts, loop, root)
	} else {
		run(t, "mount", loop, root)
	}
	t.Cleanup(func() {
		if export.Mounted(root) {
			unix.Unmount(root, unix.MNT_DETACH)
		}
	})
	fn(d, root)
	run(t, "umount", root)
	run(t, "losetup", "-d", loop)
	lwRemove(t, d, "lw")
}

// crashCmd runs `dmfuse crash` in dir and returns its output and exit
// status.
func crashCmd(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(dmfuseBin, append([]string{"crash"}, args...)...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("dmfuse crash: %v", err)
	}
	return out.String(), 0
}

// renameCheck mounts a state and says whether f holds what the program
// wrote before it said the rename was done.
const renameCheck = `#!/bin/sh
m=$(mktemp -d) || exit 9
if ! mount -o loop "$DMFUSE_CRASH_DEV" "$m"; then rmdir "$m"; echo "mount failed"; exit 2; fi
c=$(cat "$m/f" 2>&1)
umount "$m"; rmdir "$m"
[ "$c" = new ] || { echo "f holds '$c' after the program said it had renamed the new version over it"; exit 1; }
`

// replaceFile is the program under test: it writes a new version of f
// next to it, fsyncs it, renames it over f and, when dirSync, fsyncs the
// folder, which is what makes the rename durable.
func replaceFile(t *testing.T, root string, dirSync bool) {
	tmp := filepath.Join(root, "f.tmp")
	if err := os.WriteFile(tmp, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	syncPath(t, tmp)
	if err := os.Rename(tmp, filepath.Join(root, "f")); err != nil {
		t.Fatal(err)
	}
	if dirSync {
		syncPath(t, root)
	}
}

// syncPath fsyncs the file or folder p.
func syncPath(t *testing.T, p string) {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestCrashRename: a program that renames a new version of a file over
// the old one and says it is done (a mark in the log).
//
//   - Without an fsync of the folder, the rename is not on the disk when the
//     program says so: at the next flush the state that loses nothing
//     already holds the old file, and dmfuse crash reports that minimal
//     state (it loses nothing).
//   - With the fsync, every state at every later flush holds the new file.
//   - With the fsync but ext4 mounted nobarrier, nothing is flushed after
//     mkfs: at the end of the log, states that lose some of the writes
//     since hold the old file (or none); the first is shrunk to the writes
//     whose loss shows it, and its id rebuilds it.
func TestCrashRename(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dirSync bool
		mount   string
		at      []string
	}{
		{"without-dir-fsync", false, "", []string{"--at", "flush", "--from", "done"}},
		{"with-dir-fsync", true, "", []string{"--at", "flush", "--from", "done"}},
		{"nobarrier", true, "nobarrier", []string{"--at", "mark:dm-log-writes-end"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := lwMemDir(t)
			recordExt4(t, dir, 64<<20, tc.mount, func(d *daemon, root string) {
				f := filepath.Join(root, "f")
				if err := os.WriteFile(f, []byte("old"), 0o644); err != nil {
					t.Fatal(err)
				}
				syncPath(t, f)
				syncPath(t, root)
				replaceFile(t, root, tc.dirSync)
				d.must("message", "lw", "0", "mark", "done")
			})
			if err := os.WriteFile(filepath.Join(dir, "check.sh"), []byte(renameCheck), 0o755); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--log", "log.img", "--states", "16", "--check", "./check.sh"}, tc.at...)
			out, code := crashCmd(t, dir, args...)
			if tc.name == "with-dir-fsync" {
				if code != 0 || !regexp.MustCompile(`(?m)^all \d+ states at [1-9]\d* cuts pass`).MatchString(out) {
					t.Errorf("exit %d\n%s", code, out)
				}
				return
			}
			m := regexp.MustCompile(`(?m)^minimal failing state: (\S+)\n((?:    .*\n)+)`).FindStringSubmatch(out)
			if code != 1 || m == nil || !strings.Contains(out, "after the program said it had renamed") {
				t.Fatalf("exit %d\n%s", code, out)
			}
			t.Logf("minimal failing state %s:\n%s", m[1], m[2])
			if tc.name == "without-dir-fsync" {
				if !strings.Contains(m[2], "it loses nothing") || !strings.HasSuffix(m[1], ":-:old") {
					t.Errorf("the minimal state loses something:\n%s", m[2])
				}
				return
			}
			if !strings.Contains(m[2], "entry ") || strings.Count(m[2], "\n") > 3 {
				t.Errorf("the minimal state does not name one to three lost writes:\n%s", m[2])
			}
			// The id rebuilds the state: it fails again, and exported it
			// mounts with the old file.
			again, code := crashCmd(t, dir, "--log", "log.img", "--state", m[1], "--check", "./check.sh")
			if code != 1 || !strings.Contains(again, "FAIL "+m[1]) {
				t.Errorf("--state %s: exit %d\n%s", m[1], code, again)
			}
			if out, code := crashCmd(t, dir, "--log", "log.img", "--state", m[1], "--export", "state.img"); code != 0 {
				t.Fatalf("--export: exit %d\n%s", code, out)
			}
			cmd := exec.Command("./check.sh")
			cmd.Dir, cmd.Env = dir, append(os.Environ(), "DMFUSE_CRASH_DEV=state.img")
			if out, err := cmd.CombinedOutput(); err == nil {
				t.Errorf("the exported state passes the check:\n%s", out)
			}
			// Keeping what it lost passes: the loss is what fails.
			cut, _, _ := strings.Cut(m[1], ":")
			if out, code := crashCmd(t, dir, "--log", "log.img", "--state", cut+":-:old", "--check", "./check.sh"); code != 0 {
				t.Errorf("the same cut losing nothing: exit %d\n%s", code, out)
			}
			// An id that is not of this log is refused.
			if out, code := crashCmd(t, dir, "--log", "log.img", "--state", "999999:-:old", "--check", "true"); code != 2 || !strings.Contains(out, "the log has") {
				t.Errorf("a foreign id: exit %d\n%s", code, out)
			}
		})
	}
}

// mountFsckCheck checks a state as xfstests' generic/482 checks a replayed
// image: mount it (journal recovery, orphans), unmount it, then e2fsck -fn
// (which alone would report the free counts ext4 keeps lazily).
const mountFsckCheck = `#!/bin/sh
m=$(mktemp -d) || exit 9
mount -o loop "$DMFUSE_CRASH_DEV" "$m" || { rmdir "$m"; echo "mount failed"; exit 2; }
umount "$m"; rmdir "$m"
e2fsck -fn "$DMFUSE_CRASH_DEV"
`

// TestCrashExt4Subset: ext4 under a workload of fsyncs and renames, every
// flush after mkfs checked in subset mode (a sample of the lost-write
// subsets at each): every state is clean under e2fsck once its journal is
// recovered by a mount.
func TestCrashExt4Subset(t *testing.T) {
	dir := lwMemDir(t)
	recordExt4(t, dir, 64<<20, "", func(d *daemon, root string) { ext4Workload(t, root, 12) })
	if err := os.WriteFile(filepath.Join(dir, "check.sh"), []byte(mountFsckCheck), 0o755); err != nil {
		t.Fatal(err)
	}
	out, code := crashCmd(t, dir, "--log", "log.img", "--at", "flush", "--from", "mkfs", "--states", "4", "--seed", "7", "--check", "./check.sh")
	m := regexp.MustCompile(`(?m)^all (\d+) states at (\d+) cuts pass`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("exit %d\n%s", code, out)
	}
	var states, cuts int
	fmt.Sscan(m[1], &states)
	fmt.Sscan(m[2], &cuts)
	if cuts < 10 || states <= cuts {
		t.Errorf("%d states at %d cuts: want more than one state per cut at ten cuts or more", states, cuts)
	}
	t.Logf("%s", strings.TrimSpace(out))
}
