package targets

import "github.com/dmfuse/dmfuse/stack"

// linear maps its segment onto one device from an offset.
var linear = Entry{Type: stack.Linear, Case: Case{
	Params: func(s Segment) string { return s.Dev + " 0" },
}}
