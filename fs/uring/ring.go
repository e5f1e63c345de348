package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// io_uring ABI constants (include/uapi/linux/io_uring.h).
const (
	setupCQSize       = 1 << 3
	setupCoopTaskrun  = 1 << 8
	setupTaskrunFlag  = 1 << 9
	setupSQE128       = 1 << 10
	setupSingleIssuer = 1 << 12
	setupDeferTaskrun = 1 << 13

	featSingleMmap = 1 << 0
	featExtArg     = 1 << 8

	enterGetEvents = 1 << 0
	enterExtArg    = 1 << 3

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	iouOpRead     = 22
	iouOpWrite    = 23
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

// geteventsArg is struct io_uring_getevents_arg, the argument of
// io_uring_enter with IORING_ENTER_EXT_ARG.
type geteventsArg struct {
	sigmask     uint64
	sigmaskSize uint32
	minWaitUsec uint32
	ts          uint64 // address of a struct __kernel_timespec
}

// cqe is a completion queue entry.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// ring is what a queue needs of its io_uring instance. Only the thread that
// leads the queue calls its methods, except wake, which any thread may call.
// sysRing is the kernel's; the tests use a fake.
type ring interface {
	// register queues the REGISTER command of every entry, submits them
	// and reports whether the kernel took them.
	register(ents []entry) error
	// commit queues e's reply and re-arms e (COMMIT_AND_FETCH). It
	// reports false if the ring has no room even after a submit.
	commit(e *entry) bool
	// rw queues a read (write false) or write of buf at off of the file
	// fd for e (Direct); its completion carries udDirect|e.idx. It
	// reports false if the ring has no room even after a submit.
	rw(e *entry, write bool, fd int32, buf []byte, off int64) bool
	// queued returns the number of commands queued but not submitted.
	queued() int
	// submit hands the queued commands to the kernel without waiting.
	submit() error
	// wait submits the queued commands and blocks until a completion
	// arrives or wake is called, or, if timeout > 0, until timeout
	// nanoseconds have passed (at the earliest; on a ring without timed
	// waits, only a completion or wake ends it).
	wait(timeout int64) error
	// next returns the oldest entry completion and consumes it; ok is
	// false when none is waiting.
	next() (idx uint64, res int32, ok bool)
	// ready reports whether a completion waits (for polling).
	ready() bool
	// wake makes a wait in progress, or the next one, return.
	wake()
	// close releases the ring; the kernel cancels what is still pending.
	close()
}

// sysRing is one io_uring instance with 128-byte submission entries,
// commanding the FUSE connection's /dev/fuse descriptor dev, with an eventfd
// whose pending read lets other threads wake a wait.
type sysRing struct {
	fd  int
	dev int // the /dev/fuse descriptor (set by Server.Start)
	qid uint16

	efd      int
	efdBuf   [8]byte
	efdArmed bool
	one      [8]byte

	extArg bool // the kernel takes IORING_ENTER_EXT_ARG (timed waits)
	arg    geteventsArg
	ts     unix.Timespec

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

// newSysRing creates the ring of queue qid with n submission entries and 2n
// completion entries, with setup flags flags (IORING_SETUP_*) on top of
// SQE128 and CQSIZE.
func newSysRing(qid int, n uint32, flags uint32) (*sysRing, error) {
	p := params{flags: setupSQE128 | setupCQSize | flags, cqEntries: 2 * n}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(n), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &sysRing{fd: int(fd), dev: -1, qid: uint16(qid), efd: -1}
	r.one[0] = 1
	r.extArg = p.features&featExtArg != 0
	r.arg.ts = uint64(uintptr(unsafe.Pointer(&r.ts)))
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	var err error
	r.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *sysRing) mmap(p *params) error {
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

func (r *sysRing) close() {
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
	if r.efd >= 0 {
		unix.Close(r.efd)
		r.efd = -1
	}
}

func (r *sysRing) register(ents []entry) error {
	for i := range ents {
		e := &ents[i]
		sqe := r.getSQE()
		if sqe == nil {
			return errors.New("submission queue refused")
		}
		put8(sqe, sqeOpcode, iouOpURingCmd)
		put32(sqe, sqeFD, uint32(r.dev))
		put32(sqe, sqeOff, cmdRegister)
		put64(sqe, sqeAddr, uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
		put32(sqe, sqeLen, 2)
		put64(sqe, sqeUserData, uint64(i))
		put16(sqe, sqeCmd+16, r.qid)
	}
	if _, err := r.enter(0, 0); err != nil {
		return fmt.Errorf("io_uring_enter: %w", err)
	}
	if c, ok := r.peek(); ok && c.res < 0 {
		return fmt.Errorf("FUSE_IO_URING_CMD_REGISTER: %w", unix.Errno(-c.res))
	}
	return nil
}

func (r *sysRing) commit(e *entry) bool {
	sqe := r.getSQE()
	if sqe == nil {
		return false
	}
	put8(sqe, sqeOpcode, iouOpURingCmd)
	put32(sqe, sqeFD, uint32(r.dev))
	put32(sqe, sqeOff, cmdCommitAndFetch)
	put64(sqe, sqeUserData, uint64(e.idx))
	put64(sqe, sqeCmd+8, e.commitID)
	put16(sqe, sqeCmd+16, r.qid)
	return true
}

func (r *sysRing) rw(e *entry, write bool, fd int32, buf []byte, off int64) bool {
	sqe := r.getSQE()
	if sqe == nil {
		return false
	}
	op := uint8(iouOpRead)
	if write {
		op = iouOpWrite
	}
	put8(sqe, sqeOpcode, op)
	put32(sqe, sqeFD, uint32(fd))
	put64(sqe, sqeOff, uint64(off))
	put64(sqe, sqeAddr, uint64(uintptr(unsafe.Pointer(&buf[0]))))
	put32(sqe, sqeLen, uint32(len(buf)))
	put64(sqe, sqeUserData, udDirect|uint64(e.idx))
	return true
}

func (r *sysRing) queued() int { return int(r.toSubmit) }

func (r *sysRing) submit() error {
	_, err := r.enter(0, 0)
	return err
}

// wait keeps a read of the eventfd pending, so that wake's write completes
// it, and waits for one completion, with a timeout (IORING_ENTER_EXT_ARG)
// if timeout > 0. The kernel's wait timer has no slack: it ends on time.
func (r *sysRing) wait(timeout int64) error {
	if !r.efdArmed {
		if sqe := r.getSQE(); sqe != nil {
			put8(sqe, sqeOpcode, iouOpRead)
			put32(sqe, sqeFD, uint32(r.efd))
			put64(sqe, sqeAddr, uint64(uintptr(unsafe.Pointer(&r.efdBuf[0]))))
			put32(sqe, sqeLen, 8)
			put64(sqe, sqeUserData, udWake)
			r.efdArmed = true
		}
	}
	if timeout > 0 && r.extArg {
		r.ts = unix.NsecToTimespec(timeout)
		_, err := r.enterArg(1, enterExtArg, unsafe.Pointer(&r.arg), unsafe.Sizeof(r.arg))
		return err
	}
	_, err := r.enter(1, 0)
	return err
}

func (r *sysRing) wake() { unix.Write(r.efd, r.one[:]) }

func (r *sysRing) next() (uint64, int32, bool) {
	for {
		c, ok := r.peek()
		if !ok {
			return 0, 0, false
		}
		r.advance()
		if c.userData == udWake {
			r.efdArmed = false
			continue
		}
		return c.userData, c.res, true
	}
}

// getSQE returns a zeroed submission entry, submitting first if the
// submission queue is full. It returns nil only if the kernel refuses to
// take entries.
func (r *sysRing) getSQE() []byte {
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
func (r *sysRing) enter(minComplete uint32, flags uint32) (int, error) {
	return r.enterArg(minComplete, flags, nil, 0)
}

// enterArg is enter with io_uring_enter's argument and its size. A wait
// that timed out (ETIME) is no error.
func (r *sysRing) enterArg(minComplete uint32, flags uint32, arg unsafe.Pointer, argSize uintptr) (int, error) {
	if minComplete > 0 {
		flags |= enterGetEvents
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.toSubmit), uintptr(minComplete), uintptr(flags), uintptr(arg), argSize)
		if errno == unix.EINTR {
			continue
		}
		if errno == unix.ETIME {
			return 0, nil // nothing was submitted, or n would be the count
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

// ready reports whether completions wait.
func (r *sysRing) ready() bool {
	return atomic.LoadUint32(r.cqTail) != atomic.LoadUint32(r.cqHead)
}

// peek returns the oldest completion, if any, without consuming it.
func (r *sysRing) peek() (cqe, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return cqe{}, false
	}
	return r.cqes[head&r.cqMask], true
}

// advance consumes the oldest completion.
func (r *sysRing) advance() {
	atomic.AddUint32(r.cqHead, 1)
}

// Little-endian field setters for a submission entry.
func put8(b []byte, off int, v uint8)   { b[off] = v }
func put16(b []byte, off int, v uint16) { *(*uint16)(unsafe.Pointer(&b[off])) = v }
func put32(b []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
func put64(b []byte, off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }

// FUSE io_uring commands (enum fuse_uring_cmd).
const (
	cmdRegister       = 1
	cmdCommitAndFetch = 2
)

// udWake is the user_data of the eventfd read; entries use their index.
const udWake = 1 << 62

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
