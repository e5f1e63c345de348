package uring

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/internal/clock"
)

// nodeFile is the node directFS maps onto its file, at fileBase.
const (
	nodeFile = 20
	fileBase = 4096
)

// directFS is a waitFS that sends nodeFile's reads and writes to a file
// (Direct), and records how they ended.
type directFS struct {
	*waitFS
	f *os.File

	mu     sync.Mutex
	ended  []directEnd
	writes int // WRITEs the file system answered
}

func (d *directFS) Write(_ <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	d.mu.Lock()
	d.writes++
	d.mu.Unlock()
	return uint32(len(data)), fuse.OK
}

type directEnd struct {
	res  int32
	data []byte
}

func (d *directFS) MapDirect(node uint64, write bool, off int64, n int, io *DirectIO) bool {
	if node != nodeFile {
		return false
	}
	io.FD, io.Off, io.Tag = int32(d.f.Fd()), fileBase+off, n
	return true
}

// EndDirect fills a short read with zeros, as stack.FileRead.End does past
// the end of a file.
func (d *directFS) EndDirect(io *DirectIO, p []byte, res int32) int32 {
	d.mu.Lock()
	d.ended = append(d.ended, directEnd{res, bytes.Clone(p)})
	d.mu.Unlock()
	if res >= 0 && int(res) < io.Tag.(int) {
		clear(p[res:])
		res = int32(io.Tag.(int))
	}
	return res
}

func newDirectServer(t *testing.T) (*Server, *fakeRing, *directFS) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "file"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	cfg := Config{Depth: 4, PayloadSize: 8192, Poll: PollOff}
	clk := &clock.Manual{}
	clk.Set(1)
	cfg.Clock = clk
	r := newFakeRing()
	s := newServer(cfg, []ring{r}, [][]byte{make([]byte, bufSize(cfg))})
	w := &waitFS{srv: s, started: make(chan uint64, 16), release: make(chan struct{}), hold: make(chan struct{})}
	fs := &directFS{waitFS: w, f: f}
	if err := s.start(fs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(w.release)
		close(w.hold)
		s.Close()
		s.Wait()
	})
	return s, r, fs
}

// write sends a WRITE of data to node at off, with open flags flags.
func (r *fakeRing) write(unique, node, off uint64, data []byte, flags uint32) {
	in := fuse.WriteIn{Size: uint32(len(data)), Offset: off, Flags: flags}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))[unsafe.Sizeof(fuse.InHeader{}):]
	r.sendData(opWrite, unique, node, b, data)
}

// TestDirect: a READ or WRITE that the file system maps onto a file is
// done on the ring, its reply committed from the completion with the
// file's data (a write) or the read's length; a short read is ended by the
// file system; what it does not map goes to the file system as before.
func TestDirect(t *testing.T) {
	_, r, fs := newDirectServer(t)
	data := bytes.Repeat([]byte("dmfuse!\n"), 512)
	r.write(1, nodeFile, 8192, data, 0)
	if p := r.reply(t); p.unique != 1 || p.status != 0 || p.size != writeOutSize {
		t.Fatalf("WRITE reply %+v", p)
	}
	got := make([]byte, len(data))
	if _, err := fs.f.ReadAt(got, fileBase+8192); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file holds %q... (%v) after the WRITE", got[:16], err)
	}

	r.readAt(2, nodeFile, 8192)
	if p := r.reply(t); p.unique != 2 || p.status != 0 || p.size != 4096 {
		t.Fatalf("READ reply %+v", p)
	}
	// Past the end of the file: the read comes back short, EndDirect
	// fills the rest.
	r.readAt(3, nodeFile, 12288)
	if p := r.reply(t); p.unique != 3 || p.status != 0 || p.size != 4096 {
		t.Fatalf("READ past the end: reply %+v", p)
	}
	// Not mapped: the file system's Read answers.
	r.read(4, nodeFast)
	if p := r.reply(t); p.unique != 4 || p.status != 0 || p.size != 4096 {
		t.Fatalf("READ of another node: reply %+v", p)
	}

	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.ended) != 3 {
		t.Fatalf("%d reads and writes ended on the file, want 3", len(fs.ended))
	}
	if e := fs.ended[0]; e.res != 4096 {
		t.Errorf("WRITE ended with %d", e.res)
	}
	if e := fs.ended[1]; e.res != 4096 || !bytes.Equal(e.data, data) {
		t.Errorf("READ ended with %d, %q...", e.res, e.data[:16])
	}
	if e := fs.ended[2]; e.res != 0 {
		t.Errorf("READ past the end ended with %d, want 0", e.res)
	}
}

// TestDirectFUA: a WRITE with O_DSYNC goes to the file system, which makes
// it durable; the ring's writes are not.
func TestDirectFUA(t *testing.T) {
	_, r, fs := newDirectServer(t)
	r.write(5, nodeFile, 0, make([]byte, 4096), unix.O_DSYNC)
	p := r.reply(t)
	if p.unique != 5 || p.status != 0 {
		t.Fatalf("reply %+v", p)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.ended) != 0 || fs.writes != 1 {
		t.Errorf("a FUA WRITE: %d on the ring, %d through the file system", len(fs.ended), fs.writes)
	}
}
