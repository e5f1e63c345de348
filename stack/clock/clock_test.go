package clock_test

import (
	"reflect"
	"testing"

	"github.com/dmfuse/dmfuse/selectors"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/clock"
	"github.com/dmfuse/dmfuse/stats"
)

// TestOneClock checks that stack, selectors and stats name the same Clock
// type, so a clock passes between them without conversion.
func TestOneClock(t *testing.T) {
	want := reflect.TypeFor[clock.Clock]()
	for name, got := range map[string]reflect.Type{
		"stack.Clock":     reflect.TypeFor[stack.Clock](),
		"selectors.Clock": reflect.TypeFor[selectors.Clock](),
		"stats.Clock":     reflect.TypeFor[stats.Clock](),
	} {
		if got != want {
			t.Errorf("%s is %v, not %v", name, got, want)
		}
	}
	var c clock.Clock = &selectors.ManualClock{}
	var _ stack.Clock = c
	var _ selectors.Clock = stats.SystemClock
	if stats.NewDisk(c) == nil {
		t.Fatal("NewDisk with a selectors clock returned nil")
	}
}
