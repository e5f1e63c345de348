package dmsetup

import (
	"context"
	"testing"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/stack"
)

// noflushProbe is a target whose INFO status says whether it was asked for
// with noflush (stack.NoFlushStatuser), as thin-pool's commits or not.
type noflushProbe struct{}

func (noflushProbe) ReadAt(_ context.Context, p []byte, _ int64) (int, error) { return len(p), nil }
func (noflushProbe) WriteAt(_ context.Context, p []byte, _ int64) (int, error) {
	return len(p), nil
}
func (noflushProbe) Close() error { return nil }
func (noflushProbe) Status(st stack.StatusType) string {
	if st == stack.StatusTable {
		return ""
	}
	return "flushed"
}
func (noflushProbe) StatusNoFlush() string { return "noflush" }

var _ stack.NoFlushStatuser = noflushProbe{}

// TestStatusNoFlush: `dmsetup status --noflush` reaches the target
// (DM_STATUS_NOFLUSH_FLAG), plain status does not, and table ignores it.
func TestStatusNoFlush(t *testing.T) {
	h := newHarness(t)
	reg := registry(t)
	if err := reg.Register(&stack.TargetType{Name: "probe", Version: [3]int{1, 0, 0},
		New: func(*stack.Ctor, []string) (stack.Target, error) { return noflushProbe{}, nil }}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr := stack.NewManager(stack.ManagerOptions{Registry: reg, Context: ctx})
	off := stack.NewManager(stack.ManagerOptions{Registry: reg, Context: ctx})
	h.srv, h.offline = control.NewServer(ctx, mgr), control.NewServer(ctx, off)
	t.Cleanup(func() { h.srv.Close(); h.offline.Close(); mgr.Close(); off.Close(); cancel() })
	for _, c := range []struct {
		args []string
		want string
	}{
		{args("create", "p", "--table", "0 8 probe\n8 8 linear "+h.dir+"/a.img 0\n"), "create"},
		{args("status", "p", "--noflush"), "0 8 probe noflush\n8 8 linear \n"},
		{args("status", "--noflush", "p"), "0 8 probe noflush\n8 8 linear \n"},
		{args("status", "p"), "0 8 probe flushed\n8 8 linear \n"},
		{args("status", "--noflush"), "p: 0 8 probe noflush\np: 8 8 linear \n"},
		{args("status", "p", "--noflush", "--target", "probe"), "0 8 probe noflush\n"},
		{args("table", "p", "--noflush"), "0 8 probe \n8 8 linear " + h.dir + "/a.img 0\n"},
	} {
		out, errs, code := h.run("", c.args...)
		if c.want == "create" {
			if code != 0 {
				t.Fatalf("%q: exit %d: %s", c.args, code, errs)
			}
			continue
		}
		if code != 0 || out != c.want {
			t.Errorf("dmsetup %q: exit %d, %q (stderr %q); want %q", c.args, code, out, errs, c.want)
		}
	}
}
