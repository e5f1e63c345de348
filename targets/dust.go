package targets

import "github.com/dmfuse/dmfuse/stack"

// dust with no bad blocks passes everything until blocks are added and it
// is enabled.
var dust = Entry{Type: stack.Dust, Case: Case{
	Params:           func(s Segment) string { return s.Dev + " 0 512" },
	InfoNamesDevices: true,
}}
