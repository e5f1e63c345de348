package stack_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
)

// TestCtorDeviceAndMappedDevice: a constructor learns the device its table
// is built for (Ctor.Device), and finds the live target of a mapped device
// it opens through MappedDevice, as a thin table finds its pool; a file it
// opens is no mapped device. Suspended follows suspend and resume.
func TestCtorDeviceAndMappedDevice(t *testing.T) {
	type seen struct {
		self, below *stack.Device
		target      stack.Target
		file        bool
	}
	var got []seen
	probe := &stack.TargetType{Name: "probe", Version: [3]int{1, 0, 0}, New: func(c *stack.Ctor, args []string) (stack.Target, error) {
		bd, err := c.Open(args[0])
		if err != nil {
			return nil, err
		}
		s := seen{self: c.Device}
		if d, ok := stack.MappedDevice(bd); ok {
			s.below = d
			s.target, _, _ = d.Live().TargetAt(0)
		} else {
			s.file = true
		}
		got = append(got, s)
		return &stack.Remap{Dev: bd}, nil
	}}
	reg, err := stack.NewRegistry(stack.Linear, probe)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg})
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := m.Create(stack.CreateOptions{Name: "a", Minor: -1, Table: "0 2048 linear " + img + " 0"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(stack.CreateOptions{Name: "b", Minor: -1, Table: "0 2048 probe a\n2048 2048 probe " + img})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d constructor calls, want 2", len(got))
	}
	aTarget, _, _ := a.Live().TargetAt(0)
	if got[0].self != b || got[0].below != a || got[0].target != aTarget || got[0].file {
		t.Errorf("line 1: Ctor.Device %v (want b), MappedDevice %v (want a), target %v (want a's %v)", got[0].self, got[0].below, got[0].target, aTarget)
	}
	if got[1].self != b || !got[1].file {
		t.Errorf("line 2: Ctor.Device %v (want b), the file taken for a mapped device %v", got[1].self, got[1].below)
	}
	if d, ok := stack.MappedDevice(a); !ok || d != a {
		t.Errorf("MappedDevice of a *Device: %v, %v", d, ok)
	}
	if a.Suspended() {
		t.Error("a fresh device reports suspended")
	}
	if err := m.Suspend("a", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if !a.Suspended() {
		t.Error("a suspended device reports not suspended")
	}
	if err := m.Resume("a", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if a.Suspended() {
		t.Error("a resumed device reports suspended")
	}
}
