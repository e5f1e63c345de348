package targets

import "github.com/dmfuse/dmfuse/stack"

// striped, with one stripe of 8 sectors: the identity mapping, still split
// at every chunk (MaxIO).
var striped = Entry{Type: stack.Striped, Case: Case{
	Params:           func(s Segment) string { return "1 8 " + s.Dev + " 0" },
	InfoNamesDevices: true,
}}
