package uring

import (
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Direct is an optional capability of the file system passed to Start: it
// maps a READ or WRITE of a node onto one range of a backing file, so that
// the queue issues the read or write on that file through its own ring,
// submitted with the replies, instead of handing the request to the file
// system, which would make a system call for it. The reply follows the
// completion.
type Direct interface {
	// MapDirect reports whether the READ (write false) or WRITE of n
	// bytes at off of node nodeID goes to a file, and if so fills io
	// with where. It must not block.
	MapDirect(nodeID uint64, write bool, off int64, n int, io *DirectIO) bool
	// EndDirect ends io, which MapDirect started: res is the result of
	// the read or write on the file (bytes, or a negative errno) and p
	// its data. It returns the request's result: bytes, or a negative
	// errno.
	EndDirect(io *DirectIO, p []byte, res int32) int32
}

// DirectIO is one READ or WRITE that Direct.MapDirect sent to a file.
type DirectIO struct {
	FD  int32 // the file's descriptor
	Off int64 // the offset in the file
	Tag any   // what the file system keeps of it until EndDirect
}

// udDirect marks the user_data of an entry's read or write on a file; the
// entry's index is in the low bits.
const udDirect = 1 << 61

// direct issues e's READ or WRITE on a file if the file system maps it
// there, and reports whether it did; the completion commits the reply
// (endDirect).
func (q *queue) direct(e *entry) bool {
	h := (*fuse.InHeader)(unsafe.Pointer(&e.in[0]))
	var write bool
	var off int64
	var n int
	switch h.Opcode {
	case opRead:
		in := (*fuse.ReadIn)(unsafe.Pointer(&e.in[0]))
		off, n = int64(in.Offset), int(in.Size)
	case opWrite:
		if e.fua {
			return false // a durable write waits for its disk: the file system's path
		}
		in := (*fuse.WriteIn)(unsafe.Pointer(&e.in[0]))
		psz := int(*(*uint32)(unsafe.Pointer(&e.hdr[hdrPayloadSz])))
		if int(in.Size) > psz || h.TotalExtlen != 0 {
			return false
		}
		write, off, n = true, int64(in.Offset), int(in.Size)
	default:
		return false
	}
	if n <= 0 || n > len(e.payload) || !q.s.direct.MapDirect(h.NodeId, write, off, n, &e.dio) {
		return false
	}
	e.dioLen, e.dioWrite = n, write
	if !q.r.rw(e, write, e.dio.FD, e.payload[:n], e.dio.Off) {
		// The ring refused it: EAGAIN makes EndDirect do the I/O
		// itself, as the file system would have.
		q.endDirect(e, -int32(unix.EAGAIN))
		return true
	}
	q.directs++
	q.directTotal.Add(1)
	return true
}

// endDirect commits the reply of e's READ or WRITE, which went to a file
// and completed with res.
func (q *queue) endDirect(e *entry, res int32) {
	res = q.s.direct.EndDirect(&e.dio, e.payload[:e.dioLen], res)
	e.dio = DirectIO{}
	switch {
	case res < 0:
		e.setReply(res, 0)
	case e.dioWrite:
		(*fuse.WriteOut)(e.out(writeOutSize)).Size = uint32(res)
		e.setReply(0, writeOutSize)
	default:
		e.setReply(0, int(res))
	}
	q.commit(e)
}

// drainDirect waits for the reads and writes on files that the queue has
// in flight, and commits their replies, so that none is left inside a
// device when the queue stops.
func (q *queue) drainDirect() {
	for q.directs > 0 {
		before := q.directs
		q.reap()
		if q.directs == before {
			if err := q.r.wait(int64(time.Millisecond)); err != nil {
				return
			}
		}
	}
}
