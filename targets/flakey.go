package targets

import "github.com/dmfuse/dmfuse/stack"

// flakey, up 1 s and down 0 s: never down.
var flakey = Entry{Type: stack.Flakey, Case: Case{
	Params: func(s Segment) string { return s.Dev + " 0 1 0" },
}}
