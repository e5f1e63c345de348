package uring

import (
	"context"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE opcodes served on the rings (include/uapi/linux/fuse.h).
const (
	opLookup      = 1
	opGetattr     = 3
	opSetattr     = 4
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opFlush       = 25
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opFsyncdir    = 30
	opAccess      = 34
	opFallocate   = 43
	opReaddirplus = 44
	opLseek       = 46
)

// Layout of the per-entry header buffer (struct fuse_uring_req_header).
const (
	hdrInOut      = 0   // fuse_in_header on arrival, fuse_out_header on reply
	hdrOpIn       = 128 // the opcode's fixed input struct
	hdrEntInOut   = 256 // struct fuse_uring_ent_in_out
	hdrCommitID   = hdrEntInOut + 8
	hdrPayloadSz  = hdrEntInOut + 16
	headerBufSize = 288

	inHeaderSize  = int(unsafe.Sizeof(fuse.InHeader{}))
	outHeaderSize = int(unsafe.Sizeof(fuse.OutHeader{}))
)

// opInSize is the size of each served opcode's fixed input struct as the
// kernel sends it; go-fuse's structs are the in-header followed by the same
// bytes.
var opInSize = [...]int{
	opGetattr:     16,
	opSetattr:     88,
	opOpen:        8,
	opRead:        40,
	opWrite:       40,
	opRelease:     24,
	opFsync:       16,
	opFlush:       24,
	opOpendir:     8,
	opReaddir:     40,
	opReleasedir:  24,
	opFsyncdir:    16,
	opAccess:      8,
	opFallocate:   32,
	opReaddirplus: 40,
	opLseek:       24,
}

// Reply sizes of fixed replies; the kernel wants exactly these.
var (
	entryOutSize  = int(unsafe.Sizeof(fuse.EntryOut{}))
	attrOutSize   = int(unsafe.Sizeof(fuse.AttrOut{}))
	openOutSize   = int(unsafe.Sizeof(fuse.OpenOut{}))
	writeOutSize  = int(unsafe.Sizeof(fuse.WriteOut{}))
	statfsOutSize = int(unsafe.Sizeof(fuse.StatfsOut{}))
	lseekOutSize  = int(unsafe.Sizeof(fuse.LseekOut{}))
)

// entry is one registered ring entry: a header buffer and a payload buffer
// that the kernel fills with a request and the server overwrites with the
// reply.
type entry struct {
	q   *queue
	idx int

	hdr     []byte // headerBufSize bytes, in the queue's mapping
	payload []byte // the payload buffer, in the queue's mapping
	iov     [2]iovec

	commitID uint64
	unique   uint64
	nodeID   uint64
	fua      bool   // a WRITE with O_DSYNC
	seq      uint64 // the queue's sequence number of the request

	// cancel is handed to the RawFileSystem with every request of the
	// entry; Interrupt closes it, and the next request gets a new one.
	// ioCtx and fuaCtx are Server.Context's answers for it.
	cancel         chan struct{}
	ioCtx, fuaCtx  context.Context
	run            atomic.Uint64 // unique of the request running; with runClosing/runClosed once interrupted
	cancelIsClosed bool          // the leader's: renew cancel before the next request

	// in holds the in-header followed by the opcode's input struct, laid
	// out as go-fuse's ...In structs expect them.
	in [32]uint64

	next *entry // in the queue's list of finished entries

	// dio is the entry's READ or WRITE on a file while it runs there
	// (Direct), of dioLen bytes.
	dio      DirectIO
	dioLen   int
	dioWrite bool

	// expectAt is when the running request said it would complete
	// (Expecting), by the server's clock; 0: it did not say.
	expectAt atomic.Int64
}

// Interrupt states of entry.run, above any unique id the kernel hands out.
const (
	runClosing = 1 << 62
	runClosed  = 1 << 61
)

// interrupt closes the cancel channel of e's request if its unique id is
// unique; any thread may call it.
func (e *entry) interrupt(unique uint64) bool {
	if unique == 0 || !e.run.CompareAndSwap(unique, unique|runClosing) {
		return false
	}
	close(e.cancel)
	e.run.Store(unique | runClosed)
	return true
}

// ended marks the end of e's request, on the goroutine that ran it.
func (e *entry) ended() {
	e.expectAt.Store(0)
	for {
		v := e.run.Load()
		if v&runClosing != 0 {
			runtime.Gosched() // interrupt is closing the channel
			continue
		}
		if e.run.CompareAndSwap(v, 0) {
			if v&runClosed != 0 {
				e.cancelIsClosed = true
			}
			return
		}
	}
}

// iovec is struct iovec.
type iovec struct {
	base uintptr
	len  uint64
}

func (e *entry) inBytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&e.in[0])), len(e.in)*8)
}

// prepare copies the request header and input struct out of the ring
// buffers, and reports whether e needs a new cancel channel (Server.renew)
// because an interrupt closed the old one.
func (e *entry) prepare() bool {
	in := e.inBytes()
	copy(in[:inHeaderSize], e.hdr[hdrInOut:])
	h := (*fuse.InHeader)(unsafe.Pointer(&e.in[0]))
	e.commitID = *(*uint64)(unsafe.Pointer(&e.hdr[hdrCommitID]))
	e.unique = h.Unique
	e.nodeID = h.NodeId
	op := h.Opcode
	n := 0
	if int(op) < len(opInSize) {
		n = opInSize[op]
	}
	copy(in[inHeaderSize:inHeaderSize+n], e.hdr[hdrOpIn:hdrOpIn+n])
	clear(in[inHeaderSize+n:])
	e.fua = op == opWrite && (*fuse.WriteIn)(unsafe.Pointer(&e.in[0])).Flags&unix.O_DSYNC != 0
	renew := e.cancelIsClosed
	e.cancelIsClosed = false
	return renew
}

// size returns the data size of a READ or WRITE request, 0 for other
// requests.
func (e *entry) size() int {
	switch (*fuse.InHeader)(unsafe.Pointer(&e.in[0])).Opcode {
	case opRead:
		return int((*fuse.ReadIn)(unsafe.Pointer(&e.in[0])).Size)
	case opWrite:
		return int((*fuse.WriteIn)(unsafe.Pointer(&e.in[0])).Size)
	}
	return 0
}

// out returns a zeroed reply struct of size n at the start of the payload.
func (e *entry) out(n int) unsafe.Pointer {
	clear(e.payload[:n])
	return unsafe.Pointer(&e.payload[0])
}

// name returns the NUL-terminated name at the start of the input payload.
func name(p []byte) string {
	for i, c := range p {
		if c == 0 {
			return string(p[:i])
		}
	}
	return string(p)
}

// dispatch answers the request held by e through fs and writes the reply
// into e's buffers. Operations that dmfuse's tree does not serve are
// answered ENOSYS, as go-fuse does. The request can be interrupted from
// the moment dispatch starts; the caller calls ended once it returns.
func (e *entry) dispatch(fs fuse.RawFileSystem) {
	h := (*fuse.InHeader)(unsafe.Pointer(&e.in[0]))
	op := h.Opcode
	e.run.Store(h.Unique)
	if q := e.q; q != nil && q.s.nEarly.Load() != 0 {
		q.s.claimEarly(e, h.Unique) // interrupted before it started
	}
	var cancel <-chan struct{} = e.cancel
	psz := int(*(*uint32)(unsafe.Pointer(&e.hdr[hdrPayloadSz])))
	psz = min(psz, len(e.payload))
	input := e.payload[:psz]
	if ext := int(h.TotalExtlen) * 8; ext > 0 && ext <= len(input) {
		input = input[:len(input)-ext]
	}
	inPtr := unsafe.Pointer(&e.in[0])

	var st fuse.Status
	n := 0
	switch op {
	case opLookup:
		nm := name(input)
		out := (*fuse.EntryOut)(e.out(entryOutSize))
		st = fs.Lookup(cancel, h, nm, out)
		n = entryOutSize
	case opGetattr:
		st = fs.GetAttr(cancel, (*fuse.GetAttrIn)(inPtr), (*fuse.AttrOut)(e.out(attrOutSize)))
		n = attrOutSize
	case opSetattr:
		st = fs.SetAttr(cancel, (*fuse.SetAttrIn)(inPtr), (*fuse.AttrOut)(e.out(attrOutSize)))
		n = attrOutSize
	case opOpen:
		st = fs.Open(cancel, (*fuse.OpenIn)(inPtr), (*fuse.OpenOut)(e.out(openOutSize)))
		n = openOutSize
	case opOpendir:
		st = fs.OpenDir(cancel, (*fuse.OpenIn)(inPtr), (*fuse.OpenOut)(e.out(openOutSize)))
		n = openOutSize
	case opRead:
		in := (*fuse.ReadIn)(inPtr)
		buf := e.payload[:min(int(in.Size), len(e.payload))]
		var res fuse.ReadResult
		res, st = fs.Read(cancel, in, buf)
		if res != nil {
			if st.Ok() {
				var b []byte
				b, st = res.Bytes(buf)
				if st.Ok() {
					if len(b) > 0 && &b[0] != &buf[0] {
						copy(buf, b)
					}
					n = min(len(b), len(buf))
				}
			}
			res.Done()
		}
	case opWrite:
		in := (*fuse.WriteIn)(inPtr)
		data := input[:min(int(in.Size), len(input))]
		var w uint32
		w, st = fs.Write(cancel, in, data)
		// The data is consumed: the reply may overwrite it.
		(*fuse.WriteOut)(e.out(writeOutSize)).Size = w
		n = writeOutSize
	case opStatfs:
		st = fs.StatFs(cancel, h, (*fuse.StatfsOut)(e.out(statfsOutSize)))
		n = statfsOutSize
	case opRelease:
		fs.Release(cancel, (*fuse.ReleaseIn)(inPtr))
	case opReleasedir:
		fs.ReleaseDir((*fuse.ReleaseIn)(inPtr))
	case opFsync:
		st = fs.Fsync(cancel, (*fuse.FsyncIn)(inPtr))
	case opFsyncdir:
		st = fs.FsyncDir(cancel, (*fuse.FsyncIn)(inPtr))
	case opFlush:
		st = fs.Flush(cancel, (*fuse.FlushIn)(inPtr))
	case opAccess:
		st = fs.Access(cancel, (*fuse.AccessIn)(inPtr))
	case opFallocate:
		st = fs.Fallocate(cancel, (*fuse.FallocateIn)(inPtr))
	case opLseek:
		st = fs.Lseek(cancel, (*fuse.LseekIn)(inPtr), (*fuse.LseekOut)(e.out(lseekOutSize)))
		n = lseekOutSize
	case opReaddir, opReaddirplus:
		in := (*fuse.ReadIn)(inPtr)
		l := fuse.NewDirEntryList(e.payload[:min(int(in.Size), len(e.payload))], in.Offset)
		if op == opReaddir {
			st = fs.ReadDir(cancel, in, l)
		} else {
			st = fs.ReadDirPlus(cancel, in, l)
		}
		n = len(l.Bytes())
	default:
		st = fuse.ENOSYS
	}
	if !st.Ok() {
		n = 0
	}
	e.setReply(-int32(st), n)
}

// setReply writes the reply header of e's request: status (0 or a
// negative errno) and n bytes of reply in the payload buffer.
func (e *entry) setReply(status int32, n int) {
	o := (*fuse.OutHeader)(unsafe.Pointer(&e.hdr[hdrInOut]))
	o.Unique = (*fuse.InHeader)(unsafe.Pointer(&e.in[0])).Unique
	o.Status = status
	o.Length = uint32(outHeaderSize + n)
	*(*uint32)(unsafe.Pointer(&e.hdr[hdrPayloadSz])) = uint32(n)
}
