package targets

import (
	"github.com/dmfuse/dmfuse/fault"
)

// fault with no option and no rule passes everything to its device, as
// linear does; the suite checks that the engine in between changes nothing.
var faultEntry = Entry{Type: fault.Type, Case: Case{
	Params: func(s Segment) string { return s.Dev + " 0" },
}}
