package stats

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

func readSample(t *testing.T, name string) []DiskstatsLine {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	lines, err := ParseDiskstats(data)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// Two fixed samples 2 s apart, in both layouts.
func TestIostatGolden(t *testing.T) {
	prev, cur := readSample(t, "iostat_prev.diskstats"), readSample(t, "iostat_cur.diskstats")
	rows := IostatRows(prev, cur, 2)
	golden(t, "iostat_x.golden", AppendIostat(nil, rows, true))
	golden(t, "iostat.golden", AppendIostat(nil, rows, false))
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestIostatRates(t *testing.T) {
	prev, cur := readSample(t, "iostat_prev.diskstats"), readSample(t, "iostat_cur.diskstats")
	rows := IostatRows(prev, cur, 2)
	byName := map[string]IostatRow{}
	for _, r := range rows {
		byName[r.Device] = r
	}
	if len(rows) != 5 || rows[0].Device != "linear0" || rows[4].Device != "sda" {
		t.Fatalf("rows %v", rows)
	}
	d := byName["delay0"]
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"r/s", d.RPS, 200}, {"rkB/s", d.RKBPS, 800}, {"r_await", d.RAwait, 21}, {"rareq-sz", d.RAreqSz, 4},
		{"w/s", d.WPS, 100}, {"wkB/s", d.WKBPS, 6400}, {"w_await", d.WAwait, 20}, {"wareq-sz", d.WAreqSz, 64},
		{"d/s", d.DPS, 1}, {"dkB/s", d.DKBPS, 1024}, {"d_await", d.DAwait, 5}, {"dareq-sz", d.DAreqSz, 1024},
		{"aqu-sz", d.AquSz, 6.2}, {"%util", d.Util, 95}, {"tps", d.TPS, 301},
	} {
		if !near(c.got, c.want) {
			t.Errorf("delay0 %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if d.KBRead != 1600 || d.KBWrtn != 12800 || d.KBDscd != 2048 {
		t.Errorf("delay0 kB %d %d %d", d.KBRead, d.KBWrtn, d.KBDscd)
	}
	// 32-bit time fields wrap; merges and flushes as a real disk has them.
	s := byName["sda"]
	if !near(s.RAwait, 10) || !near(s.Util, 4.75) || !near(s.AquSz, 0.6) ||
		!near(s.RRqmPct, 50.0/150*100) || !near(s.RRqmPS, 25) || !near(s.FPS, 5) || !near(s.FAwait, 3) ||
		!near(s.DRqmPct, 50) {
		t.Errorf("sda %+v", s)
	}
	// A device whose counters went back is counted from zero, as is a new one.
	if a := byName["again"]; !near(a.RPS, 5) || !near(a.Util, 0.25) {
		t.Errorf("again %+v", a)
	}
	if f := byName["fresh"]; !near(f.RPS, 1.5) || !near(f.WPS, 0.5) {
		t.Errorf("fresh %+v", f)
	}
	// The report since boot divides the totals by the uptime.
	first := IostatRows(nil, cur, 100)
	if !near(first[1].RPS, 14) || !near(first[1].Util, 22.9) {
		t.Errorf("since boot %+v", first[1])
	}
	// No interval: no rates, no division by zero.
	for _, r := range IostatRows(prev, cur, 0) {
		if r.RPS != 0 || r.Util != 0 || math.IsNaN(r.RAwait) {
			t.Errorf("zero interval %+v", r)
		}
	}
}

func TestIostatOutputOfOwnFiles(t *testing.T) {
	// The renderer's output parses back to the same numbers, and iostat
	// reads it.
	c, d := newFake()
	for _, t0 := range []int64{100, 105, 110, 115} {
		doIO(c, d, ioop.Read, 8, t0, t0+3)
	}
	s0 := d.Snapshot()
	prev := AppendDiskstats(nil, 253, 0, "lin", &s0)
	for t0 := int64(1000); t0 < 2000; t0 += 10 {
		doIO(c, d, ioop.Write, 8, t0, t0+5)
	}
	s1 := d.Snapshot()
	cur := AppendDiskstats(nil, 253, 0, "lin", &s1)
	p, err := ParseDiskstats(prev)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseDiskstats(cur)
	if err != nil {
		t.Fatal(err)
	}
	if q[0].Fields != s1.Fields() || q[0].Name != "lin" || q[0].Major != 253 {
		t.Fatalf("parsed %+v", q[0])
	}
	r := IostatRows(p, q, 1)[0]
	if r.WPS != 100 || r.WAwait != 5 || r.Util != 50 || r.RPS != 0 || r.AquSz != 0.5 {
		t.Errorf("%+v", r)
	}
}

func TestParseDiskstats(t *testing.T) {
	// The three line lengths of kernel history, tabs, blank lines, no final newline.
	in := "   8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n\n" +
		"8\t1\tsda1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n" +
		" 253       0 x 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 18446744073709551615"
	l, err := ParseDiskstats([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 3 || l[0].Fields[10] != 11 || l[0].Fields[11] != 0 || l[1].Name != "sda1" ||
		l[1].Fields[14] != 15 || l[2].Fields[16] != math.MaxUint64 {
		t.Errorf("%+v", l)
	}
	for _, bad := range []string{
		"8 0 sda 1 2 3",
		"8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12",
		"x 0 sda 1 2 3 4 5 6 7 8 9 10 11",
		"8 4294967296 sda 1 2 3 4 5 6 7 8 9 10 11",
		"8 0 sda 1 2 3 4 5 6 7 8 9 10 -11",
		"8 0 sda 1 2 3 4 5 6 7 8 9 10 18446744073709551616",
	} {
		if _, err := ParseDiskstats([]byte("8 1 ok 1 2 3 4 5 6 7 8 9 10 11\n" + bad + "\n")); err == nil ||
			!strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

// FuzzParseDiskstats: parsing never panics, and what parses renders to text
// that parses to the same lines (and renders the same again).
func FuzzParseDiskstats(f *testing.F) {
	for _, name := range []string{"iostat_prev.diskstats", "iostat_cur.diskstats", "C.diskstats.golden"} {
		if data, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n"))
	f.Add([]byte("\t\n 1 2 a 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines, err := ParseDiskstats(data)
		if err != nil {
			return
		}
		var out []byte
		for i := range lines {
			out = AppendDiskstatsLine(out, &lines[i])
		}
		again, err := ParseDiskstats(out)
		if err != nil {
			t.Fatalf("rendered text does not parse: %v\n%q", err, out)
		}
		if len(again) != len(lines) {
			t.Fatalf("%d lines, then %d", len(lines), len(again))
		}
		for i := range lines {
			if again[i] != lines[i] {
				t.Fatalf("line %d: %+v, then %+v", i, lines[i], again[i])
			}
		}
		var out2 []byte
		for i := range again {
			out2 = AppendDiskstatsLine(out2, &again[i])
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("not stable:\n%q\n%q", out, out2)
		}
		// Rates over any pair of parsed samples are finite.
		for _, r := range IostatRows(lines, lines, 1) {
			if math.IsNaN(r.Util) || math.IsInf(r.AquSz, 0) {
				t.Fatalf("%+v", r)
			}
		}
	})
}

// The report loop: the first report since boot, then one per interval from
// samples taken on a fake clock, Count reports in all.
func TestIostatRun(t *testing.T) {
	c := new(clock.Manual)
	c.Set(int64(time.Hour))
	samples := []string{
		" 253       0 a 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		" 253       0 a 100 0 800 100 0 0 0 0 0 500 100 0 0 0 0 0 0\n",
		" 253       0 a 100 0 800 100 50 0 400 200 1 1500 300 0 0 0 0 0 0\n",
	}
	n := 0
	var slept []time.Duration
	cmd := Iostat{
		Extended: true,
		Interval: time.Second,
		Count:    3,
		Read: func() ([]byte, error) {
			s := samples[n]
			n++
			return []byte(s), nil
		},
		Uptime: func() (time.Duration, error) { return 1000 * time.Second, nil },
		Clock:  c,
		Sleep: func(_ context.Context, d time.Duration) error {
			slept = append(slept, d)
			c.Advance(d)
			return nil
		},
	}
	var out bytes.Buffer
	if err := cmd.Run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if n != 3 || len(slept) != 2 || slept[0] != time.Second {
		t.Errorf("read %d samples, slept %v", n, slept)
	}
	reports := strings.Split(strings.TrimSuffix(out.String(), "\n\n"), "\n\n")
	if len(reports) != 3 {
		t.Fatalf("%d reports:\n%s", len(reports), out.String())
	}
	for i, want := range []string{
		"a                0.00      0.00     0.00   0.00    0.00     0.00    0.00      0.00     0.00   0.00    0.00     0.00    0.00      0.00     0.00   0.00    0.00     0.00    0.00    0.00    0.00   0.00",
		"a              100.00    400.00     0.00   0.00    1.00     4.00    0.00      0.00     0.00   0.00    0.00     0.00    0.00      0.00     0.00   0.00    0.00     0.00    0.00    0.00    0.10  50.00",
		"a                0.00      0.00     0.00   0.00    0.00     0.00   50.00    200.00     0.00   0.00    4.00     4.00    0.00      0.00     0.00   0.00    0.00     0.00    0.00    0.00    0.20 100.00",
	} {
		lines := strings.Split(reports[i], "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "Device            r/s") || lines[1] != want {
			t.Errorf("report %d:\n%s\nwant line\n%s", i, reports[i], want)
		}
	}

	// -y leaves out the report since boot; -z leaves out idle devices; a
	// cancelled context ends the loop without an error.
	n = 0
	cmd.OmitFirst, cmd.OmitIdle, cmd.Count = true, true, 0
	ctx, cancel := context.WithCancel(context.Background())
	cmd.Sleep = func(ctx context.Context, d time.Duration) error {
		if n == 3 {
			cancel()
			return ctx.Err()
		}
		c.Advance(d)
		return nil
	}
	out.Reset()
	if err := cmd.Run(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), "Device"); got != 2 || strings.Count(out.String(), "\na ") != 2 {
		t.Errorf("-y -z:\n%s", out.String())
	}

	// No interval and no report since boot is an error; a read error is returned.
	if err := (&Iostat{OmitFirst: true, Read: func() ([]byte, error) { return []byte(samples[0]), nil }}).Run(context.Background(), &out); err == nil {
		t.Error("no report: no error")
	}
	boom := errors.New("boom")
	if err := (&Iostat{Read: func() ([]byte, error) { return nil, boom }}).Run(context.Background(), &out); !errors.Is(err, boom) {
		t.Errorf("read error: %v", err)
	}
}

func TestParseUptime(t *testing.T) {
	d, err := parseUptime([]byte("350735.47 234388.90\n"))
	if err != nil || d != 350735470*time.Millisecond {
		t.Errorf("%v %v", d, err)
	}
	if _, err := parseUptime([]byte("x")); err == nil {
		t.Error("no error")
	}
}
