package test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestMappedBackingVerify: a linear device over a file on tmpfs, which the
// daemon maps in memory (stack/filemap.go), under fio random writes and
// reads with verification, 2 jobs x QD32; afterwards the device file and
// the backing file, read with the system calls, hold the same bytes.
func TestMappedBackingVerify(t *testing.T) {
	requireTool(t, "fio")
	dir := lwMemDir(t)
	sparseFile(t, filepath.Join(dir, "a.img"), 16<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 32768 linear ./a.img 0;")
	for _, rw := range []string{"randwrite", "randrw"} {
		run(t, "fio", "--name=v", "--filename="+d.path("lin"), "--direct=1", "--bs=4k", "--rw="+rw,
			"--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--size=8m", "--offset_increment=8m",
			"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
	}
	dev, err := os.ReadFile(d.path("lin"))
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join(dir, "a.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev, file) {
		t.Errorf("the device and its backing file differ from byte %d", firstDiff(dev, file))
	}
}
