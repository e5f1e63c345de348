package uring

import (
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// forgetFS records FORGETs.
type forgetFS struct {
	fuse.RawFileSystem
	mu      sync.Mutex
	forgets map[uint64]uint64
}

func (f *forgetFS) Forget(node, n uint64) {
	f.mu.Lock()
	f.forgets[node] += n
	f.mu.Unlock()
}

// devMsg builds a request as the kernel writes it to /dev/fuse.
func devMsg(op uint32, unique, node uint64, arg ...uint64) []byte {
	b := make([]byte, inHeaderSize+8*len(arg))
	*(*fuse.InHeader)(unsafe.Pointer(&b[0])) = fuse.InHeader{Length: uint32(len(b)), Opcode: op, Unique: unique, NodeId: node}
	for i, a := range arg {
		*(*uint64)(unsafe.Pointer(&b[inHeaderSize+8*i])) = a
	}
	return b
}

// TestServeDev plays /dev/fuse with a socket pair: FORGET and BATCH_FORGET
// reach the file system, an INTERRUPT ends the ring request it names, one
// that comes before its request started ends it as it starts, another
// request is answered EIO, and the end of the connection ends ServeDev and
// interrupts the request still running.
func TestServeDev(t *testing.T) {
	s, r, wfs, _ := newFakeServer(t, 2)
	// waitFS passes what it does not serve itself on to the file system
	// it embeds.
	fs := &forgetFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), forgets: map[uint64]uint64{}}
	wfs.RawFileSystem = fs
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	kernel := p[0]
	defer unix.Close(p[1])
	served := make(chan error, 1)
	go func() { served <- s.ServeDev(p[1]) }()
	send := func(b []byte) {
		t.Helper()
		if _, err := unix.Write(kernel, b); err != nil {
			t.Fatal(err)
		}
	}

	// A running request, interrupted.
	r.read(100, nodeCancel)
	<-wfs.started
	send(devMsg(opInterrupt, 1001, 0, 100))
	if p := r.reply(t); p.unique != 100 || p.status != -int32(unix.EINTR) {
		t.Errorf("interrupted reply %+v", p)
	}
	// An interrupt for a request no queue has started yet: kept, and
	// claimed when the request starts. The FORGETs behind it are served
	// in order, so once they arrive the interrupt has been taken in.
	send(devMsg(opInterrupt, 1003, 0, 102))
	send(devMsg(opForget, 1005, 7, 3))
	batch := devMsg(opBatchForget, 0, 0, 2, 8, 1, 9, 4)
	send(batch)
	for {
		fs.mu.Lock()
		n := len(fs.forgets)
		fs.mu.Unlock()
		if n == 3 {
			break
		}
		select {
		case err := <-served:
			t.Fatalf("ServeDev ended: %v", err)
		default:
			runtime.Gosched()
		}
	}
	if s.nEarly.Load() != 1 {
		t.Fatalf("%d early interrupts kept, want 1", s.nEarly.Load())
	}
	r.read(102, nodeCancel)
	<-wfs.started
	if p := r.reply(t); p.unique != 102 || p.status != -int32(unix.EINTR) {
		t.Errorf("reply of the request interrupted early %+v", p)
	}
	if s.nEarly.Load() != 0 {
		t.Errorf("%d early interrupts left", s.nEarly.Load())
	}
	fs.mu.Lock()
	if fs.forgets[7] != 3 || fs.forgets[8] != 1 || fs.forgets[9] != 4 {
		t.Errorf("forgets %v", fs.forgets)
	}
	fs.mu.Unlock()
	if st := s.Stats(); st.Interrupts != 2 {
		t.Errorf("%d interrupts counted, want 2", st.Interrupts)
	}

	// Anything else: EIO.
	send(devMsg(26, 1007, 1)) // INIT
	b := make([]byte, 64)
	n, err := unix.Read(kernel, b)
	if err != nil || n != outHeaderSize {
		t.Fatalf("reply: %d bytes, %v", n, err)
	}
	if o := (*fuse.OutHeader)(unsafe.Pointer(&b[0])); o.Unique != 1007 || o.Status != -int32(unix.EIO) || o.Length != uint32(outHeaderSize) {
		t.Errorf("reply %+v", o)
	}

	// The end of the connection interrupts what still runs.
	r.read(104, nodeCancel)
	<-wfs.started
	unix.Close(kernel)
	if err := <-served; err != nil {
		t.Errorf("ServeDev: %v", err)
	}
	if p := r.reply(t); p.unique != 104 || p.status != -int32(unix.EINTR) {
		t.Errorf("reply of the request running at the end %+v", p)
	}
}

// TestEarlyInterruptExpires: an interrupt whose request never starts (it
// had ended) is forgotten after earlyTTL, so dispatch stops looking.
func TestEarlyInterruptExpires(t *testing.T) {
	s, r, _, clk := newFakeServer(t, 1)
	s.interruptSoon(500)
	if s.nEarly.Load() != 1 {
		t.Fatalf("%d early interrupts", s.nEarly.Load())
	}
	clk.Set(clk.Nanotime() + earlyTTL + 1)
	r.read(502, nodeFast)
	if p := r.reply(t); p.unique != 502 || p.status != 0 {
		t.Errorf("reply %+v", p)
	}
	if s.nEarly.Load() != 0 || s.Stats().Interrupts != 0 {
		t.Errorf("%d early interrupts, %d interrupts", s.nEarly.Load(), s.Stats().Interrupts)
	}
}

// TestInterruptibleContext: with Config.Interruptible the request's context
// ends when the request is interrupted, and the entry's next request gets a
// live one; without it the context never ends.
func TestInterruptibleContext(t *testing.T) {
	for _, on := range []bool{false, true} {
		cfg := Config{Depth: 1, PayloadSize: 8192, Interruptible: on}
		s := newServer(cfg, []ring{newFakeRing()}, [][]byte{make([]byte, bufSize(cfg))})
		e := &s.queues[0].ent[0]
		e.run.Store(100)
		ctx := s.Context(e.cancel)
		if !s.Interrupt(100) {
			t.Fatal("no request 100")
		}
		e.ended()
		if on != (ctx.Err() != nil) {
			t.Errorf("interruptible %v: Err %v after the interrupt", on, ctx.Err())
		}
		if on {
			select {
			case <-ctx.Done():
			default:
				t.Error("Done is not closed after the interrupt")
			}
		} else if ctx.Done() != nil {
			t.Error("a context that cannot end has a Done channel")
		}
		if e.prepare() {
			s.renew(e)
		}
		if ctx := s.Context(e.cancel); ctx == nil || ctx.Err() != nil {
			t.Errorf("interruptible %v: the next request's context: %v", on, ctx)
		}
	}
}
