package stack

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// pageBuf returns n bytes aligned to the page, as the ring transport's
// payload buffers are.
func pageBuf(n int) []byte {
	b := make([]byte, n+4096)
	k := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[k%4096:][:n]
}

// TestBlockDirect: a block device is also opened with O_DIRECT, which
// takes the aligned writes through FileIO; misaligned writes are not
// FileIOs and reads keep the buffered descriptor; what each descriptor
// writes the other reads back; a write the device refuses for its buffer
// is redone buffered by End.
func TestBlockDirect(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	b, err := OpenFile(dev, dev, false)
	if err != nil {
		t.Fatal(err)
	}
	f := b.(*fileDev)
	defer f.Close()
	if f.dfd < 0 {
		t.Fatalf("%s: no direct descriptor", dev)
	}
	ctx := context.Background()
	d := liveDevice(t, "0 64 linear f 16", map[string]BlockDevice{"f": f}, nil)
	data := pageBuf(4096)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	// Read first, so that the page is cached on the buffered side.
	back := pageBuf(4096)
	if _, err := d.ReadAt(ctx, back, 4096); err != nil {
		t.Fatal(err)
	}
	io := d.FileIO(ioop.Write, 4096, 4096)
	if io == nil || io.FD != f.dfd || io.Off != 16*SectorSize+4096 {
		t.Fatalf("aligned write: %+v, want the direct fd %d at %d", io, f.dfd, 16*SectorSize+4096)
	}
	k, err := unix.Pwrite(io.FD, data, io.Off)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.End(ctx, data, k); n != 4096 || err != nil {
		t.Fatalf("End of the write: %d, %v", n, err)
	}
	if _, err := d.ReadAt(ctx, back, 4096); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("buffered read after the direct write: %v, equal %v", err, bytes.Equal(back, data))
	}
	// A buffered write over part of it, then a direct write of the
	// page next to it; both read back.
	if _, err := d.WriteAt(ctx, []byte("buffered"), 4096+100); err != nil {
		t.Fatal(err)
	}
	io = d.FileIO(ioop.Write, 8192, 4096)
	if _, err := unix.Pwrite(io.FD, data, io.Off); err != nil {
		t.Fatal(err)
	}
	io.End(ctx, data, 4096)
	two := make([]byte, 8192)
	if _, err := d.ReadAt(ctx, two, 4096); err != nil || string(two[100:108]) != "buffered" || !bytes.Equal(two[4096:], data) {
		t.Fatalf("read back: %v, %q", err, two[96:112])
	}

	if io := d.FileIO(ioop.Write, 100, 4096); io != nil {
		t.Errorf("a misaligned write went to fd %d", io.FD)
		io.End(ctx, data, 4096)
	}
	if io := d.FileIO(ioop.Read, 4096, 4096); io == nil || io.FD != f.fd {
		t.Errorf("a read: %+v, want the buffered fd %d", io, f.fd)
	} else {
		io.End(ctx, make([]byte, 4096), 4096)
	}
	// The ring's write refused for a misaligned buffer: End does it again.
	io = d.FileIO(ioop.Write, 8192, 4096)
	msg := bytes.Repeat([]byte("x"), 4097)[1:]
	if n, err := io.End(ctx, msg, -int(syscall.EINVAL)); n != 4096 || err != nil {
		t.Fatalf("End after EINVAL: %d, %v", n, err)
	}
	if _, err := d.ReadAt(ctx, back, 8192); err != nil || !bytes.Equal(back, msg) {
		t.Fatalf("the redone write: %v, %q", err, back[:8])
	}
}

// TestBlockDirectReadOnly: a block device opened read-only has no direct
// descriptor, and a read-only table's writes never go to the device
// directly.
func TestBlockDirectReadOnly(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	ro, err := OpenFile(dev, dev, true)
	if err != nil {
		t.Fatal(err)
	}
	if fd := ro.(*fileDev).dfd; fd >= 0 {
		t.Errorf("read-only open: direct descriptor %d", fd)
	}
	ro.(*fileDev).Close()
	b, err := OpenFile(dev, dev, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.(*fileDev).Close()
	d := liveDevice(t, "0 64 linear f 0", map[string]BlockDevice{"f": b}, nil)
	d.live.Load().readOnly = true
	if io := d.FileIO(ioop.Write, 0, 4096); io != nil {
		t.Errorf("a write of a read-only table went to fd %d", io.FD)
	}
}
