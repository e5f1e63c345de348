package uring

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE opcodes that still arrive on /dev/fuse once the rings serve.
const (
	opForget      = 2
	opInterrupt   = 36
	opNotifyReply = 41
	opBatchForget = 42
)

// ServeDev serves what the kernel still sends through /dev/fuse once the
// rings serve the connection (after Start succeeded): FORGET and
// BATCH_FORGET, passed on to the RawFileSystem, and INTERRUPT, which closes
// the cancel channel of the ring request it names (Interrupt). It replaces
// go-fuse's /dev/fuse loop on such a connection, because that loop knows
// only its own requests: it answers an interrupt for a ring request with
// EAGAIN, and the kernel, which looks for the request on /dev/fuse, drops
// it. An interrupt that comes before a queue has started its request is
// kept until the request starts (for up to a second); the kernel offers no
// way to have it sent again. Anything else (the kernel sends nothing else
// there while the rings serve) is answered EIO.
//
// ServeDev reads fd, the connection's /dev/fuse descriptor, which it does
// not close, until the connection ends: then, as go-fuse's loop does, it
// interrupts every request still running (nobody waits for their answers)
// and returns nil (on ENODEV after an unmount, ECONNABORTED after an
// abort); on another error it returns the error.
func (s *Server) ServeDev(fd int) error {
	// The kernel refuses reads smaller than the largest request
	// (fs/fuse/dev.c: fuse_dev_do_read), though only headers arrive here:
	// the pages beyond the first are never touched.
	n := s.cfg.PayloadSize + 4096
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("mapping a %d-byte /dev/fuse buffer: %w", n, err)
	}
	defer unix.Munmap(buf)
	other := false
	for {
		k, err := unix.Read(fd, buf)
		switch {
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOENT):
			// ENOENT: the request went away while the kernel copied it.
			continue
		case errors.Is(err, unix.ENODEV), errors.Is(err, unix.ECONNABORTED), err == nil && k == 0:
			s.interruptAll()
			return nil
		case err != nil:
			return fmt.Errorf("reading /dev/fuse: %w", err)
		}
		if k < inHeaderSize {
			continue
		}
		if !s.devRequest(fd, buf[:k]) && !other {
			other = true
			s.cfg.Logf("io_uring: /dev/fuse request with opcode %d answered EIO", (*fuse.InHeader)(unsafe.Pointer(&buf[0])).Opcode)
		}
	}
}

// interruptAll interrupts every ring request still running.
func (s *Server) interruptAll() {
	for _, q := range s.queues {
		for i := range q.ent {
			e := &q.ent[i]
			if u := e.run.Load(); u != 0 && u&(runClosing|runClosed) == 0 && e.interrupt(u) {
				s.interrupts.Add(1)
			}
		}
	}
}

// devRequest handles one request read from /dev/fuse; it reports false for
// one it does not serve, which it answers EIO.
func (s *Server) devRequest(fd int, b []byte) bool {
	h := (*fuse.InHeader)(unsafe.Pointer(&b[0]))
	arg := b[inHeaderSize:]
	switch h.Opcode {
	case opForget:
		if len(arg) >= 8 {
			s.fs.Forget(h.NodeId, *(*uint64)(unsafe.Pointer(&arg[0])))
		}
	case opBatchForget:
		if len(arg) < 8 {
			return true
		}
		count := int(*(*uint32)(unsafe.Pointer(&arg[0])))
		one := arg[8:]
		for i := 0; i < count && 16*i+16 <= len(one); i++ {
			p := unsafe.Pointer(&one[16*i])
			s.fs.Forget(*(*uint64)(p), *(*uint64)(unsafe.Add(p, 8)))
		}
	case opInterrupt:
		if len(arg) >= 8 {
			s.interruptSoon(*(*uint64)(unsafe.Pointer(&arg[0])))
		}
		// No reply: EAGAIN would make the kernel look for the request
		// on /dev/fuse, where ring requests are not.
	case opNotifyReply:
		// A reply to a retrieve notification, which dmfuse never sends.
	default:
		o := fuse.OutHeader{Length: uint32(outHeaderSize), Status: -int32(unix.EIO), Unique: h.Unique}
		unix.Write(fd, unsafe.Slice((*byte)(unsafe.Pointer(&o)), outHeaderSize))
		return false
	}
	return true
}
