package targets_test

import (
	"testing"

	"github.com/dmfuse/dmfuse/internal/targets"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestConformance runs the stacktest suite on every target type dmfuse
// registers; a type without a case in stacktest.Cases fails.
func TestConformance(t *testing.T) {
	reg, err := stack.NewRegistry(targets.All()...)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.RunRegistry(t, reg)
}

// TestNoStaleCases: every case of stacktest.Cases belongs to a type of the
// list, so a type that leaves the list takes its case with it.
func TestNoStaleCases(t *testing.T) {
	names := map[string]bool{}
	for _, typ := range targets.All() {
		names[typ.Name] = true
	}
	for name := range stacktest.Cases {
		if !names[name] {
			t.Errorf("stacktest.Cases holds %q, which is no type of targets.All", name)
		}
	}
}
