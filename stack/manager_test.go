package stack

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// msgLog is a target type, "msglog", whose targets take any message, answer
// "got: WORDS" and record what they got, for the tests of message routing.
type msgLog struct {
	mu  sync.Mutex
	got []string
}

func (l *msgLog) typ() *TargetType {
	return &TargetType{Name: "msglog", Version: [3]int{1, 0, 0}, New: func(*Ctor, []string) (Target, error) {
		return &msgLogTarget{log: l}, nil
	}}
}

func (l *msgLog) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

type msgLogTarget struct {
	zero
	log *msgLog
}

func (t *msgLogTarget) Message(_ context.Context, args []string) (string, error) {
	w := strings.Join(args, " ")
	t.log.mu.Lock()
	t.log.got = append(t.log.got, w)
	t.log.mu.Unlock()
	return "got: " + w, nil
}

// TestMessageWithoutLiveTable routes messages as drivers/md/dm-ioctl.c:
// target_message does. A message for a target, sent to a device for which
// dm_get_live_table finds no table (none at all, or only an inactive one),
// succeeds with no output and reaches no target; a suspended device keeps
// its live table, whose target gets the message. Core (`@`) messages and
// the checks before the table lookup (the device exists, the message has
// words) do not depend on a table.
func TestMessageWithoutLiveTable(t *testing.T) {
	log := &msgLog{}
	reg, err := NewRegistry(Zero, log.typ())
	if err != nil {
		t.Fatal(err)
	}
	var core []string
	m := NewManager(ManagerOptions{Registry: reg, CoreMessage: func(d *Device, args []string) (string, error) {
		core = append(core, d.Name()+" "+strings.Join(args, " "))
		return "0", nil
	}})
	defer m.Close()
	ctx := context.Background()
	if _, err := m.Create(CreateOptions{Name: "d", Minor: -1, NoTable: true}); err != nil {
		t.Fatal(err)
	}
	send := func(what string, sector uint64, words ...string) {
		t.Helper()
		if out, err := m.Message(ctx, "d", sector, words); out != "" || err != nil {
			t.Errorf("%s: %q to a device without a live table: %q, %v; want no output and no error", what, words, out, err)
		}
	}
	send("no table", 0, "hello")
	send("no table", 1<<40, "hello") // no table, so no sector to be outside of
	if err := m.Load("d", "0 8 msglog", ""); err != nil {
		t.Fatal(err)
	}
	send("inactive table only", 0, "hello")
	if got := log.messages(); len(got) != 0 {
		t.Errorf("the inactive table's target got %q", got)
	}

	if out, err := m.Message(ctx, "d", 0, []string{"@stats_list"}); out != "0" || err != nil {
		t.Errorf("core message without a live table: %q, %v", out, err)
	}
	if _, err := m.Message(ctx, "d", 0, nil); err == nil || err.Error() != "d: Empty message received" || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("empty message without a live table: %v", err)
	}
	if _, err := m.Message(ctx, "nope", 0, []string{"hello"}); !errors.Is(err, syscall.ENXIO) {
		t.Errorf("message to a device that does not exist: %v, want ENXIO", err)
	}

	if err := m.Resume("d", Flags{}); err != nil {
		t.Fatal(err)
	}
	if out, err := m.Message(ctx, "d", 7, []string{"live"}); out != "got: live" || err != nil {
		t.Errorf("message to the live table: %q, %v", out, err)
	}
	if err := m.Suspend("d", Flags{}); err != nil {
		t.Fatal(err)
	}
	if out, err := m.Message(ctx, "d", 0, []string{"suspended"}); out != "got: suspended" || err != nil {
		t.Errorf("message to a suspended device: %q, %v", out, err)
	}
	if _, err := m.Message(ctx, "d", 8, []string{"outside"}); err == nil || err.Error() != "d: Target message sector outside device" {
		t.Errorf("message past the live table's end: %v", err)
	}
	if got := log.messages(); !reflect.DeepEqual(got, []string{"live", "suspended"}) {
		t.Errorf("the target got %q, want [live suspended]", got)
	}
	if !reflect.DeepEqual(core, []string{"d @stats_list"}) {
		t.Errorf("the core got %q", core)
	}
}

// TestStackOnInactiveTable: a table may name a device that has only an
// inactive table, as libdevmapper's preload makes a snapshot origin's -real
// device and resumes it after the tables above it: its areas are checked
// against that table's size, its I/O fails with ENXIO until the device
// below is resumed, then reaches it; a table over a device reloaded larger
// is checked against the new size. A device with no table at all is still
// refused.
func TestStackOnInactiveTable(t *testing.T) {
	m, _ := newExportManager(t)
	mustCreate(t, m, "real", "")
	if err := m.Load("real", "0 64 zero", ""); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "empty", "")
	if _, err := m.Create(CreateOptions{Name: "x", Minor: -1, Table: "0 8 linear empty 0"}); err == nil || !strings.Contains(err.Error(), "empty has no live table") {
		t.Errorf("over a device without a table: %v", err)
	}
	if _, err := m.Create(CreateOptions{Name: "big", Minor: -1, Table: "0 128 linear real 0"}); err == nil || !strings.Contains(err.Error(), "too small for target") {
		t.Errorf("past the inactive table's size: %v", err)
	}
	top := mustCreate(t, m, "top", "0 64 linear real 0")
	p := make([]byte, 512)
	if _, err := top.ReadAt(context.Background(), p, 0); !errors.Is(err, syscall.ENXIO) {
		t.Errorf("read before the device below is resumed: %v", err)
	}
	if err := m.Resume("real", Flags{}); err != nil {
		t.Fatal(err)
	}
	if _, err := top.ReadAt(context.Background(), p, 0); err != nil {
		t.Errorf("read once it is: %v", err)
	}
	// A resize: the device below is reloaded larger, and a table over it
	// is loaded at the new size before both are resumed.
	if err := m.Load("real", "0 128 zero", ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Load("top", "0 128 linear real 0", ""); err != nil {
		t.Errorf("a table over the reloaded size: %v", err)
	}
}
