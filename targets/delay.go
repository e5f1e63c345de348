package targets

import (
	delaytarget "github.com/dmfuse/dmfuse/delay"
)

// delay of 0 ms passes I/O straight through.
var delay = Entry{Type: delaytarget.Type, Case: Case{
	Params: func(s Segment) string { return s.Dev + " 0 0" },
}}
