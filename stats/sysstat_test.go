package stats

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// TestSysstatReadsOurFormat runs the real sysstat iostat over a diskstats file
// rendered by AppendDiskstats, bind-mounted over /proc/diskstats in a private
// mount namespace, and checks that it lists every device by name with the
// numbers that do not depend on time (await, request size, merge percentage,
// totals in kB) equal to ours. It skips where iostat or unshare is missing or
// not permitted.
func TestSysstatReadsOurFormat(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if _, err := exec.LookPath("iostat"); err != nil {
		t.Skip("no iostat (sysstat) installed")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	c, d := newFake()
	for _, t0 := range []int64{100, 105, 110, 115} {
		doIO(c, d, ioop.Read, 8, t0, t0+3)
	}
	doIO(c, d, ioop.Write, 16, 300, 302)
	doIO(c, d, ioop.Flush, 0, 302, 303)
	doIO(c, d, ioop.Discard, 2048, 400, 407)
	s := d.Snapshot()
	text := AppendDiskstats(nil, 253, 10, "lin-a", &s)
	text = AppendDiskstats(text, 253, 7, "delay-0.slow", &s)
	sample, err := os.ReadFile(filepath.Join("testdata", "iostat_cur.diskstats"))
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, sample...)
	file := filepath.Join(t.TempDir(), "diskstats")
	if err := os.WriteFile(file, text, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args string) string {
		cmd := exec.Command("unshare", "-m", "sh", "-c",
			`mount --make-rprivate / 2>/dev/null; mount --bind "$0" /proc/diskstats && S_COLORS=never iostat `+args, file)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Skipf("unshare/mount not permitted here: %v: %s", err, out)
		}
		return string(out)
	}
	lines, err := ParseDiskstats(text)
	if err != nil {
		t.Fatal(err)
	}
	ours := IostatRows(nil, lines, 1000)
	want := map[string][]string{}
	wantBasic := map[string][]string{}
	for _, l := range strings.Split(string(AppendIostat(nil, ours, true)), "\n")[1:] {
		if f := strings.Fields(l); len(f) == 23 {
			// %rrqm r_await rareq-sz, %wrqm w_await wareq-sz, %drqm d_await dareq-sz, f_await
			want[f[0]] = []string{f[4], f[5], f[6], f[10], f[11], f[12], f[16], f[17], f[18], f[20]}
		}
	}
	for _, l := range strings.Split(string(AppendIostat(nil, ours, false)), "\n")[1:] {
		if f := strings.Fields(l); len(f) == 8 {
			wantBasic[f[0]] = f[5:8]
		}
	}
	got := map[string][]string{}
	for _, l := range strings.Split(run("-d -x -p ALL"), "\n") {
		if f := strings.Fields(l); len(f) == 23 && f[0] != "Device" {
			got[f[0]] = []string{f[4], f[5], f[6], f[10], f[11], f[12], f[16], f[17], f[18], f[20]}
		}
	}
	gotBasic := map[string][]string{}
	for _, l := range strings.Split(run("-d -p ALL"), "\n") {
		if f := strings.Fields(l); len(f) == 8 && f[0] != "Device" {
			gotBasic[f[0]] = f[5:8]
		}
	}
	if len(want) != len(lines) {
		t.Fatalf("our report has %d devices, want %d", len(want), len(lines))
	}
	for name, w := range want {
		if g := got[name]; strings.Join(g, " ") != strings.Join(w, " ") {
			t.Errorf("iostat -x %s: %v, ours %v", name, g, w)
		}
		if g := gotBasic[name]; strings.Join(g, " ") != strings.Join(wantBasic[name], " ") {
			t.Errorf("iostat %s: %v, ours %v", name, g, wantBasic[name])
		}
	}
}
