package targets

import (
	"github.com/dmfuse/dmfuse/logwrites"
)

// logWrites logs to the segment's second device; the log itself is not
// looked at.
var logWrites = Entry{Type: logwrites.Type, Case: Case{
	Params: func(s Segment) string { return s.Dev + " " + s.Aux },
	Aux:    4 << 20,
}}
