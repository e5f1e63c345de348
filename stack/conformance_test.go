package stack_test

import (
	"testing"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/logwrites"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// defaultRegistry holds the target types the dmfuse command registers.
func defaultRegistry(t testing.TB) *stack.Registry {
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped, stack.Zero, stack.Error,
		stack.Flakey, stack.Dust, delay.Type, stack.Multipath, logwrites.Type)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestConformance runs the stacktest suite on every target type dmfuse
// registers.
func TestConformance(t *testing.T) {
	stacktest.RunRegistry(t, defaultRegistry(t))
}
