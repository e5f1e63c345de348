package stack_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/multipath"
	"github.com/dmfuse/dmfuse/stack"
)

// fuzzMessageEnv creates, in a new manager with dm-stats enabled, a device
// "dd" (dust, zero and linear segments) and a multipath device "mp" over two
// linear paths, all over one backing file.
func fuzzMessageEnv(t testing.TB, img string) *stack.Manager {
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped, stack.Zero, stack.Error, stack.Flakey, stack.Dust, multipath.Type)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, CoreMessage: stack.DMStatsMessage})
	for _, c := range []struct{ name, table string }{
		{"dd", "0 32 dust " + img + " 0 512\n32 32 zero\n64 32 linear " + img + " 64\n96 32 flakey " + img + " 128 1 0"},
		{"p1", "0 64 linear " + img + " 160"},
		{"p2", "0 64 linear " + img + " 160"},
		{"mp", "0 64 multipath 0 0 1 1 round-robin 0 2 1 p1 1 p2 1"},
	} {
		if _, err := m.Create(stack.CreateOptions{Name: c.name, Minor: -1, Table: c.table}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	return m
}

// FuzzManagerMessage sends arbitrary messages to the targets of a device and
// to the dm core (`@stats_...`) through Manager.Message, as `dmfuse message`
// does. It must not panic; a failure must carry an errno; afterwards every
// device's table must still format to text that builds again (messages
// change state, never the table syntax); and a region that @stats_create
// accepts must list as a region that, created again from its listing, lists
// the same.
func FuzzManagerMessage(f *testing.F) {
	for _, s := range []string{
		"addbadblock 3", "removebadblock 3", "queryblock 1", "countbadblocks", "clearbadblocks", "listbadblocks",
		"enable", "disable", "quiet", "fail_path p1", "reinstate_path p1", "switch_group 1", "disable_group 1",
		"enable_group 1", "queue_if_no_path", "fail_if_no_path",
		"@stats_create - /4", "@stats_create 0+100 30 2 precise_timestamps histogram:1000,2000 myprog myaux",
		"@stats_list", "@stats_print 0", "@stats_print_clear 0 0 1", "@stats_delete 0", "@stats_set_aux 0 x",
		"@stats_clear 0", "@cancel", "", "addbadblock\\ 3", "@STATS_CREATE 1+1 1",
	} {
		f.Add(uint8(0), uint64(0), s)
		f.Add(uint8(1), uint64(3), s)
	}
	img := filepath.Join(f.TempDir(), "img")
	if err := os.WriteFile(img, make([]byte, 256*stack.SectorSize), 0o600); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, sector uint64, text string) {
		m := fuzzMessageEnv(t, img)
		defer m.Close()
		name := []string{"dd", "mp", "p1"}[int(which)%3]
		args := stack.SplitArgs(text)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := m.Message(ctx, name, sector, args)
		if err != nil {
			if errno := syscall.Errno(0); !errors.As(err, &errno) {
				t.Fatalf("%q: error %v without an errno", text, err)
			}
			if out != "" && !strings.HasPrefix(strings.ToLower(text), "@") {
				t.Logf("%q: output %q beside error %v", text, out, err)
			}
		}
		for _, d := range m.Devices() {
			tab := d.FormatTable(stack.StatusTable, false)
			_ = d.FormatTable(stack.StatusInfo, false)
			tb, err := m.Build(d, tab, "")
			if err != nil {
				t.Fatalf("after %q to %s: the table of %s, %q, does not build: %v", text, name, d.Name(), tab, err)
			}
			tb.Close()
		}
		if err == nil && len(args) > 0 && strings.EqualFold(args[0], "@stats_create") {
			checkRegionRoundTrip(t, m, name, strings.TrimSpace(out))
		}
	})
}

// checkRegionRoundTrip lists region id of device name, creates a region from
// that listing and checks that it lists the same.
func checkRegionRoundTrip(t *testing.T, m *stack.Manager, name, id string) {
	list := func() map[string]string {
		out, err := m.Message(context.Background(), name, 0, []string{"@stats_list"})
		if err != nil {
			t.Fatalf("@stats_list: %v", err)
		}
		regions := map[string]string{}
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if k, v, ok := strings.Cut(l, ": "); ok {
				regions[k] = v
			}
		}
		return regions
	}
	before := list()
	line, ok := before[id]
	if !ok {
		t.Fatalf("region %s, just created, is not listed: %v", id, before)
	}
	f := strings.Fields(line)
	if len(f) < 4 {
		t.Fatalf("region %s lists as %q", id, line)
	}
	feats := f[4:]
	for _, ft := range feats {
		if ft != "precise_timestamps" && !strings.HasPrefix(ft, "histogram:") {
			return // a program id or aux data with blanks in it: not reparsable from the listing
		}
	}
	// The count of optional arguments is given even when it is 0: a
	// program id that is a number would otherwise be read as the count.
	args := append([]string{"@stats_create", f[0], f[1], strconv.Itoa(len(feats))}, feats...)
	args = append(args, f[2], f[3])
	out, err := m.Message(context.Background(), name, 0, args)
	if err != nil {
		t.Fatalf("region %s listed as %q; creating it again with %q: %v", id, line, args, err)
	}
	if again := list()[strings.TrimSpace(out)]; again != line {
		t.Fatalf("region %s listed as %q; created again with %q it lists as %q", id, line, args, again)
	}
}
