package targets

import "github.com/dmfuse/dmfuse/stack"

// zero reads zeros and drops writes.
var zero = Entry{Type: stack.Zero, Case: Case{
	Params: func(Segment) string { return "" },
	Data:   Zeroes,
	NotApplicable: map[string]string{
		"SegmentOffsets":       "zero stores nothing (zero_map), so no offset can be seen",
		"EscapedPathRoundTrip": "zero takes no device (zero_ctr refuses arguments)",
	},
}}
