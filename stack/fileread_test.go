package stack

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// directFile opens a 64 KiB file of known bytes as a fileDev that io_uring
// would read without a worker thread.
func directFile(t *testing.T) (*fileDev, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f.img")
	data := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := OpenFile(path, path, false)
	if err != nil {
		t.Fatal(err)
	}
	f := b.(*fileDev)
	f.asyncRead = true
	t.Cleanup(func() { f.Close() })
	return f, data
}

// TestFileRead: a read that a linear target maps whole onto the file is a
// FileRead at the file's offset, inside the gate and counted until End;
// what cannot go to the file directly (a write, a read crossing a segment
// or the end, another target, a suspended device, a file io_uring reads
// through a worker) is refused.
func TestFileRead(t *testing.T) {
	f, data := directFile(t)
	d := liveDevice(t, "0 16 linear f 8\n16 16 zero", map[string]BlockDevice{"f": f}, nil)

	io := d.FileRead(ioop.Read, 1024, 2048)
	if io == nil {
		t.Fatal("a read inside the linear segment was refused")
	}
	if io.FD != f.fd || io.Off != 8*SectorSize+1024 {
		t.Errorf("FileRead at fd %d offset %d, want %d, %d", io.FD, io.Off, f.fd, 8*SectorSize+1024)
	}
	if s := d.Disk().Snapshot(); s.InFlight[0] != 1 {
		t.Errorf("in flight %v while the read runs", s.InFlight)
	}
	buf := make([]byte, 2048)
	k, err := syscall.Pread(io.FD, buf, io.Off)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.End(context.Background(), buf, k); n != 2048 || err != nil {
		t.Fatalf("End: %d, %v", n, err)
	}
	if !bytes.Equal(buf, data[8*SectorSize+1024:][:2048]) {
		t.Error("wrong bytes")
	}
	s := d.Disk().Snapshot()
	if s.InFlight != [2]uint32{} || s.IOs[stats.GroupRead] != 1 || s.Sectors[stats.GroupRead] != 4 {
		t.Errorf("after End: in flight %v, %d reads, %d sectors", s.InFlight, s.IOs[stats.GroupRead], s.Sectors[stats.GroupRead])
	}

	// A short read (the file shrank) is finished by End, with zeros past
	// the end of the file; an error result is the request's error.
	io = d.FileRead(ioop.Read, 0, 4096)
	buf = make([]byte, 4096)
	copy(buf, data[8*SectorSize:][:100])
	if n, err := io.End(context.Background(), buf, 100); n != 4096 || err != nil || !bytes.Equal(buf, data[8*SectorSize:][:4096]) {
		t.Errorf("short read finished as %d, %v", n, err)
	}
	io = d.FileRead(ioop.Read, 0, 512)
	if _, err := io.End(context.Background(), make([]byte, 512), -int(syscall.EIO)); err != syscall.EIO {
		t.Errorf("failed read: %v", err)
	}

	for _, tc := range []struct {
		name   string
		k      ioop.Op
		off, n int
	}{
		{"write", ioop.Write, 0, 512},
		{"crossing segments", ioop.Read, 15 * SectorSize, 2 * SectorSize},
		{"zero target", ioop.Read, 16 * SectorSize, 512},
		{"past the end", ioop.Read, 32 * SectorSize, 512},
		{"empty", ioop.Read, 0, 0},
	} {
		if io := d.FileRead(tc.k, int64(tc.off), tc.n); io != nil {
			t.Errorf("%s: went to the file", tc.name)
			io.End(context.Background(), make([]byte, tc.n), tc.n)
		}
	}
	if err := d.Suspend(false); err != nil {
		t.Fatal(err)
	}
	if io := d.FileRead(ioop.Read, 0, 512); io != nil {
		t.Error("a read went to the file while the device is suspended")
	}
	if err := d.Resume(); err != nil {
		t.Fatal(err)
	}
	f.asyncRead = false
	if io := d.FileRead(ioop.Read, 0, 512); io != nil {
		t.Error("a read went to a file that io_uring reads through a worker")
	}
}

// TestFileReadHoldsSuspend: a suspend waits for a FileRead to end, as it
// waits for any I/O inside the device.
func TestFileReadHoldsSuspend(t *testing.T) {
	f, _ := directFile(t)
	d := liveDevice(t, "0 16 linear f 0", map[string]BlockDevice{"f": f}, nil)
	io := d.FileRead(ioop.Read, 0, 512)
	done := make(chan error, 1)
	go func() { done <- d.Suspend(false) }()
	select {
	case err := <-done:
		t.Fatalf("suspend returned (%v) while a read was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	io.End(context.Background(), make([]byte, 512), 512)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
