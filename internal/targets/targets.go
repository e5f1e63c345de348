// Package targets is the list of every target type dmfuse has: what the
// dmfuse command registers, and what the conformance suite
// (stack/stacktest) walks, so that a type cannot be served without being
// checked. Adding a target type is one package (or one file in stack) and
// one line here, plus its case in stacktest.Cases.
package targets

import (
	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/logwrites"
	"github.com/dmfuse/dmfuse/multipath"
	"github.com/dmfuse/dmfuse/powercut"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/thin"
)

// All returns every target type, in the order `dmsetup targets` lists them
// by name: the small kernel targets of package stack, then the targets of
// their own packages.
func All() []*stack.TargetType {
	return []*stack.TargetType{
		stack.Linear,
		stack.Striped,
		stack.Zero,
		stack.Error,
		stack.Flakey,
		stack.Dust,
		delay.Type,
		multipath.Type,
		logwrites.Type,
		powercut.Type,
		thin.PoolType,
		thin.Type,
	}
}
