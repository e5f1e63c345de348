// Package targets is the one list of dmfuse's target types: what the dmfuse
// command registers and `dmsetup targets` lists, what the conformance suite
// (targets/conformance) checks, in process and through a mounted file on both
// transports, and what the hygiene test builds with.
//
// Each type has one short file here holding its Entry: the type and its
// conformance Case, the table line that makes it usable over plain devices
// and what the suite should expect of it. Adding a target type is one
// package (or one file in package stack for a small one), one file here,
// and one line in All.
package targets

import (
	"github.com/dmfuse/dmfuse/stack"
)

// All returns every entry, in the order `dmsetup targets` lists them: the
// small kernel targets of package stack, then the targets of their own
// packages.
func All() []Entry {
	return []Entry{
		linear,
		striped,
		zero,
		errorEntry,
		flakey,
		dust,
		delay,
		multipath,
		logWrites,
		powercut,
		thinPool,
		thin,
		snapshotEntry,
		snapshotOriginEntry,
		snapshotMergeEntry,
		faultEntry,
	}
}

// Types returns the target type of every entry of All, in its order.
func Types() []*stack.TargetType {
	all := All()
	out := make([]*stack.TargetType, len(all))
	for i, e := range all {
		out[i] = e.Type
	}
	return out
}

// Registry returns a registry of every type of All.
func Registry() *stack.Registry {
	reg, err := stack.NewRegistry(Types()...)
	if err != nil {
		panic("targets: " + err.Error()) // two entries of one name: a programming error
	}
	return reg
}

// Entry is one target type and its conformance case.
type Entry struct {
	Type *stack.TargetType
	Case Case
}

// Data is what a target type, set up by its Case, does with the data of I/O.
type Data int

const (
	// Stores: a write lands on the segment's device and reads back
	// (linear, striped, flakey up, dust, delay, multipath, thin).
	Stores Data = iota
	// Zeroes: a read returns zeros, a write succeeds and is dropped
	// (drivers/md/dm-zero.c: zero_map).
	Zeroes
	// Fails: every read and write fails with EIO (drivers/md/dm-target.c:
	// io_err_map kills every bio).
	Fails
)

func (d Data) String() string {
	switch d {
	case Stores:
		return "stores"
	case Zeroes:
		return "zeroes"
	case Fails:
		return "fails"
	}
	return "Data(?)"
}

// Segment is one segment of a table the suite builds: its place and the
// devices the suite made for it.
type Segment struct {
	// Index is the segment's number in its table, from 0.
	Index int
	// Sectors is the segment's length, which is also the length of its
	// backing device.
	Sectors int64
	// Dev is the segment's backing device as a device argument, escaped as
	// table text needs it: a memory device's name, or the path of a backing
	// file whose name holds a space and a backslash.
	Dev string
	// Aux names the segment's second backing device the same way, when the
	// case asks for one (Case.Aux).
	Aux string
	// Below is the device argument that Case.Below returned, when the case
	// builds devices below its lines.
	Below string
}

// Case makes one target type usable in the conformance suite.
type Case struct {
	// Params returns the parameters of segment s's line. Over a memory
	// device or a backing file (Stores), byte x of the segment lands at
	// byte x of s.Dev, or, for a case with Below, at byte x of what Stored
	// returns. A type that takes no device ignores s.
	Params func(s Segment) string
	// Data is what the type does with data.
	Data Data
	// InfoNamesDevices is set for types whose INFO status prints the names
	// of their devices.
	InfoNamesDevices bool
	// NotApplicable names the checks that do not apply to the type, each
	// with the reason the kernel's behaviour gives.
	NotApplicable map[string]string
	// Aux, when not zero, gives every segment a second backing device of
	// Aux bytes (Segment.Aux): for types whose line names two devices
	// (log-writes: data and log), or whose devices below need room of their
	// own (a pool's metadata).
	Aux int64
	// Caches is set for types with a volatile write cache (powercut): a
	// completed write need reach the segment's device only at the next
	// flush, so the checks flush the device before they look below it.
	Caches bool

	// Uses lists the target types that Below builds with, which the
	// suite's manager registers beside the case's own.
	Uses []*stack.TargetType
	// Below, when set, builds in m what segment s's line needs below it
	// before the suite loads the table (for thin: a thin-pool device over
	// s.Aux and s.Dev, and a thin device created by message), and returns
	// the device argument the line names (Segment.Below), as the table
	// prints it: a mapped device by its number (Device.DevNo).
	Below func(m *stack.Manager, s Segment) (string, error)
	// Stored, with Below, returns the n bytes that segment s stores at
	// segment offsets, read through devices of m: the checks compare it
	// with what they wrote. Without Below the suite reads s.Dev itself.
	Stored func(m *stack.Manager, s Segment, n int64) ([]byte, error)
}

// AuxSuffix is what the suite appends to a segment's device to name its
// second device (Case.Aux).
const AuxSuffix = ".aux"
