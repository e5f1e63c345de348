package targets

import (
	"bytes"
	"context"
	"fmt"

	"github.com/dmfuse/dmfuse/snapshot"
	"github.com/dmfuse/dmfuse/stack"
)

// The snapshot targets map the sectors of their device, not of their
// segment (snapshot_map and origin_map leave the bio's sector as it is), so
// the case builds, below each segment, an origin whose sectors [start,
// start+len) of the segment are the segment's device (zeros before them).
// The COW device is the segment's second device.

const snapCOW = 1 << 20 // holds every chunk of a segment, with the metadata

var snapshotEntry = Entry{Type: snapshot.Type, Case: Case{
	Params: func(s Segment) string { return s.Below + " " + s.Aux + " P 8" },
	Aux:    snapCOW,
	Uses:   []*stack.TargetType{stack.Linear, stack.Zero},
	Below:  snapOrigin,
	Stored: snapView,
	NotApplicable: map[string]string{
		"FlushReachesDevices": "a snapshot sends its flush to the COW device only (snapshot_ctr: num_flush_bios 1, mapped to the COW), never to the origin",
	},
}}

var snapshotOriginEntry = Entry{Type: snapshot.OriginType, Case: Case{
	Params: func(s Segment) string { return s.Below },
	Uses:   []*stack.TargetType{stack.Linear, stack.Zero},
	Below:  snapOrigin,
	Stored: func(m *stack.Manager, s Segment, n int64) ([]byte, error) {
		return readDev(m, fmt.Sprintf("orig%d", s.Index), int64(s.Index)*s.Sectors*stack.SectorSize, n)
	},
}}

var snapshotMergeEntry = Entry{Type: snapshot.MergeType, Case: Case{
	Params: func(s Segment) string { return s.Below + " " + s.Aux + " P 8" },
	Aux:    snapCOW,
	Uses:   []*stack.TargetType{stack.Linear, stack.Zero},
	Below:  snapOrigin,
	Stored: snapView,
	NotApplicable: map[string]string{
		"TableRoundTrip":       merging,
		"EscapedPathRoundTrip": merging,
	},
}}

// merging is why a live snapshot-merge table cannot be loaded again over
// itself: the new table would take over from a snapshot of the origin
// while one (the live table itself) merges (__validate_exception_handover:
// "A snapshot is already merging.").
const merging = "a snapshot-merge table loaded over a live snapshot-merge of the same COW device is refused with \"A snapshot is already merging.\" (__validate_exception_handover)"

// snapOrigin builds segment s's origin, orig<index>.
func snapOrigin(m *stack.Manager, s Segment) (string, error) {
	start := int64(s.Index) * s.Sectors
	table := fmt.Sprintf("0 %d linear %s 0", s.Sectors, s.Dev)
	if start > 0 {
		table = fmt.Sprintf("0 %d zero\n%d %d linear %s 0", start, start, s.Sectors, s.Dev)
	}
	d, err := m.Create(stack.CreateOptions{Name: fmt.Sprintf("orig%d", s.Index), Minor: -1, Table: table})
	if err != nil {
		return "", err
	}
	return d.DevNo(), nil
}

// readDev reads n bytes at off of the manager's device name.
func readDev(m *stack.Manager, name string, off, n int64) ([]byte, error) {
	d := m.Lookup(name)
	if d == nil {
		return nil, fmt.Errorf("no device %s", name)
	}
	p := make([]byte, n)
	if _, err := d.ReadAt(context.Background(), p, off); err != nil {
		return nil, err
	}
	return p, nil
}

// snapView is what the snapshot of segment s holds: its origin, with the
// chunks the COW device's store has taken from the COW, read from the
// store as the kernel would read it.
func snapView(m *stack.Manager, s Segment, n int64) ([]byte, error) {
	start := int64(s.Index) * s.Sectors * stack.SectorSize
	view, err := readDev(m, fmt.Sprintf("orig%d", s.Index), start, n)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("cowview%d", s.Index)
	if _, err := m.Create(stack.CreateOptions{Name: name, Minor: -1, Table: fmt.Sprintf("0 %d linear %s 0", snapCOW/stack.SectorSize, s.Aux)}); err != nil {
		return nil, err
	}
	defer m.Remove(name, stack.Flags{})
	cow, err := readDev(m, name, 0, snapCOW)
	if err != nil {
		return nil, err
	}
	st, err := snapshot.ReadStore(bytes.NewReader(cow), snapCOW)
	if err != nil {
		return nil, err
	}
	cb := int64(st.Chunk) * stack.SectorSize
	for _, e := range st.Exceptions {
		from := int64(e.Old) * cb
		if from+cb <= start || from >= start+n {
			continue
		}
		lo, hi := max(from, start), min(from+cb, start+n)
		copy(view[lo-start:hi-start], cow[int64(e.New)*cb+lo-from:])
	}
	return view, nil
}
