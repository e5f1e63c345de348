package multipath

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/dmarg"
	"github.com/dmfuse/dmfuse/internal/golden"
	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/selectors"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
	"github.com/dmfuse/dmfuse/stats"
)

// mpDev is an in-memory path device behind a stacktest.FaultDevice, which
// counts its I/O and can be made to fail (setFail).
type mpDev struct {
	*stacktest.FaultDevice
	mem  *stacktest.MemDevice
	fail *stacktest.Fault
}

func newMPDev(name string) *mpDev {
	f, mem := stacktest.NewMemFaultDevice(name, 2048*stack.SectorSize)
	return &mpDev{FaultDevice: f, mem: mem}
}

// Bytes returns the memory device's contents.
func (d *mpDev) Bytes() []byte { return d.mem.Bytes() }

// setFail makes every I/O fail with err from now on; nil ends it.
func (d *mpDev) setFail(err error) {
	if d.fail != nil {
		d.fail.Remove()
		d.fail = nil
	}
	if err != nil {
		d.fail = d.Fail(ioop.All, err)
	}
}

// mpFixture is a multipath target over mpDev paths named by MAJOR:MINOR (8:16,
// 8:32, 8:48), as dmsetup prints block devices.
type mpFixture struct {
	m      *multipath
	devs   map[string]*mpDev
	events atomic.Int64
	clock  *clock.Manual
}

func newMP(t testing.TB, params string) *mpFixture {
	t.Helper()
	f, err := tryMP(params)
	if err != nil {
		t.Fatalf("multipath %q: %v", params, err)
	}
	return f
}

func tryMP(params string) (*mpFixture, error) {
	f := &mpFixture{devs: map[string]*mpDev{}, clock: &clock.Manual{}}
	f.clock.Set(1e9)
	for _, n := range []string{"8:16", "8:32", "8:48"} {
		f.devs[n] = newMPDev(n)
	}
	c := &stack.Ctor{Len: 1024, Clock: f.clock, Context: context.Background(), Event: func() { f.events.Add(1) },
		Open: func(arg string) (stack.BlockDevice, error) {
			if d, ok := f.devs[arg]; ok {
				return d, nil
			}
			return nil, stack.Errorf("Device lookup failed: %s: no such device", arg)
		}}
	tg, err := Type.New(c, stack.SplitArgs(params))
	if err != nil {
		return nil, err
	}
	f.m = tg.(*multipath)
	f.m.logger = log.New(io.Discard, "", 0)
	return f, nil
}

func (f *mpFixture) table() string  { return "0 1024 multipath " + f.m.Status(stack.StatusTable) + "$" }
func (f *mpFixture) status() string { return "0 1024 multipath " + f.m.Status(stack.StatusInfo) + "$" }

func (f *mpFixture) msg(t *testing.T, words string) error {
	t.Helper()
	_, err := f.m.Message(context.Background(), strings.Fields(words))
	return err
}

func (f *mpFixture) read(t *testing.T) error {
	t.Helper()
	buf := make([]byte, 4096)
	_, err := f.m.ReadAt(context.Background(), buf, 0)
	return err
}

// reads returns the read count of each device, in the order given.
func (f *mpFixture) reads(names ...string) []int64 {
	var out []int64
	for _, n := range names {
		out = append(out, f.devs[n].Count(ioop.SetOf(ioop.Read)))
	}
	return out
}

func wantStr(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// TestMultipathTableVectors checks the table and status lines of
// drivers/md/dm-mpath.c: multipath_status for each selector, queue mode and
// feature.
func TestMultipathTableVectors(t *testing.T) {
	t.Run("round-robin", func(t *testing.T) {
		f := newMP(t, "0 0 1 1 round-robin 0 2 1 8:16 1000 8:32 1000")
		wantStr(t, "table", f.table(), "0 1024 multipath 0 0 1 1 round-robin 0 2 1 8:16 1 8:32 1 $")
		wantStr(t, "fresh", f.status(), "0 1024 multipath 2 1 0 0 1 1 E 0 2 0 8:16 A 0 8:32 A 0 $")
		if err := f.read(t); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after first I/O", f.status(), "0 1024 multipath 2 0 0 0 1 1 A 0 2 0 8:16 A 0 8:32 A 0 $")
		if err := f.msg(t, "fail_path 8:16"); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after fail_path", f.status(), "0 1024 multipath 2 0 0 0 1 1 A 0 2 0 8:16 F 1 8:32 A 0 $")
		if err := f.msg(t, "reinstate_path 8:16"); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after reinstate_path", f.status(), "0 1024 multipath 2 0 0 0 1 1 A 0 2 0 8:16 A 1 8:32 A 0 $")
	})
	t.Run("queue-length bio", func(t *testing.T) {
		f := newMP(t, "3 queue_if_no_path queue_mode bio 0 1 1 queue-length 0 2 1 8:16 128 8:32 128")
		wantStr(t, "table", f.table(), "0 1024 multipath 4 queue_if_no_path retain_attached_hw_handler queue_mode bio 0 1 1 queue-length 0 2 1 8:16 1 8:32 1 $")
		wantStr(t, "fresh", f.status(), "0 1024 multipath 2 1 0 0 1 1 E 0 2 1 8:16 A 0 0 8:32 A 0 0 $")
		if err := f.msg(t, "fail_if_no_path"); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after fail_if_no_path", f.table(), "0 1024 multipath 3 retain_attached_hw_handler queue_mode bio 0 1 1 queue-length 0 2 1 8:16 1 8:32 1 $")
	})
	t.Run("service-time two groups", func(t *testing.T) {
		f := newMP(t, "0 0 2 2 service-time 0 1 2 8:16 1 1 service-time 0 1 2 8:32 1 4")
		wantStr(t, "table", f.table(), "0 1024 multipath 0 0 2 2 service-time 0 1 2 8:16 1 1 service-time 0 1 2 8:32 1 4 $")
		wantStr(t, "fresh", f.status(), "0 1024 multipath 2 1 0 0 2 2 E 0 1 2 8:16 A 0 0 1 E 0 1 2 8:32 A 0 0 4 $")
		if err := f.read(t); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after 1 I/O", f.status(), "0 1024 multipath 2 0 0 0 2 2 E 0 1 2 8:16 A 0 0 1 A 0 1 2 8:32 A 0 0 4 $")
		if got := f.reads("8:16", "8:32"); got[0] != 0 || got[1] != 1 {
			t.Errorf("reads %v, want the initial group 2 (8:32) used", got)
		}
		if err := f.msg(t, "disable_group 1"); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after disable_group 1", f.status(), "0 1024 multipath 2 0 0 0 2 1 D 0 1 2 8:16 A 0 0 1 E 0 1 2 8:32 A 0 0 4 $")
		if err := f.msg(t, "switch_group 1"); err != nil {
			t.Fatal(err)
		}
		if err := f.read(t); err != nil {
			t.Fatal(err)
		}
		wantStr(t, "after switch_group 1 + I/O", f.status(), "0 1024 multipath 2 0 0 0 2 1 A 0 1 2 8:16 A 0 0 1 E 0 1 2 8:32 A 0 0 4 $")
	})
	t.Run("historical-service-time", func(t *testing.T) {
		f := newMP(t, "0 0 1 1 historical-service-time 0 2 1 8:16 1 8:32 1")
		wantStr(t, "table", f.table(), "0 1024 multipath 0 0 1 1 historical-service-time 2 972 0 2 1 8:16 0 8:32 0 $")
		wantStr(t, "fresh", f.status(), "0 1024 multipath 2 1 0 0 1 1 E 2 972 0 2 3 8:16 A 0 1024 0 0 8:32 A 0 1024 0 0 $")
		f = newMP(t, "0 0 1 1 historical-service-time 2 512 2 2 1 8:16 1 8:32 1")
		wantStr(t, "table", f.table(), "0 1024 multipath 0 0 1 1 historical-service-time 2 512 2 2 1 8:16 0 8:32 0 $")
	})
	t.Run("extra features", func(t *testing.T) {
		f := newMP(t, "2 pg_init_retries 5 0 1 1 round-robin 0 1 1 8:16 1")
		wantStr(t, "table", f.table(), "0 1024 multipath 2 pg_init_retries 5 0 1 1 round-robin 0 1 1 8:16 1 $")
	})
}

// TestMultipathTablesGolden round-trips more tables (features, handlers,
// groups) through table and status, against testdata/multipath/tables.golden.
func TestMultipathTablesGolden(t *testing.T) {
	cases := []string{
		"0 0 0 0",
		"1 QUEUE_IF_NO_PATH 0 1 1 round-robin 0 1 0 8:16",
		"2 pg_init_delay_msecs 0 0 1 1 round-robin 0 1 1 8:16 1",
		"7 pg_init_retries 50 pg_init_delay_msecs 60000 retain_attached_hw_handler queue_mode mq 0 1 1 round-robin 0 1 1 8:16 0",
		"0 3 alua 1 2 1 1 queue-length 0 2 1 8:16 1 8:32 1",
		"2 queue_mode bio 2 alua x 1 1 service-time 0 1 2 8:16 1 100",
		"2 queue_mode rq 1 emc 2 1 round-robin 0 1 0 8:16 round-robin 0 1 0 8:32",
		"0 0 3 3 round-robin 0 1 1 8:16 1 queue-length 0 1 1 8:32 1 historical-service-time 1 0 1 1 8:48 7",
		"0 0 1 5 round-robin 0 1 1 8:16 1",
		"0 0 2 1 round-robin 0 2 1 8:16 1 8:16 1 round-robin 0 1 1 8:16 1",
	}
	var out strings.Builder
	for _, c := range cases {
		f := newMP(t, c)
		fmt.Fprintf(&out, "in:     %s\ntable:  %s\nstatus: %s\n", c, f.table(), f.status())
		if err := f.read(t); err != nil {
			fmt.Fprintf(&out, "1 I/O:  %v\n", err)
		} else {
			fmt.Fprintf(&out, "1 I/O:  %s\n", f.status())
		}
		again := newMP(t, strings.TrimSuffix(strings.TrimPrefix(f.table(), "0 1024 multipath "), "$"))
		if again.table() != f.table() {
			t.Errorf("%s: table does not round-trip: %q -> %q", c, f.table(), again.table())
		}
	}
	golden.Check(t, "testdata/tables.golden", []byte(out.String()))
}

// TestMultipathHWHandlerNonSCSI: a hardware handler needs a SCSI path
// (scsi_dh). As drivers/md/dm-mpath.c: parse_path does for a path that is
// not SCSI, the handler is logged and dropped at the first path: table prints
// "0" for it and no group switch runs a pg_init. dmfuse paths are never
// SCSI. A table without paths keeps the handler it was given.
func TestMultipathHWHandlerNonSCSI(t *testing.T) {
	var logs bytes.Buffer
	log.SetOutput(&logs)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	for _, c := range []struct{ params, table, status string }{
		{"0 1 alua 1 1 round-robin 0 1 1 8:16 1",
			"0 1024 multipath 0 0 1 1 round-robin 0 1 1 8:16 1 $",
			"0 1024 multipath 2 0 0 0 1 1 A 0 1 0 8:16 A 0 $"},
		{"0 3 emc 1 2 2 1 queue-length 0 1 1 8:16 1 round-robin 0 1 1 8:32 1",
			"0 1024 multipath 0 0 2 1 queue-length 0 1 1 8:16 1 round-robin 0 1 1 8:32 1 $",
			"0 1024 multipath 2 0 0 0 2 1 A 0 1 1 8:16 A 0 0 E 0 1 0 8:32 A 0 $"},
		{"1 retain_attached_hw_handler 1 alua 1 1 round-robin 0 1 1 8:16 1",
			"0 1024 multipath 1 retain_attached_hw_handler 0 1 1 round-robin 0 1 1 8:16 1 $",
			"0 1024 multipath 2 0 0 0 1 1 A 0 1 0 8:16 A 0 $"},
		{"0 1 alua 0 0", "0 1024 multipath 0 1 alua 0 0 $", ""},
	} {
		logs.Reset()
		f := newMP(t, c.params)
		wantStr(t, c.params+": table", f.table(), c.table)
		dropped := strings.Count(logs.String(), "hardware handlers are only allowed for scsi devices")
		if c.status == "" {
			if dropped != 0 {
				t.Errorf("%s: handler dropped without a path: %q", c.params, logs.String())
			}
			continue
		}
		if dropped != 1 {
			t.Errorf("%s: log %q, want the handler dropped once", c.params, logs.String())
		}
		if err := f.read(t); err != nil {
			t.Fatal(err)
		}
		// pg_init_count stays 0 after the first group switch.
		wantStr(t, c.params+": status after I/O", f.status(), c.status)
	}
}

// TestMultipathRejected checks tables that drivers/md/dm-mpath.c: multipath_ctr
// refuses: the error carries the kernel's text.
func TestMultipathRejected(t *testing.T) {
	cases := []struct{ params, want string }{
		{"0 0 1 0 round-robin 0 1 1 8:16 1", "invalid initial priority group"},
		{"0 0 0 1", "invalid initial priority group"},
		{"0 0 2 1 round-robin 0 1 1 8:16 1", "priority group count mismatch"},
		{"0 0 1 1 nosuch 0 1 1 8:16 1", "unknown path selector type"},
		{"0 0 1 1 round-robin 0 1 2 8:16 1 2", "round-robin ps: incorrect number of arguments"},
		{"1 foo 0 1 1 round-robin 0 1 1 8:16 1", "Unrecognised multipath feature request"},
		{"9 a b c d e f g h i 0 0 0", "invalid number of feature args"},
		{"3 queue_if_no_path 0", "invalid number of feature args"},
		{"3 queue_if_no_path 0 1 1", "Unrecognised multipath feature request"},
		{"2 pg_init_retries 0 0 0 0", "pg_init_retries must be between 1 and 50"},
		{"2 pg_init_retries 51 0 0 0", "pg_init_retries must be between 1 and 50"},
		{"2 pg_init_delay_msecs 60001 0 0 0", "pg_init_delay_msecs must be between 0 and 60000"},
		{"1 pg_init_retries 0 0 0", "Unrecognised multipath feature request"},
		{"2 queue_mode xx 0 0 0", "Unknown 'queue_mode' requested"},
		{"0 5 a 0 0", "invalid number of hardware handler args"},
		{"0 0 1025 1", "invalid number of priority groups"},
		{"0 0 1 x", "invalid initial priority group number"},
		{"0 0 1 1 round-robin", "not enough priority group arguments"},
		{"0 0 1 1 round-robin 3 a b", "invalid number of path selector args"},
		{"0 0 1 1 round-robin 0 0 1", "invalid number of paths"},
		{"0 0 1 1 round-robin 0 1 1025 8:16", "invalid number of selector args"},
		{"0 0 1 1 round-robin 0 2 1 8:16 1", "not enough path parameters"},
		{"0 0 1 1 round-robin 0 1 1 9:99 1", "error getting device"},
		{"0 0 1 1 round-robin 0 1 1 8:16 x", "round-robin ps: invalid repeat count"},
		{"0 0 1 1 service-time 0 1 2 8:16 1 101", "service-time ps: invalid relative_throughput value"},
		{"0 0 1 1 historical-service-time 1 1024 1 1 8:16 1", selectors.KernelCtrFailed},
		{"0 0 1 1 historical-service-time 3 1 2 3 1 1 8:16 1", selectors.KernelCtrFailed},
		{"", "invalid number of feature args"},
	}
	for _, c := range cases {
		_, err := tryMP(c.params)
		if err == nil {
			t.Errorf("%q: accepted", c.params)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%q: got %v, want %q (EINVAL)", c.params, err, c.want)
		}
	}
}

// TestMultipathTableRules: multipath must be alone in its table and cannot be
// replaced by another type on reload, except by error (drivers/md/dm-ioctl.c:
// table_load).
func TestMultipathTableRules(t *testing.T) {
	devs := stacktest.TableDevs()
	reg, err := stack.NewRegistry(stack.Linear, stack.Error, Type)
	if err != nil {
		t.Fatal(err)
	}
	build := func(text string, prev *stack.Table) (*stack.Table, error) {
		lines, err := stack.ParseTable(text)
		if err != nil {
			return nil, err
		}
		return stack.Build(lines, stack.BuildOptions{Registry: reg, Clock: clock.System, Context: context.Background(), Previous: prev,
			Open: func(arg string) (stack.BlockDevice, error) {
				if d, ok := devs[arg]; ok {
					return d, nil
				}
				return nil, stack.Errorf("Device lookup failed")
			}})
	}
	_, err = build("0 512 multipath 0 0 1 1 round-robin 0 1 1 8:16 1\n512 512 linear 8:32 0", nil)
	if err == nil || !strings.Contains(err.Error(), "singleton target type must appear alone in table") {
		t.Errorf("multipath + linear: %v", err)
	}
	mp, err := build("0 1024 multipath 0 0 1 1 round-robin 0 1 1 8:16 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	if _, err := build("0 1024 linear 8:16 0", mp); err == nil || !strings.Contains(err.Error(), "can't replace immutable target type multipath") {
		t.Errorf("reload with linear: %v", err)
	}
	et, err := build("0 1024 error", mp)
	if err != nil {
		t.Errorf("reload with error: %v", err)
	} else {
		et.Close()
	}
	mp2, err := build("0 1024 multipath 0 0 1 1 queue-length 0 1 1 8:32 1", mp)
	if err != nil {
		t.Errorf("reload with multipath: %v", err)
	} else {
		mp2.Close()
	}
}

// TestMultipathMessageVectors checks the answers of drivers/md/dm-mpath.c:
// multipath_message and its other message errors.
func TestMultipathMessageVectors(t *testing.T) {
	f := newMP(t, "0 0 2 1 round-robin 0 1 1 8:16 1 round-robin 0 1 1 8:32 1")
	cases := []struct {
		msg  string
		want error
	}{
		{"fail_path 8:99", syscall.EINVAL},
		{"fail_path nosuch", syscall.EINVAL},
		{"switch_group 0", syscall.EINVAL},
		{"switch_group 3", syscall.EINVAL},
		{"switch_group x", syscall.EINVAL},
		{"enable_group 3", syscall.EINVAL},
		{"disable_group 0", syscall.EINVAL},
		{"queue_if_no_path extra", syscall.EINVAL},
		{"fail_path", syscall.EINVAL},
		{"fail_path 8:16 8:32", syscall.EINVAL},
		{"frobnicate 1", syscall.EINVAL},
		{"FAIL_PATH 8:16", nil},
		{"fail_path 8:16", nil}, // already failed: a no-op
		{"Reinstate_Path 8:16", nil},
		{"reinstate_path 8:16", nil}, // already active: a no-op
		{"Switch_Group 2", nil},
		{"ENABLE_group 1", nil},
		{"Queue_If_No_Path", nil},
		{"FAIL_IF_NO_PATH", nil},
	}
	for _, c := range cases {
		err := f.msg(t, c.msg)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%q: got %v, want %v", c.msg, err, c.want)
		}
	}
	wantStr(t, "fail counts", f.status(), "0 1024 multipath 2 1 0 0 2 2 E 0 1 0 8:16 A 1 E 0 1 0 8:32 A 0 $")

	f.m.Presuspend(false)
	f.m.Postsuspend()
	for _, m := range []string{"fail_path 8:16", "reinstate_path 8:16", "switch_group 1", "queue_if_no_path", "fail_if_no_path", "disable_group 1"} {
		if err := f.msg(t, m); !errors.Is(err, syscall.EBUSY) {
			t.Errorf("%q while suspended: got %v, want EBUSY", m, err)
		}
	}
	f.m.Resume()
	if err := f.msg(t, "fail_path 8:16"); err != nil {
		t.Errorf("after resume: %v", err)
	}
}

// TestMultipathEvents: path state changes and group messages raise table
// events; no-ops do not.
func TestMultipathEvents(t *testing.T) {
	f := newMP(t, "0 0 2 1 round-robin 0 1 1 8:16 1 round-robin 0 1 1 8:32 1")
	steps := []struct {
		msg  string
		want int64
	}{
		{"fail_path 8:16", 1}, {"fail_path 8:16", 1}, {"reinstate_path 8:16", 2}, {"reinstate_path 8:16", 2},
		{"disable_group 1", 3}, {"enable_group 1", 4}, {"switch_group 2", 5}, {"queue_if_no_path", 5},
	}
	for _, s := range steps {
		if err := f.msg(t, s.msg); err != nil {
			t.Fatal(err)
		}
		if got := f.events.Load(); got != s.want {
			t.Errorf("after %q: %d events, want %d", s.msg, got, s.want)
		}
	}
}

// TestMultipathRoundRobinOrder: A B A B ...; after fail A and reinstate A the
// next pick is A (drivers/md/dm-ps-round-robin.c: rr_reinstate_path puts the
// path back at the head of the valid list).
func TestMultipathRoundRobinOrder(t *testing.T) {
	f := newMP(t, "0 0 1 1 round-robin 0 2 1 8:16 1 8:32 1")
	var order []string
	pick := func() {
		before := f.reads("8:16", "8:32")
		if err := f.read(t); err != nil {
			t.Fatal(err)
		}
		after := f.reads("8:16", "8:32")
		if after[0] > before[0] {
			order = append(order, "A")
		} else {
			order = append(order, "B")
		}
	}
	for range 4 {
		pick()
	}
	if err := f.msg(t, "fail_path 8:16"); err != nil {
		t.Fatal(err)
	}
	pick()
	pick()
	if err := f.msg(t, "reinstate_path 8:16"); err != nil {
		t.Fatal(err)
	}
	pick()
	pick()
	if got, want := strings.Join(order, " "), "A B A B B B A B"; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
}

// TestMultipathServiceTimeChoice: drivers/md/dm-ps-service-time.c:
// st_compare_load through the target: p1 with 4096 bytes in flight at rt 1, p2
// with 8192 at rt 4; a 4096-byte I/O goes to p2.
func TestMultipathServiceTimeChoice(t *testing.T) {
	f := newMP(t, "0 0 1 1 service-time 0 2 2 8:16 1 1 8:32 1 4")
	pg := f.m.pgs[0]
	p1, p2 := pg.paths[0], pg.paths[1]
	pg.tracker.StartIO(&p1.sp, 4096)
	pg.tracker.StartIO(&p2.sp, 8192)
	if err := f.read(t); err != nil {
		t.Fatal(err)
	}
	if got := f.reads("8:16", "8:32"); got[0] != 0 || got[1] != 1 {
		t.Errorf("reads %v, want the I/O on 8:32", got)
	}
}

// TestMultipathHSTStamp: the start stamp given to HST comes from the same clock
// as the selector's, at map time; the arithmetic of
// drivers/md/dm-ps-historical-service-time.c (a 100,000 ns sample, base 972, 2
// valid paths) then shows in status.
func TestMultipathHSTStamp(t *testing.T) {
	f := newMP(t, "0 0 1 1 historical-service-time 0 2 1 8:16 1 8:32 1")
	if !f.m.pgs[0].typ.HRTimer {
		t.Fatal("historical-service-time does not ask for the high-resolution stamp")
	}
	for _, d := range f.devs {
		d.Inject(stacktest.Rule{Ops: ioop.SetOf(ioop.Read), Hook: func(context.Context, ioop.Op, int64, int64) { f.clock.Advance(100 * time.Microsecond) }})
	}
	if err := f.read(t); err != nil {
		t.Fatal(err)
	}
	// Both paths are stale and idle, so the first is picked.
	finish := int64(1e9 + 100_000)
	stale := finish + 2*(5200972>>10)
	want := fmt.Sprintf("0 1024 multipath 2 0 0 0 1 1 A 2 972 0 2 3 8:16 A 0 5200972 0 %d 8:32 A 0 1024 0 0 $", stale)
	wantStr(t, "status", f.status(), want)
}

// TestMultipathFailover: a path error fails the path (an event), and the
// I/O is retried on the other path; non-path errors come back unchanged.
func TestMultipathFailover(t *testing.T) {
	f := newMP(t, "0 0 1 1 round-robin 0 2 1 8:16 1 8:32 1")
	copy(f.devs["8:32"].Bytes(), bytes.Repeat([]byte{0xab}, 4096))
	copy(f.devs["8:16"].Bytes(), bytes.Repeat([]byte{0xab}, 4096))
	f.devs["8:16"].setFail(syscall.EIO)
	buf := make([]byte, 4096)
	n, err := f.m.ReadAt(context.Background(), buf, 0)
	if err != nil || n != 4096 || buf[0] != 0xab {
		t.Fatalf("read: %d %v %x", n, err, buf[0])
	}
	wantStr(t, "status", f.status(), "0 1024 multipath 2 0 0 0 1 1 A 0 2 0 8:16 F 1 8:32 A 0 $")
	if f.events.Load() != 1 {
		t.Errorf("%d events, want 1", f.events.Load())
	}
	// Writes reach the surviving path.
	if _, err := f.m.WriteAt(context.Background(), bytes.Repeat([]byte{7}, 512), 4096); err != nil {
		t.Fatal(err)
	}
	if f.devs["8:32"].Bytes()[4096] != 7 {
		t.Error("write did not reach 8:32")
	}
	// A non-path error is returned as is and fails nothing.
	f.devs["8:32"].setFail(syscall.ENOSPC)
	if _, err := f.m.WriteAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("ENOSPC: got %v", err)
	}
	wantStr(t, "after ENOSPC", f.status(), "0 1024 multipath 2 0 0 0 1 1 A 0 2 0 8:16 F 1 8:32 A 0 $")
	// The last path fails: no queue_if_no_path, so EIO, and no path is left.
	f.devs["8:32"].setFail(syscall.EIO)
	if err := f.read(t); !errors.Is(err, syscall.EIO) {
		t.Errorf("last path: got %v, want EIO", err)
	}
	wantStr(t, "all failed", f.status(), "0 1024 multipath 2 0 0 0 1 1 A 0 2 0 8:16 F 1 8:32 F 1 $")
	// No path at map time: EIO (killed at map time, so not accounted:
	// TestMultipathNoPathNotAccounted); the current group is forgotten.
	if _, err := f.m.ReadAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("no path: got %v", err)
	}
	wantStr(t, "no path", f.status(), "0 1024 multipath 2 0 0 0 1 1 E 0 2 0 8:16 F 1 8:32 F 1 $")
	// Failover across groups: group 2 takes over when group 1 has no path.
	g := newMP(t, "0 0 2 1 round-robin 0 1 1 8:16 1 round-robin 0 1 1 8:32 1")
	g.devs["8:16"].setFail(syscall.EIO)
	if err := g.read(t); err != nil {
		t.Fatal(err)
	}
	wantStr(t, "group failover", g.status(), "0 1024 multipath 2 0 0 0 2 2 E 0 1 0 8:16 F 1 A 0 1 0 8:32 A 0 $")
	// The device stays in group 2 after group 1 comes back.
	g.devs["8:16"].setFail(nil)
	if err := g.msg(t, "reinstate_path 8:16"); err != nil {
		t.Fatal(err)
	}
	if err := g.read(t); err != nil {
		t.Fatal(err)
	}
	if got := g.reads("8:16", "8:32"); got[0] != 1 || got[1] != 2 {
		t.Errorf("reads %v, want the second read on 8:32 too", got)
	}
}

// TestMultipathFlushOnePath: a flush goes to one path, chosen like any I/O,
// and fails over.
func TestMultipathFlushOnePath(t *testing.T) {
	f := newMP(t, "0 0 1 1 round-robin 0 2 1 8:16 1 8:32 1")
	if err := f.m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a, b := f.devs["8:16"].Count(ioop.SetOf(ioop.Flush)), f.devs["8:32"].Count(ioop.SetOf(ioop.Flush)); a+b != 1 {
		t.Errorf("flushes %d + %d, want 1", a, b)
	}
	f.devs["8:32"].setFail(syscall.EIO)
	if err := f.m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The first flush went to 8:16; the second was tried on 8:32, failed
	// it, and went to 8:16; the third went to 8:16.
	if got := f.devs["8:16"].Count(ioop.SetOf(ioop.Flush)); got != 3 {
		t.Errorf("8:16 got %d flushes, want 3", got)
	}
	// Discard and write-zeroes map to one path as well.
	copy(f.devs["8:16"].Bytes(), bytes.Repeat([]byte{1}, 1024))
	if err := f.m.Discard(context.Background(), 0, 512); err != nil {
		t.Fatal(err)
	}
	if err := f.m.WriteZeroes(context.Background(), 512, 512); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.devs["8:16"].Bytes()[:1024], make([]byte, 1024)) {
		t.Error("discard/write-zeroes did not reach 8:16")
	}
}

// waitHeld waits until n I/Os are held in the target (no timing assertion:
// the test's own deadline bounds it).
func waitHeld(t *testing.T, m *multipath, n int) {
	t.Helper()
	for m.heldIOs() != n {
		time.Sleep(time.Millisecond)
	}
}

// TestMultipathQueueIfNoPath: with every path failed and queue_if_no_path
// set, I/O waits in the target and completes after a reinstate; a switch
// without a path leaves it waiting; fail_if_no_path fails it.
func TestMultipathQueueIfNoPath(t *testing.T) {
	f := newMP(t, "1 queue_if_no_path 0 1 1 queue-length 0 2 1 8:16 1 8:32 1")
	f.devs["8:16"].setFail(syscall.EIO)
	f.devs["8:32"].setFail(syscall.EIO)
	copy(f.devs["8:32"].Bytes(), []byte("hello"))
	done := make(chan error, 1)
	buf := make([]byte, 512)
	go func() {
		_, err := f.m.ReadAt(context.Background(), buf, 0)
		done <- err
	}()
	waitHeld(t, f.m, 1)
	wantStr(t, "all failed", f.status(), "0 1024 multipath 2 0 0 0 1 1 E 0 2 1 8:16 F 1 0 8:32 F 1 0 $")
	if err := f.msg(t, "switch_group 1"); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, f.m, 1)
	f.devs["8:32"].setFail(nil)
	if err := f.msg(t, "reinstate_path 8:32"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("held read: %v", err)
	}
	if string(buf[:5]) != "hello" {
		t.Errorf("read %q", buf[:5])
	}

	// Held again; fail_if_no_path releases it with EIO.
	if err := f.msg(t, "fail_path 8:32"); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := f.m.WriteAt(context.Background(), buf, 0)
		done <- err
	}()
	waitHeld(t, f.m, 1)
	if err := f.msg(t, "fail_if_no_path"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, syscall.EIO) {
		t.Errorf("after fail_if_no_path: %v, want EIO", err)
	}

	// A held I/O whose request is cancelled returns.
	if err := f.msg(t, "queue_if_no_path"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := f.m.ReadAt(ctx, buf, 0)
		done <- err
	}()
	waitHeld(t, f.m, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// TestMultipathSuspend: presuspend turns queue_if_no_path off (saved, so the
// table shows it off while suspended) and resume restores it; held I/O is
// failed by a flush suspend and pushed back by a noflush suspend.
func TestMultipathSuspend(t *testing.T) {
	for _, noflush := range []bool{false, true} {
		f := newMP(t, "1 queue_if_no_path 0 1 1 round-robin 0 1 1 8:16 1")
		if err := f.msg(t, "fail_path 8:16"); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := f.m.ReadAt(context.Background(), make([]byte, 512), 0)
			done <- err
		}()
		waitHeld(t, f.m, 1)
		f.m.Presuspend(noflush)
		err := <-done
		if noflush && !errors.Is(err, stack.ErrPushBack) || !noflush && (err != syscall.EIO) {
			t.Errorf("noflush=%v: held I/O got %v", noflush, err)
		}
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("noflush=%v: %v does not wrap EIO", noflush, err)
		}
		f.m.Postsuspend()
		wantStr(t, "suspended", f.table(), "0 1024 multipath 0 0 1 1 round-robin 0 1 1 8:16 1 $")
		f.m.Resume()
		wantStr(t, "resumed", f.table(), "0 1024 multipath 1 queue_if_no_path 0 1 1 round-robin 0 1 1 8:16 1 $")
	}
	// fail_if_no_path clears the saved value as well.
	f := newMP(t, "1 queue_if_no_path 0 1 1 round-robin 0 1 1 8:16 1")
	f.m.Presuspend(true)
	f.m.Resume()
	wantStr(t, "resumed", f.table(), "0 1024 multipath 1 queue_if_no_path 0 1 1 round-robin 0 1 1 8:16 1 $")
	f.m.Presuspend(false)
	f.m.mu.Lock()
	f.m.setQueueIfNoPathLocked(false, false)
	f.m.mu.Unlock()
	f.m.Resume()
	wantStr(t, "after fail_if_no_path", f.table(), "0 1024 multipath 0 0 1 1 round-robin 0 1 1 8:16 1 $")
}

// TestMultipathConcurrentFailover: many writers and readers verify their data
// while a loop fails and reinstates paths; with queue_if_no_path no I/O
// fails.
func TestMultipathConcurrentFailover(t *testing.T) {
	for _, sel := range []string{"round-robin 0 2 1 8:16 1 8:32 1", "queue-length 0 2 1 8:16 1 8:32 1",
		"service-time 0 2 2 8:16 1 1 8:32 1 2", "historical-service-time 0 2 1 8:16 1 8:32 1"} {
		name, _, _ := strings.Cut(sel, " ")
		t.Run(name, func(t *testing.T) {
			f := newMP(t, "1 queue_if_no_path 0 1 1 "+sel)
			f.clock = nil
			f.m.clock = clock.System
			// Both paths see the same storage, as multipath paths do.
			shared := f.devs["8:16"].mem
			*f.devs["8:32"] = mpDev{FaultDevice: stacktest.NewNamedFaultDevice("8:32", shared), mem: shared}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					off := int64(w) * 4096
					buf, got := make([]byte, 4096), make([]byte, 4096)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						for j := range buf {
							buf[j] = byte(i + j + w)
						}
						if _, err := f.m.WriteAt(context.Background(), buf, off); err != nil {
							errs <- err
							return
						}
						if _, err := f.m.ReadAt(context.Background(), got, off); err != nil {
							errs <- err
							return
						}
						if !bytes.Equal(buf, got) {
							errs <- fmt.Errorf("writer %d: data mismatch", w)
							return
						}
					}
				}()
			}
			for i := range 200 {
				d := []string{"8:16", "8:32"}[i%2]
				if err := f.msg(t, "fail_path "+d); err != nil {
					t.Error(err)
				}
				if i%7 == 0 {
					o := []string{"8:32", "8:16"}[i%2]
					if err := f.msg(t, "fail_path "+o); err != nil {
						t.Error(err)
					}
					if err := f.msg(t, "reinstate_path "+o); err != nil {
						t.Error(err)
					}
				}
				time.Sleep(50 * time.Microsecond)
				if err := f.msg(t, "reinstate_path "+d); err != nil {
					t.Error(err)
				}
			}
			close(stop)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestMultipathMessageDeviceForms: fail_path and reinstate_path accept any
// form of a device argument that resolves to the path's device: a mapped
// device by name or 253:N, a file by absolute or relative path.
func TestMultipathMessageDeviceForms(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a.img", "b.img"} {
		if err := os.WriteFile(filepath.Join(dir, n), make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := stack.NewRegistry(stack.Linear, stack.Error, Type)
	if err != nil {
		t.Fatal(err)
	}
	mgr := stack.NewManager(stack.ManagerOptions{Registry: reg})
	defer mgr.Close()
	p1, err := mgr.Create(stack.CreateOptions{Name: "p1", Minor: -1, Table: "0 2048 linear ./a.img 0", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.Create(stack.CreateOptions{Name: "mp", Minor: -1, Dir: dir,
		Table: "0 2048 multipath 0 0 1 1 round-robin 0 3 1 p1 1 ./b.img 1 " + filepath.Join(dir, "a.img") + " 1"}); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		return mgr.Lookup("mp").FormatTable(stack.StatusInfo, false)
	}
	send := func(words ...string) error {
		_, err := mgr.Message(context.Background(), "mp", 0, words)
		return err
	}
	if err := send("fail_path", p1.DevNo()); err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	wantStr(t, "MAJOR:MINOR", status(), fmt.Sprintf("0 2048 multipath 2 1 0 0 1 1 E 0 3 0 %s F 1 %s A 0 %s A 0 \n", p1.DevNo(), b, a))
	if err := send("reinstate_path", "p1"); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := send("fail_path", rel); err != nil {
		t.Fatal(err)
	}
	if err := send("fail_path", dir+"/./a.img"); err != nil {
		t.Fatal(err)
	}
	wantStr(t, "paths", status(), fmt.Sprintf("0 2048 multipath 2 1 0 0 1 1 E 0 3 0 %s A 1 %s F 1 %s F 1 \n", p1.DevNo(), b, a))
	if err := send("fail_path", filepath.Join(dir, "nosuch")); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("missing file: %v", err)
	}
	if err := send("fail_path", "240:99"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("240:99: %v", err)
	}
	// Suspended: EBUSY through the manager too.
	if err := mgr.Suspend("mp", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if err := send("reinstate_path", "p1"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("suspended: %v", err)
	}
	if err := mgr.Resume("mp", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	// I/O through the device with a failed path reaches a valid one.
	d := mgr.Lookup("mp")
	if _, err := d.WriteAt(context.Background(), []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestMultipathEscapedPaths: table and status print each path escaped
// (EscapeArg), so a table over files with white space or backslashes in
// their names loads again, and fail_path / reinstate_path take a path in the
// form given to the target (unescaped, as the message's word split leaves
// it) or in the escaped form that table and status print.
func TestMultipathEscapedPaths(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "x y")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(dir, "a b.img"), filepath.Join(dir, `c\d	e.img`)
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := stack.NewRegistry(stack.Linear, Type)
	if err != nil {
		t.Fatal(err)
	}
	mgr := stack.NewManager(stack.ManagerOptions{Registry: reg})
	defer mgr.Close()
	ea, eb := stack.EscapeArg(a), stack.EscapeArg(b)
	if !strings.Contains(ea, `\ `) || !strings.Contains(eb, `\\`) || !strings.Contains(eb, "\\\t") {
		t.Fatalf("test paths not escaped: %q %q", ea, eb)
	}
	table := "0 2048 multipath 0 1 alua 1 1 round-robin 0 2 1 " + ea + " 1 " + eb + " 1"
	if _, err := mgr.Create(stack.CreateOptions{Name: "mp", Minor: -1, Table: table}); err != nil {
		t.Fatal(err)
	}
	d := mgr.Lookup("mp")
	wantTable := "0 2048 multipath 0 0 1 1 round-robin 0 2 1 " + ea + " 1 " + eb + " 1 \n"
	wantStr(t, "table", d.FormatTable(stack.StatusTable, false), wantTable)
	wantStr(t, "status", d.FormatTable(stack.StatusInfo, false), "0 2048 multipath 2 1 0 0 1 1 E 0 2 0 "+ea+" A 0 "+eb+" A 0 \n")

	// The printed table loads again, to the same table.
	if _, err := mgr.Create(stack.CreateOptions{Name: "again", Minor: -1, Table: strings.TrimSuffix(d.FormatTable(stack.StatusTable, false), "\n")}); err != nil {
		t.Fatalf("printed table does not load: %v", err)
	}
	wantStr(t, "table of the printed table", mgr.Lookup("again").FormatTable(stack.StatusTable, false), wantTable)

	send := func(words ...string) {
		t.Helper()
		if _, err := mgr.Message(context.Background(), "mp", 0, words); err != nil {
			t.Errorf("%q: %v", words, err)
		}
	}
	send("fail_path", a)       // as split from "fail_path <ea>"
	send("reinstate_path", ea) // the printed form
	send("fail_path", eb)      //
	send("reinstate_path", b)  //
	send("fail_path", dir+"/./a b.img")
	wantStr(t, "status after messages", d.FormatTable(stack.StatusInfo, false), "0 2048 multipath 2 1 0 0 1 1 E 0 2 0 "+ea+" F 2 "+eb+" A 1 \n")
	if _, err := mgr.Message(context.Background(), "mp", 0, []string{"fail_path", filepath.Join(dir, `a\ c.img`)}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a path that is no path's, escaped: %v, want EINVAL", err)
	}
}

// FuzzMultipathArgs: any table either builds, prints a table that builds
// again to the same text, or fails with EINVAL.
func FuzzMultipathArgs(f *testing.F) {
	for _, s := range []string{
		"0 0 1 1 round-robin 0 2 1 8:16 1000 8:32 1000",
		"3 queue_if_no_path queue_mode bio 0 1 1 queue-length 0 2 1 8:16 128 8:32 128",
		"0 0 2 2 service-time 0 1 2 8:16 1 1 service-time 0 1 2 8:32 1 4",
		"0 0 1 1 historical-service-time 2 512 2 2 1 8:16 1 8:32 1",
		"2 pg_init_retries 5 0 1 1 round-robin 0 1 1 8:16 1",
		"0 3 alua 1 2 1 1 queue-length 0 2 1 8:16 1 8:32 1",
		"0 0 0 0", "1 foo 0 0 0", "9 0",
		"+0 0 0 0", "4294967296 0 0 0", "0 0 4294967297 1 round-robin 0 1 0 8:16", "0 0 1 1 round-robin 0 +1 0 8:16",
		"0 0 1 1 round-robin 0 1 1 8:16 4294967297", "0 2 alua x 0 0", "0 1 a\\ b 0 0", "0 1 a\\\\b 0 0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, params string) {
		m, err := tryMP(params)
		if err != nil {
			if !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("%q: %v is not EINVAL", params, err)
			}
			return
		}
		tbl := m.m.Status(stack.StatusTable)
		_ = m.m.Status(stack.StatusInfo)
		again, err := tryMP(tbl)
		if err != nil {
			t.Fatalf("%q: table %q does not build: %v", params, tbl, err)
		}
		if got := again.m.Status(stack.StatusTable); got != tbl {
			t.Fatalf("%q: table %q -> %q", params, tbl, got)
		}
		if len(m.m.pgs) > 0 {
			if _, err := m.m.ReadAt(context.Background(), make([]byte, 512), 0); err != nil {
				t.Fatalf("%q: read: %v", params, err)
			}
		}
	})
}

// FuzzMultipathMessage: any message either succeeds or fails with EINVAL,
// and leaves a target whose status prints and whose I/O works or fails
// cleanly.
func FuzzMultipathMessage(f *testing.F) {
	for _, s := range []string{"fail_path 8:16", "reinstate_path 8:32", "switch_group 2", "disable_group 1",
		"enable_group 2", "queue_if_no_path", "fail_if_no_path", "fail_path 8:99", "switch_group 0", "x y z",
		"switch_group +1", "switch_group 4294967298", "disable_group \\ 1", "enable_group -0", "switch_group 0x1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		m := newMP(t, "0 0 2 1 round-robin 0 2 1 8:16 1 8:32 1 historical-service-time 0 1 1 8:48 1")
		for _, line := range strings.Split(msg, ";") {
			args := stack.SplitArgs(line)
			_, err := m.m.Message(context.Background(), args)
			if err != nil && !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("%q: %v is not EINVAL", line, err)
			}
			// Group numbers are sscanf "%u%c" in 1..#groups.
			if len(args) == 2 && (strings.EqualFold(args[0], "switch_group") ||
				strings.EqualFold(args[0], "enable_group") || strings.EqualFold(args[0], "disable_group")) {
				n, ok := dmarg.Uint32(args[1])
				if want := ok && n >= 1 && n <= 2; (err == nil) != want {
					t.Fatalf("%q: %v; group %d, %v", line, err, n, ok)
				}
			}
		}
		_ = m.m.Status(stack.StatusInfo)
		_, err := m.m.ReadAt(context.Background(), make([]byte, 512), 0)
		if err != nil && !errors.Is(err, syscall.EIO) {
			t.Fatalf("read: %v", err)
		}
	})
}

// TestMultipathNoPathNotAccounted: an I/O that finds no usable path is
// killed at map time (drivers/md/dm-mpath.c: multipath_map_bio returns
// DM_MAPIO_KILL), so the device does not count it; one that found a path
// is counted.
func TestMultipathNoPathNotAccounted(t *testing.T) {
	reg, err := stack.NewRegistry(Type)
	if err != nil {
		t.Fatal(err)
	}
	p := newMPDev("p")
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Clock: &clock.Manual{}, Open: stacktest.Opener{"p": p}.Open})
	t.Cleanup(func() { m.Close() })
	d, err := m.Create(stack.CreateOptions{Name: "mp", Minor: -1, Table: "0 1024 multipath 0 0 1 1 round-robin 0 1 1 p 1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.ReadAt(ctx, make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
	p.setFail(syscall.EIO)
	for range 2 { // the first read fails the path, the second finds none
		if _, err := d.ReadAt(ctx, make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
			t.Fatalf("read over a failed path: %v, want EIO", err)
		}
	}
	if got := d.Disk().Snapshot().IOs[stats.GroupRead]; got != 2 {
		t.Errorf("%d reads counted, want 2: the one that found a path, and the one that failed it", got)
	}
}
