package targets

import (
	pc "github.com/dmfuse/dmfuse/powercut"
)

// powercut's default cache bound (32 MiB) holds everything the checks
// write: writes reach the device at flushes and at the suspend of a reload.
var powercut = Entry{Type: pc.Type, Case: Case{
	Params: func(s Segment) string { return s.Dev + " 0" },
	Caches: true,
}}
