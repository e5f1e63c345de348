package targets

import (
	th "github.com/dmfuse/dmfuse/thin"
)

// thinPool keeps its metadata on the segment's second device and maps its
// own I/O onto the data device (the segment's device) 1:1.
var thinPool = Entry{Type: th.PoolType, Case: Case{
	Params: func(s Segment) string { return s.Aux + " " + s.Dev + " 128 0" },
	Aux:    4 << 20,
	NotApplicable: map[string]string{
		"SegmentOffsets": "thin-pool is a singleton type (DM_TARGET_SINGLETON): alone in its table, so its segment always starts at sector 0",
	},
}}
