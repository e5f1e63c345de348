package uring

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

func TestQueues(t *testing.T) {
	if n := Queues(); n < 1 {
		t.Fatalf("Queues() = %d", n)
	}
}

func fds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	return len(ents)
}

// TestNewClose checks that rings made for a mount that never starts leave
// no descriptor behind.
func TestNewClose(t *testing.T) {
	before := fds(t)
	s, err := New(Config{Depth: 2, PayloadSize: 8192})
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	if len(s.queues) != Queues() {
		t.Errorf("%d queues, want %d", len(s.queues), Queues())
	}
	s.Close()
	s.Wait()
	if after := fds(t); after != before {
		t.Errorf("%d descriptors after Close, %d before", after, before)
	}
}

// fakeFS answers GETATTR, LOOKUP and READ the way a node tree would.
type fakeFS struct {
	fuse.RawFileSystem
}

func (fakeFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	out.Ino = in.NodeId
	out.Size = 4242
	return fuse.OK
}

func (fakeFS) Lookup(_ <-chan struct{}, _ *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if name != "dev" {
		return fuse.ENOENT
	}
	out.NodeId = 7
	return fuse.OK
}

func (fakeFS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	for i := range buf {
		buf[i] = byte(in.Offset) + byte(i)
	}
	return fuse.ReadResultData(buf[:in.Size/2]), fuse.OK
}

func newTestEntry() *entry {
	mem := make([]byte, 512+8192)
	return &entry{hdr: mem[:headerBufSize], payload: mem[512:], cancel: make(chan struct{})}
}

// request writes a request into e's buffers as the kernel does.
func (e *entry) request(op uint32, unique, node uint64, opIn []byte, payload []byte) {
	h := (*fuse.InHeader)(unsafe.Pointer(&e.hdr[0]))
	*h = fuse.InHeader{Opcode: op, Unique: unique, NodeId: node}
	copy(e.hdr[hdrOpIn:], opIn)
	*(*uint64)(unsafe.Pointer(&e.hdr[hdrCommitID])) = unique
	*(*uint32)(unsafe.Pointer(&e.hdr[hdrPayloadSz])) = uint32(len(payload))
	copy(e.payload, payload)
}

func (e *entry) reply() (fuse.OutHeader, int) {
	return *(*fuse.OutHeader)(unsafe.Pointer(&e.hdr[0])), int(*(*uint32)(unsafe.Pointer(&e.hdr[hdrPayloadSz])))
}

func TestDispatch(t *testing.T) {
	e := newTestEntry()
	e.request(opGetattr, 10, 3, make([]byte, 16), nil)
	e.prepare()
	e.dispatch(fakeFS{})
	o, n := e.reply()
	a := (*fuse.AttrOut)(unsafe.Pointer(&e.payload[0]))
	if o.Unique != 10 || o.Status != 0 || n != attrOutSize || a.Size != 4242 || a.Ino != 3 || e.commitID != 10 {
		t.Errorf("GETATTR: %+v, %d bytes, %+v", o, n, a.Attr)
	}

	e.request(opLookup, 11, 1, nil, []byte("nope\x00"))
	e.prepare()
	e.dispatch(fakeFS{})
	if o, n := e.reply(); o.Status != -int32(fuse.ENOENT) || n != 0 {
		t.Errorf("LOOKUP of a missing name: %+v, %d bytes", o, n)
	}
	e.request(opLookup, 12, 1, nil, []byte("dev\x00"))
	e.prepare()
	e.dispatch(fakeFS{})
	if o, n := e.reply(); o.Status != 0 || n != entryOutSize || (*fuse.EntryOut)(unsafe.Pointer(&e.payload[0])).NodeId != 7 {
		t.Errorf("LOOKUP: %+v, %d bytes", o, n)
	}

	in := fuse.ReadIn{Offset: 5, Size: 100}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))[unsafe.Sizeof(fuse.InHeader{}):]
	e.request(opRead, 13, 7, b, nil)
	e.prepare()
	e.dispatch(fakeFS{})
	if o, n := e.reply(); o.Status != 0 || n != 50 || e.payload[1] != 6 {
		t.Errorf("READ: %+v, %d bytes", o, n)
	}

	e.request(52, 14, 7, nil, nil) // STATX
	e.prepare()
	e.dispatch(fakeFS{})
	if o, n := e.reply(); o.Status != -int32(fuse.ENOSYS) || n != 0 {
		t.Errorf("STATX: %+v, %d bytes", o, n)
	}
}

// TestRingTimedWait: a wait with a timeout on the kernel's ring returns
// without error when the timeout passes with nothing to reap (ETIME), and
// a wake still ends a wait without one.
func TestRingTimedWait(t *testing.T) {
	r, err := newSysRing(0, 4, 0)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	defer r.close()
	if !r.extArg {
		t.Skip("the kernel has no IORING_ENTER_EXT_ARG")
	}
	for range 3 {
		if err := r.wait(int64(100 * time.Microsecond)); err != nil {
			t.Fatalf("timed wait: %v", err)
		}
		if _, _, ok := r.next(); ok {
			t.Fatal("a completion after a timed wait on an empty ring")
		}
	}
	r.wake()
	if err := r.wait(0); err != nil {
		t.Fatalf("wait after wake: %v", err)
	}
}
