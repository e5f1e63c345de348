package uring

import (
	"errors"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// io_uring ABI constants (include/uapi/linux/io_uring.h).
const (
	setupCQSize = 1 << 3
	setupSQE128 = 1 << 10

	featSingleMmap = 1 << 0

	enterGetEvents = 1 << 0

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	iouOpRead     = 22
	iouOpURingCmd = 46

	sqeSize = 128 // IORING_SETUP_SQE128
	cqeSize = 16
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// cqe is a completion queue entry.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// ring is one io_uring instance with 128-byte submission entries. It is not
// safe for concurrent use: only the thread that leads its queue touches it.
type ring struct {
	fd int

	sqMem, cqMem, sqeMem []byte

	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	sqes           []byte
	sqLocalTail    uint32 // entries written but not yet published
	toSubmit       uint32 // published but not yet handed to the kernel

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []cqe
}

// newRing creates a ring of n submission entries and 2n completion entries.
func newRing(n uint32) (*ring, error) {
	p := params{flags: setupSQE128 | setupCQSize, cqEntries: 2 * n}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(n), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, errno
	}
	r := &ring{fd: int(fd)}
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mmap(p *params) error {
	if p.features&featSingleMmap == 0 {
		return errors.New("io_uring without IORING_FEAT_SINGLE_MMAP")
	}
	sqLen := int(p.sqOff.array + p.sqEntries*4)
	cqLen := int(p.cqOff.cqes + p.cqEntries*cqeSize)
	ringLen := max(sqLen, cqLen)
	var err error
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, ringLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return err
	}
	r.cqMem = r.sqMem
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return err
	}
	base := unsafe.Pointer(&r.sqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(base, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(base, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(base, p.sqOff.ringMask))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Add(base, p.sqOff.array)), p.sqEntries)
	r.sqes = r.sqeMem
	r.cqHead = (*uint32)(unsafe.Add(base, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(base, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(base, p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(base, p.cqOff.cqes)), p.cqEntries)
	r.sqLocalTail = atomic.LoadUint32(r.sqTail)
	return nil
}

// close releases the ring. The kernel cancels whatever is still pending.
func (r *ring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
		r.sqeMem = nil
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
		r.sqMem = nil
	}
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// getSQE returns a zeroed submission entry, submitting first if the
// submission queue is full. It returns nil only if the kernel refuses to
// take entries.
func (r *ring) getSQE() []byte {
	for {
		head := atomic.LoadUint32(r.sqHead)
		if r.sqLocalTail-head <= r.sqMask {
			break
		}
		if _, err := r.enter(0, 0); err != nil {
			return nil
		}
	}
	idx := r.sqLocalTail & r.sqMask
	r.sqArray[idx] = idx
	r.sqLocalTail++
	r.toSubmit++
	s := r.sqes[int(idx)*sqeSize : int(idx+1)*sqeSize]
	clear(s)
	atomic.StoreUint32(r.sqTail, r.sqLocalTail)
	return s
}

// enter submits what is queued and waits for at least minComplete
// completions. EINTR (Go's preemption signals) is retried.
func (r *ring) enter(minComplete uint32, flags uint32) (int, error) {
	if minComplete > 0 {
		flags |= enterGetEvents
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		if uint32(n) >= r.toSubmit {
			r.toSubmit = 0
		} else {
			r.toSubmit -= uint32(n)
		}
		return int(n), nil
	}
}

// ready returns the number of completions waiting.
func (r *ring) ready() uint32 {
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// peek returns the oldest completion, if any, without consuming it.
func (r *ring) peek() (cqe, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return cqe{}, false
	}
	return r.cqes[head&r.cqMask], true
}

// advance consumes the oldest completion.
func (r *ring) advance() {
	atomic.AddUint32(r.cqHead, 1)
}

// Little-endian field setters for a submission entry.
func put8(b []byte, off int, v uint8)   { b[off] = v }
func put16(b []byte, off int, v uint16) { *(*uint16)(unsafe.Pointer(&b[off])) = v }
func put32(b []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
func put64(b []byte, off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }

// SQE field offsets.
const (
	sqeOpcode   = 0
	sqeFD       = 4
	sqeOff      = 8 // cmd_op for IORING_OP_URING_CMD
	sqeAddr     = 16
	sqeLen      = 24
	sqeUserData = 32
	sqeCmd      = 48
)
