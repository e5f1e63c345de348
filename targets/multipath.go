package targets

import (
	mp "github.com/dmfuse/dmfuse/multipath"
)

// multipath with one priority group of one path, round-robin.
var multipath = Entry{Type: mp.Type, Case: Case{
	Params:           func(s Segment) string { return "0 0 1 1 round-robin 0 1 1 " + s.Dev + " 1" },
	InfoNamesDevices: true,
	NotApplicable: map[string]string{
		"SegmentOffsets": "multipath is a singleton type (DM_TARGET_SINGLETON): alone in its table, so its segment always starts at sector 0",
	},
}}
