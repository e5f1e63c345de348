// Package ioop is the one enum of I/O kinds in dmfuse: what a request asks
// of a device, a target or a path, what the accounting counts, and what a
// test's fault device matches. It imports nothing.
package ioop

import "strings"

// Op is the kind of one I/O.
type Op uint8

const (
	// Read is a read (REQ_OP_READ).
	Read Op = iota
	// Write is a write (REQ_OP_WRITE).
	Write
	// Flush is an empty flush (REQ_PREFLUSH with no data; fsync of a device
	// file).
	Flush
	// Discard is a discard (REQ_OP_DISCARD; a punched hole).
	Discard
	// Zeroes is a write of zeroes (REQ_OP_WRITE_ZEROES; fallocate's
	// ZERO_RANGE).
	Zeroes
	// NumOps is the number of kinds, for tables indexed by Op.
	NumOps
)

var names = [NumOps]string{Read: "read", Write: "write", Flush: "flush", Discard: "discard", Zeroes: "zeroes"}

// String returns "read", "write", "flush", "discard" or "zeroes" ("I/O" for
// a value out of range).
func (op Op) String() string {
	if op < NumOps {
		return names[op]
	}
	return "I/O"
}

// IsWrite reports whether op changes the device or orders its writes
// (everything but Read), as the kernel's op_is_write does for the data ops
// and the in-flight counts do for all of them.
func (op Op) IsWrite() bool { return op != Read }

// Set is a set of kinds, as a fault rule matches them.
type Set uint8

// All holds every kind.
const All Set = 1<<NumOps - 1

// SetOf returns the set of ops.
func SetOf(ops ...Op) Set {
	var s Set
	for _, op := range ops {
		s |= 1 << op
	}
	return s
}

// Has reports whether op is in s.
func (s Set) Has(op Op) bool { return op < NumOps && s&(1<<op) != 0 }

// String returns the kinds of s joined by "|", in the order of Op
// ("read|write"); "none" for the empty set.
func (s Set) String() string {
	var b strings.Builder
	for op := range NumOps {
		if s.Has(op) {
			if b.Len() > 0 {
				b.WriteByte('|')
			}
			b.WriteString(op.String())
		}
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
