package test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackingVerify: a linear device over each backing kind with a path of
// its own, under fio random writes and reads with verification, 2 jobs x
// QD32; afterwards the device file and its backing, read with the system
// calls, hold the same bytes. The kinds: a file on tmpfs, which the daemon
// maps in memory (stack/filemap.go), and a loop device over one, which the
// daemon reads and writes with direct I/O where aligned
// (stack/filedirect.go), through the ring on io_uring.
func TestBackingVerify(t *testing.T) {
	requireTool(t, "fio")
	for _, kind := range []string{"tmpfs", "block"} {
		t.Run(kind, func(t *testing.T) {
			dir := lwMemDir(t)
			backing := filepath.Join(dir, "a.img")
			sparseFile(t, backing, 16<<20)
			if kind == "block" {
				requireTool(t, "losetup")
				backing = strings.TrimSpace(run(t, "losetup", "-f", "--show", backing))
				t.Cleanup(func() { exec.Command("losetup", "-d", backing).Run() })
			}
			d := startDaemon(t, dir, "lin,,,rw,0 32768 linear "+backing+" 0;")
			for _, rw := range []string{"randwrite", "randrw"} {
				run(t, "fio", "--name=v", "--filename="+d.path("lin"), "--direct=1", "--bsrange=1k-16k", "--rw="+rw,
					"--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--size=8m", "--offset_increment=8m",
					"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
			}
			// Buffered writes through the device file's page cache too.
			run(t, "fio", "--name=b", "--filename="+d.path("lin"), "--bs=4k", "--rw=randwrite", "--size=4m",
				"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0", "--end_fsync=1")
			dev, err := os.ReadFile(d.path("lin"))
			if err != nil {
				t.Fatal(err)
			}
			back, err := os.ReadFile(backing)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dev, back) {
				t.Errorf("the device and its backing differ from byte %d", firstDiff(dev, back))
			}
		})
	}
}
