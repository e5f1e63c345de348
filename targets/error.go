package targets

import "github.com/dmfuse/dmfuse/stack"

// errorEntry fails every I/O.
var errorEntry = Entry{Type: stack.Error, Case: Case{
	Params: func(Segment) string { return "" },
	Data:   Fails,
	NotApplicable: map[string]string{
		"SegmentOffsets":       "error fails every I/O (io_err_map), so no offset can be seen",
		"EscapedPathRoundTrip": "error takes no device (io_err_ctr ignores its arguments, and prints none)",
	},
}}
