package stats

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/ioop"

	"github.com/VictoriaMetrics/metrics"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/dmarg"
)

// transcript runs dm-stats messages on one disk and records each message with
// its response (or its error and errno), for golden files.
type transcript struct {
	t    *testing.T
	d    *Disk
	size uint64
	b    strings.Builder
}

func (tr *transcript) msg(line string) (string, error) {
	tr.t.Helper()
	out, handled, err := tr.d.StatsMessage(strings.Fields(line), tr.size)
	fmt.Fprintf(&tr.b, "> %s\n", line)
	switch {
	case !handled:
		tr.b.WriteString("(not a dm-stats message)\n")
	case err != nil:
		var e syscall.Errno
		errors.As(err, &e)
		fmt.Fprintf(&tr.b, "error %s: %v\n", errnoName(e), err)
	default:
		tr.b.WriteString(out)
		if out != "" && !strings.HasSuffix(out, "\n") {
			tr.b.WriteString("\n")
		}
	}
	return out, err
}

// must runs a message that must succeed with the given output.
func (tr *transcript) must(line, want string) {
	tr.t.Helper()
	out, err := tr.msg(line)
	if err != nil || out != want {
		tr.t.Errorf("%s: got %q, %v; want %q", line, out, err, want)
	}
}

// fails runs a message that must fail with errno want and change nothing.
func (tr *transcript) fails(line string, want syscall.Errno) {
	tr.t.Helper()
	before := tr.d.StatsList("", true)
	_, err := tr.msg(line)
	if !errors.Is(err, want) {
		tr.t.Errorf("%s: got %v, want %v", line, err, want)
	}
	if after := tr.d.StatsList("", true); after != before {
		tr.t.Errorf("%s changed the regions:\n%s\nto\n%s", line, before, after)
	}
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EOVERFLOW:
		return "EOVERFLOW"
	case syscall.ENOMEM:
		return "ENOMEM"
	case syscall.ENFILE:
		return "ENFILE"
	}
	return fmt.Sprint(int(e))
}

// pieceIO runs one piece of sectors at sector from startNs to endNs on the
// fake clock.
func pieceIO(c *clock.Manual, d *Disk, op ioop.Op, sector, sectors uint64, startNs, endNs int64) {
	c.Set(startNs)
	r := d.StartAt(op, startNs, int64(sector*512), int64(sectors*512))
	c.Set(endNs)
	d.DoneAt(op, sectors, startNs, r)
}

// TestDMStatsWorkedExample drives regions through the messages of
// drivers/md/dm-stats.c (dm_stats_message) on a device of 2048 sectors and
// checks each answer, byte for byte.
func TestDMStatsWorkedExample(t *testing.T) {
	c, d := newFake()
	tr := &transcript{t: t, d: d, size: 2048}
	tr.must("@stats_create - /4", "0")
	tr.must("@stats_list", "0: 0+2048 512 - -\n")
	tr.must("@stats_create 0+100 30 2 precise_timestamps histogram:1000,2000 myprog myaux", "1")
	tr.must("@stats_list", "0: 0+2048 512 - -\n1: 0+100 30 myprog myaux precise_timestamps histogram:1000,2000\n")
	tr.must("@stats_list myprog", "1: 0+100 30 myprog myaux precise_timestamps histogram:1000,2000\n")
	tr.must("@stats_list other", "")
	tr.must("@stats_print 1", "0+30 0 0 0 0 0 0 0 0 0 0 0 0 0 0:0:0\n30+30 0 0 0 0 0 0 0 0 0 0 0 0 0 0:0:0\n"+
		"60+30 0 0 0 0 0 0 0 0 0 0 0 0 0 0:0:0\n90+30 0 0 0 0 0 0 0 0 0 0 0 0 0 0:0:0\n")

	// One 8-sector read at sector 0 taking 2 ms: not merged. Before the
	// first piece the kernel's last position is sector ULLONG_MAX, not a
	// write (dm_stats_init), so "a previous bio ended at a non-zero sector
	// in the same direction" is true for a read, and merged needs sector 1.
	pieceIO(c, d, ioop.Read, 0, 8, msNs(100), msNs(102))
	tr.must("@stats_print 0 0 1", "0+512 1 0 8 2 0 0 0 0 0 2 2 2 0\n")
	// Region 1 is precise: 2 ms = 2,000,000 ns, in the last histogram bucket.
	tr.must("@stats_print 1 0 1", "0+30 1 0 8 2000000 0 0 0 0 0 2000000 2000000 2000000 0 0:0:1\n")

	// An 8-sector read at sector 508 is counted in areas 0 and 1 with 4
	// sectors each; the previous read ended at sector 8 (non-zero, same
	// direction), so "merged" needs sector 1: not merged.
	pieceIO(c, d, ioop.Read, 508, 8, msNs(110), msNs(111))
	tr.must("@stats_print 0 - 2", "0+512 2 0 12 3 0 0 0 0 0 3 3 3 0\n512+512 1 0 4 1 0 0 0 0 0 1 1 1 0\n")
	tr.fails("@stats_create 10+0 1", syscall.EINVAL)
	tr.fails("@stats_create - 0", syscall.EINVAL)
	tr.fails("@stats_delete 7", syscall.ENOENT)
	tr.must("@stats_delete 0", "")
	tr.must("@stats_create - 1", "0")
	tr.must("@stats_list", "0: 0+2048 1 - -\n1: 0+100 30 myprog myaux precise_timestamps histogram:1000,2000\n")
	golden(t, "dmstats/worked.golden", []byte(tr.b.String()))
}

// TestDMStatsMergeStart checks the merged columns from a device's first
// piece on. dm_stats_init starts the kernel's last position at sector
// ULLONG_MAX with direction UINT_MAX: non-zero, and not a write, as after a
// read. With the kernel's test
//
//	bi_sector == (last_sector && (rw == WRITE) == (last_rw == WRITE))
//
// a first read is merged at sector 1 and a first write at sector 0. The last
// position belongs to the device: deleting every region does not reset it.
func TestDMStatsMergeStart(t *testing.T) {
	type piece struct {
		op     ioop.Op
		sector uint64
	}
	merges := func(d *Disk) (r, w string) {
		out, err := d.StatsPrint(0, 0, 1, false)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(out)
		return f[2], f[6]
	}
	for _, c := range []struct {
		name   string
		pieces []piece
		r, w   string // read and write merges
	}{
		{"read at 1", []piece{{ioop.Read, 1}}, "1", "0"},
		{"read at 0", []piece{{ioop.Read, 0}}, "0", "0"},
		{"write at 0", []piece{{ioop.Write, 0}}, "0", "1"},
		{"write at 1", []piece{{ioop.Write, 1}}, "0", "0"},
		{"read at 1 twice", []piece{{ioop.Read, 1}, {ioop.Read, 1}}, "2", "0"},
		{"write at 5 then read at 0", []piece{{ioop.Write, 5}, {ioop.Read, 0}}, "1", "0"},
		{"discard at 0", []piece{{ioop.Discard, 0}}, "0", "1"},
	} {
		c0, d := newFake()
		if _, err := d.StatsCreate(RegionSpec{Len: 2048, Step: 2048, ProgramID: "-", Aux: "-"}); err != nil {
			t.Fatal(err)
		}
		for i, p := range c.pieces {
			pieceIO(c0, d, p.op, p.sector, 8, msNs(int64(10*i+10)), msNs(int64(10*i+11)))
		}
		if r, w := merges(d); r != c.r || w != c.w {
			t.Errorf("%s: merged reads %s, writes %s; want %s, %s", c.name, r, w, c.r, c.w)
		}
		d.StatsDeleteAll()
	}

	// A write, then every region deleted and one created: the device still
	// remembers the write, so a write at sector 1 is merged.
	c0, d := newFake()
	spec := RegionSpec{Len: 2048, Step: 2048, ProgramID: "-", Aux: "-"}
	if _, err := d.StatsCreate(spec); err != nil {
		t.Fatal(err)
	}
	pieceIO(c0, d, ioop.Write, 100, 8, msNs(10), msNs(11))
	if err := d.StatsDelete(0); err != nil {
		t.Fatal(err)
	}
	// Pieces while no region exists do not move the last position (the
	// kernel accounts nothing for dm-stats then).
	pieceIO(c0, d, ioop.Read, 100, 8, msNs(20), msNs(21))
	if _, err := d.StatsCreate(spec); err != nil {
		t.Fatal(err)
	}
	pieceIO(c0, d, ioop.Write, 1, 8, msNs(30), msNs(31))
	if r, w := merges(d); r != "0" || w != "1" {
		t.Errorf("after delete and create: merged reads %s, writes %s; want 0, 1", r, w)
	}
}

// TestDMStatsRounding checks io_ticks, time_in_queue, the read and write
// busy columns and in-flight against hand-computed values (ms region).
func TestDMStatsRounding(t *testing.T) {
	c, d := newFake()
	tr := &transcript{t: t, d: d, size: 2048}
	tr.must("@stats_create - 1024", "0")
	// R1 [100,110) and W1 [105,120) overlap from 105 to 110; a print at 107
	// sees both in flight.
	c.Set(msNs(100))
	r1 := d.StartAt(ioop.Read, msNs(100), 0, 4096)
	c.Set(msNs(105))
	w1 := d.StartAt(ioop.Write, msNs(105), 8192, 4096)
	c.Set(msNs(107))
	// 100..105: 1 in flight (5 ticks, tiq 5, read busy 5); 105..107: 2 in
	// flight (2 ticks, tiq 4, read 2, write 2).
	tr.must("@stats_print 0", "0+1024 0 0 0 0 0 0 0 0 2 7 9 7 2\n1024+1024 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
	c.Set(msNs(110))
	d.DoneAt(ioop.Read, 8, msNs(100), r1)
	c.Set(msNs(120))
	d.DoneAt(ioop.Write, 8, msNs(105), w1)
	// 107..110: 2 in flight (3, tiq 6, r 3, w 3); 110..120: write only.
	tr.must("@stats_print 0 0 1", "0+1024 1 0 8 10 1 0 8 15 0 20 25 10 15\n")
	// A clear keeps nothing but in-flight; a print_clear prints then clears.
	c.Set(msNs(130))
	r2 := d.StartAt(ioop.Read, msNs(130), 1024*512, 512)
	c.Set(msNs(131))
	tr.must("@stats_print_clear 0 1 1", "1024+1024 0 0 0 0 0 0 0 0 1 1 1 1 0\n")
	tr.must("@stats_print 0 1 1", "1024+1024 0 0 0 0 0 0 0 0 1 0 0 0 0\n")
	c.Set(msNs(133))
	d.DoneAt(ioop.Read, 1, msNs(130), r2)
	tr.must("@stats_print 0 1 1", "1024+1024 1 0 1 3 0 0 0 0 0 2 2 2 0\n")
	tr.must("@stats_clear 0", "")
	tr.must("@stats_print 0", "0+1024 0 0 0 0 0 0 0 0 0 0 0 0 0\n1024+1024 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
	// An empty flush is not counted.
	pieceIO(c, d, ioop.Flush, 0, 0, msNs(140), msNs(141))
	tr.must("@stats_print 0 0 1", "0+1024 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
	golden(t, "dmstats/rounding.golden", []byte(tr.b.String()))
	if s := d.Snapshot(); s.IOs[GroupRead] != 2 || s.IOs[GroupWrite] != 2 {
		t.Errorf("diskstats counts %v, want 2 reads and 2 writes (the flush included)", s.IOs)
	}
}

// TestDMStatsAreas checks area boundaries, a region not at sector 0, I/O
// partly outside a region, and the +step of a short last area.
func TestDMStatsAreas(t *testing.T) {
	c, d := newFake()
	tr := &transcript{t: t, d: d, size: 2048}
	tr.must("@stats_create 10+100 30", "0")
	tr.must("@stats_create 0+100 /3", "1") // step ceil(100/3) = 34
	tr.must("@stats_create 0+5 /10", "2")  // step ceil(5/10) = 1
	tr.must("@stats_list", "0: 10+100 30 - -\n1: 0+100 34 - -\n2: 0+5 1 - -\n")
	// Sectors [0,50): region 0 gets [10,40) and [40,50); region 1 [0,34) and [34,50).
	pieceIO(c, d, ioop.Write, 0, 50, msNs(10), msNs(12))
	// Sectors [105,200): region 0 gets only [105,110), printed as 100+30.
	pieceIO(c, d, ioop.Write, 105, 95, msNs(20), msNs(21))
	// Sectors [39,41): one sector on each side of a boundary.
	pieceIO(c, d, ioop.Read, 39, 2, msNs(30), msNs(30))
	// The first write starts at sector 0 with no previous piece: merged (the
	// kernel's quirk), in every area it touches.
	tr.must("@stats_print 0", "10+30 1 0 1 0 1 1 30 2 0 2 2 0 2\n40+30 1 0 1 0 1 1 10 2 0 2 2 0 2\n"+
		"70+30 0 0 0 0 0 0 0 0 0 0 0 0 0\n100+30 0 0 0 0 1 0 5 1 0 1 1 0 1\n")
	tr.must("@stats_print 1", "0+34 0 0 0 0 1 1 34 2 0 2 2 0 2\n34+34 1 0 2 0 1 1 16 2 0 2 2 0 2\n68+34 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
	tr.must("@stats_print 2 3 -", "3+1 0 0 0 0 1 1 1 2 0 2 2 0 2\n4+1 0 0 0 0 1 1 1 2 0 2 2 0 2\n")
	tr.must("@stats_print 2 4 100", "4+1 0 0 0 0 1 1 1 2 0 2 2 0 2\n")
	tr.must("@stats_print 2 9 1", "")
	tr.must("@stats_print 2 0 0", "")
	golden(t, "dmstats/areas.golden", []byte(tr.b.String()))
}

// TestDMStatsHistogram checks bucket edges in ns and in ms.
func TestDMStatsHistogram(t *testing.T) {
	c, d := newFake()
	tr := &transcript{t: t, d: d, size: 64}
	tr.must("@stats_create - 64 2 precise_timestamps histogram:1000,2000,3000", "0")
	tr.must("@stats_create - 64 1 histogram:1,5", "1")
	base := int64(10 * time.Second)
	for _, ns := range []int64{0, 999, 1000, 1999, 2000, 2999, 3000, 1 << 40} {
		pieceIO(c, d, ioop.Read, 1, 1, base, base+ns)
		base += int64(time.Hour)
	}
	// In ticks, on the ms region, starting at whole ms: 0, 1, 4, 5, 6 ms.
	for _, ms := range []int64{0, 1, 4, 5, 6} {
		pieceIO(c, d, ioop.Write, 2, 1, base, base+msNs(ms))
		base += int64(time.Hour)
	}
	// A piece from 0.9 ms to 1.1 ms crosses a tick: 1 tick.
	pieceIO(c, d, ioop.Write, 2, 1, base+900_000, base+1_100_000)
	h0, _ := tr.msg("@stats_print 0")
	// Reads: 0 and 999 ns in bucket 0, 1000 and 1999 in 1, 2000 and 2999 in
	// 2, 3000 and 2^40 in 3; writes: 0 in bucket 0, the other five in 3.
	if got := h0[strings.LastIndexByte(h0, ' ')+1:]; got != "3:2:2:7\n" {
		t.Errorf("precise histogram %q, want 3:2:2:7", got)
	}
	h1, _ := tr.msg("@stats_print 1")
	// Reads: seven of 0 ticks, 2^40 ns in bucket 2; writes: 0 | 1, 4, and
	// the tick-crossing one | 5, 6.
	if got := h1[strings.LastIndexByte(h1, ' ')+1:]; got != "8:3:3\n" {
		t.Errorf("ms histogram %q, want 8:3:3", got)
	}
	golden(t, "dmstats/histogram.golden", []byte(tr.b.String()))
}

// TestDMStatsErrors checks that bad messages fail with the kernel's errno and
// change nothing.
func TestDMStatsErrors(t *testing.T) {
	_, d := newFake()
	tr := &transcript{t: t, d: d, size: 2048}
	tr.must("@stats_create - /2 p a", "0")
	for _, c := range []struct {
		line  string
		errno syscall.Errno
	}{
		{"@stats_create", syscall.EINVAL},
		{"@stats_create -", syscall.EINVAL},
		{"@stats_create 10+0 1", syscall.EINVAL},
		{"@stats_create 10 1", syscall.EINVAL},
		{"@stats_create 10+ 1", syscall.EINVAL},
		{"@stats_create +10 1", syscall.EINVAL},
		{"@stats_create 1+-1 1", syscall.EINVAL},
		{"@stats_create 18446744073709551615+1 1", syscall.EINVAL},
		{"@stats_create - 0", syscall.EINVAL},
		{"@stats_create - /0", syscall.EINVAL},
		{"@stats_create - /", syscall.EINVAL},
		{"@stats_create - x", syscall.EINVAL},
		{"@stats_create - 1x", syscall.EINVAL},
		{"@stats_create - 1 1", syscall.EINVAL},
		{"@stats_create - 1 2 precise_timestamps", syscall.EINVAL},
		{"@stats_create - 1 1 bogus", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:0", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:5,5", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:5,4", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:1,", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:1x", syscall.EINVAL},
		{"@stats_create - 1 1 histogram:-1", syscall.EINVAL},
		{"@stats_create - 1 2 histogram:1 histogram:2", syscall.EINVAL},
		{"@stats_create - 1 prog aux extra", syscall.EINVAL},
		{"@stats_create 0+8388609 1", syscall.EOVERFLOW},
		{"@stats_delete", syscall.EINVAL},
		{"@stats_delete 0 1", syscall.EINVAL},
		{"@stats_delete -1", syscall.EINVAL},
		{"@stats_delete x", syscall.EINVAL},
		{"@stats_delete 2147483648", syscall.EINVAL},
		{"@stats_delete 1", syscall.ENOENT},
		{"@stats_clear 1", syscall.ENOENT},
		{"@stats_clear", syscall.EINVAL},
		{"@stats_list a b", syscall.EINVAL},
		{"@stats_print", syscall.EINVAL},
		{"@stats_print 0 1", syscall.EINVAL},
		{"@stats_print 0 1 2 3", syscall.EINVAL},
		{"@stats_print 0 x -", syscall.EINVAL},
		{"@stats_print 0 - -1", syscall.EINVAL},
		{"@stats_print 1", syscall.ENOENT},
		{"@stats_print_clear 1 - -", syscall.ENOENT},
		{"@stats_set_aux 0", syscall.EINVAL},
		{"@stats_set_aux 0 a b", syscall.EINVAL},
		{"@stats_set_aux 1 a", syscall.ENOENT},
	} {
		tr.fails(c.line, c.errno)
	}
	saved := memLimit
	memLimit = func() uint64 { return 1 << 10 }
	tr.fails("@stats_create - 1", syscall.ENOMEM)
	memLimit = saved
	if _, handled, _ := d.StatsMessage([]string{"@cancel_deferred_remove"}, 1); handled {
		t.Error("@cancel_deferred_remove taken for a dm-stats message")
	}
	tr.must("@STATS_SET_AUX 0 new_aux", "")
	tr.must("@Stats_List", "0: 0+2048 1024 p new_aux\n")
	tr.must("@stats_create 5+1 1 0 7", "1")
	tr.must("@stats_create 5+1 1 1 PRECISE_TIMESTAMPS", "2")
	tr.must("@stats_list 7", "1: 5+1 1 7 -\n")
	tr.must("@stats_list -", "2: 5+1 1 - - precise_timestamps\n")
	golden(t, "dmstats/errors.golden", []byte(tr.b.String()))
}

// TestDMStatsNumberRules checks that message numbers are read as
// dm-stats.c reads them, with sscanf: leading white space is skipped, no '+'
// is taken, a region id may be "-0", and a number too large for its type
// wraps instead of being refused.
func TestDMStatsNumberRules(t *testing.T) {
	_, d := newFake()
	tr := &transcript{t: t, d: d, size: 2048}
	split := func(line string) []string { return strings.Split(line, "|") } // keeps spaces inside words
	run := func(line string) (string, error) {
		out, _, err := d.StatsMessage(split(line), 2048)
		return out, err
	}
	for _, c := range []struct {
		line, out string // out "" with errno set: refused
		errno     syscall.Errno
	}{
		// "%llu+%llu%c": start wraps modulo 2^64.
		{"@stats_create|18446744073709551621+3|1", "0", 0},
		{"@stats_create|99999999999999999999+1|1", "1", 0},
		{"@stats_create| 7+1|1", "2", 0},
		{"@stats_create|7+ 1|1", "3", 0},
		{"@stats_create|7+1 |1", "", syscall.EINVAL},
		{"@stats_create|+7+1|1", "", syscall.EINVAL},
		{"@stats_create|7++1|1", "", syscall.EINVAL},
		// "/%u%c": the divisor wraps to 32 bits.
		{"@stats_create|-|/4294967298", "4", 0},
		{"@stats_create|-|/4294967296", "", syscall.EINVAL},
		{"@stats_create|-|/+2", "", syscall.EINVAL},
		// "%llu%c" step.
		{"@stats_create|0+8|18446744073709551617", "5", 0},
		{"@stats_create|0+8|18446744073709551616", "", syscall.EINVAL},
		{"@stats_create|0+8|+1", "", syscall.EINVAL},
		// "%u%c" option count: 2^32 is 0 options; "+1" is a program id.
		{"@stats_create|0+8|8|4294967296|prog", "6", 0},
		{"@stats_create|0+8|8|+1", "7", 0},
		// Histogram boundaries: "%llu%c" each.
		{"@stats_create|0+8|8|1|histogram:18446744073709551617,2", "8", 0},
		{"@stats_create|0+8|8|1|histogram:+1", "", syscall.EINVAL},
		// "%d%c" region ids.
		{"@stats_set_aux|-0|zero", "", 0},
		{"@stats_set_aux|+0|x", "", syscall.EINVAL},
		{"@stats_set_aux| 1|one", "", 0},
		{"@stats_set_aux|4294967298|two", "", 0},
		{"@stats_set_aux|-4294967293|three", "", 0},
		{"@stats_delete|2147483648", "", syscall.EINVAL},
		// "%lu%c" print lines.
		{"@stats_print|4| 1|18446744073709551617", "1024+1024 0 0 0 0 0 0 0 0 0 0 0 0 0\n", 0},
		{"@stats_print|4|+1|1", "", syscall.EINVAL},
		{"@stats_print|4|1|-1", "", syscall.EINVAL},
	} {
		out, err := run(c.line)
		fmt.Fprintf(&tr.b, "> %q\n", c.line)
		if err != nil {
			fmt.Fprintf(&tr.b, "error: %v\n", err)
		} else {
			fmt.Fprintf(&tr.b, "%s\n", out)
		}
		if c.errno != 0 {
			if !errors.Is(err, c.errno) {
				t.Errorf("%q: %q, %v; want %v", c.line, out, err, c.errno)
			}
			continue
		}
		if err != nil || out != c.out {
			t.Errorf("%q: %q, %v; want %q", c.line, out, err, c.out)
		}
	}
	tr.must("@stats_list", "0: 5+3 1 - zero\n1: 7766279631452241919+1 1 - one\n2: 7+1 1 - two\n3: 7+1 1 - three\n"+
		"4: 0+2048 1024 - -\n5: 0+8 1 - -\n6: 0+8 8 prog -\n7: 0+8 8 +1 -\n8: 0+8 8 - - histogram:1,2\n")
	golden(t, "dmstats/numbers.golden", []byte(tr.b.String()))
}

// TestDMStatsZeroCost checks that the accounting path allocates nothing,
// with or without regions, and that deleting the last region brings back the
// no-region path.
func TestDMStatsZeroCost(t *testing.T) {
	c, d := newFake()
	run := func() {
		c.Advance(1000)
		r := d.StartAt(ioop.Read, c.Nanotime(), 4096, 4096)
		c.Advance(1000)
		d.DoneAt(ioop.Read, 8, c.Nanotime()-1000, r)
	}
	if r := d.StartAt(ioop.Read, 0, 0, 512); r != (RegionRef{}) {
		t.Fatalf("StartAt without regions returned %+v", r)
	}
	d.Done(ioop.Read, 1, 0)
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("%v allocations per piece without regions", n)
	}
	id, err := d.StatsCreate(RegionSpec{Len: 2048, Step: 1, Bounds: []uint64{1, 2}, ProgramID: "-", Aux: "-"})
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("%v allocations per piece with a region", n)
	}
	if err := d.StatsDelete(id); err != nil {
		t.Fatal(err)
	}
	if d.HasRegions() {
		t.Error("regions left after deleting the last one")
	}
}

// TestDMStatsStartedBefore checks that a piece started before a region was
// created is not counted in it, so in-flight never goes negative.
func TestDMStatsStartedBefore(t *testing.T) {
	c, d := newFake()
	r := d.StartAt(ioop.Write, 0, 0, 4096)
	if _, err := d.StatsCreate(RegionSpec{Len: 8, Step: 8, ProgramID: "-", Aux: "-"}); err != nil {
		t.Fatal(err)
	}
	c.Set(msNs(5))
	d.DoneAt(ioop.Write, 8, 0, r)
	out, _ := d.StatsPrint(0, 0, 1, false)
	if out != "0+8 0 0 0 0 0 0 0 0 0 0 0 0 0\n" {
		t.Errorf("got %q", out)
	}
}

// TestDMStatsConcurrent runs pieces on many goroutines while regions are
// created, printed, cleared and deleted; run with -race. At the end, with no
// I/O in flight, every area shows 0 in flight and the counts add up.
func TestDMStatsConcurrent(t *testing.T) {
	c, d := newFake()
	if _, err := d.StatsCreate(RegionSpec{Len: 4096, Step: 64, Bounds: []uint64{1, 2, 3}, ProgramID: "-", Aux: "-"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	const workers, per = 8, 2000
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				off := int64((w*per+i)*37%4000) * 512
				s := c.Advance(100_000)
				r := d.StartAt(ioop.Op(i%3), s, off, 8*512)
				d.DoneAt(ioop.Op(i%3), 8, s, r)
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			id, err := d.StatsCreate(RegionSpec{Start: uint64(i), Len: 1000, Step: 10, ProgramID: "x", Aux: "-"})
			if err != nil {
				t.Error(err)
				return
			}
			d.StatsPrint(0, 0, ^uint64(0), i%2 == 0)
			d.StatsList("x", false)
			if err := d.StatsDelete(id); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	out, err := d.StatsPrint(0, 0, ^uint64(0), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if f := strings.Fields(l); f[9] != "0" {
			t.Errorf("in flight after the end: %s", l)
		}
	}
}

// FuzzStatsMessage feeds arbitrary words to the dm-stats message parser. No
// input may panic; a failed message changes nothing; a created region lists
// as a line that creates the same region again.
func FuzzStatsMessage(f *testing.F) {
	for _, s := range []string{
		"@stats_create - /4", "@stats_create 0+100 30 2 precise_timestamps histogram:1000,2000 myprog myaux",
		"@stats_create 10+0 1", "@stats_print 0 - 2", "@stats_print_clear 0 1 1", "@stats_list myprog",
		"@stats_set_aux 0 x", "@stats_delete 0", "@stats_clear 0", "@stats_create - 1 1 histogram:1,",
		"@stats_create 18446744073709551621+3 1", "@stats_create - /4294967298", "@stats_create 0+8 8 4294967296 p",
		"@stats_delete -0", "@stats_delete +0", "@stats_delete 4294967296", "@stats_print 0 +1 1",
		"@stats_create 0+8 8 1 histogram:18446744073709551617",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		_, d := newFake()
		if _, err := d.StatsCreate(RegionSpec{Len: 100, Step: 10, ProgramID: "-", Aux: "-"}); err != nil {
			t.Fatal(err)
		}
		defer d.StatsDeleteAll()
		args := strings.Fields(line)
		before := d.StatsList("", true)
		out, handled, err := d.StatsMessage(args, 2048)
		if !handled || len(args) == 0 {
			return
		}
		// A region id is sscanf "%d%c" and not negative: anything else is
		// EINVAL, and only that.
		if len(args) == 2 && (strings.EqualFold(args[0], "@stats_delete") || strings.EqualFold(args[0], "@stats_clear")) {
			id, ok := dmarg.Int32(args[1])
			if errors.Is(err, syscall.EINVAL) != (!ok || id < 0) {
				t.Fatalf("%q: %v; %%d%%c reads %d, %v", line, err, id, ok)
			}
		}
		if err != nil {
			if after := d.StatsList("", true); after != before {
				t.Fatalf("%q failed (%v) but changed the regions", line, err)
			}
			return
		}
		if strings.EqualFold(args[0], "@stats_create") {
			list := d.StatsList("", true)
			var got string
			for _, l := range strings.Split(list, "\n") {
				if strings.HasPrefix(l, out+": ") {
					got = l
				}
			}
			// Re-create it from its listed form on a fresh disk.
			f := strings.Fields(strings.TrimPrefix(got, out+": "))
			words := []string{"@stats_create", f[0], f[1]}
			opts := f[4:]
			words = append(words, fmt.Sprint(len(opts)))
			words = append(words, opts...)
			words = append(words, f[2], f[3])
			_, d2 := newFake()
			defer d2.StatsDeleteAll()
			if _, _, err := d2.StatsMessage(words, 2048); err != nil {
				t.Fatalf("listed %q does not create again: %v", got, err)
			}
			if again := d2.StatsList("", true); again != "0: "+strings.TrimPrefix(got, out+": ")+"\n" {
				t.Fatalf("round trip: %q became %q", got, again)
			}
		}
	})
}

// TestDMStatsPrometheus checks the region histograms in the Prometheus text
// format, and that they reach metrics.WritePrometheus while registered.
func TestDMStatsPrometheus(t *testing.T) {
	c, d := newFake()
	tr := &transcript{t: t, d: d, size: 2048}
	tr.must("@stats_create - /4 1 histogram:1,5 ms", "0")
	tr.must("@stats_create 0+8 8 2 precise_timestamps histogram:1000,2000 ns", "1")
	tr.must("@stats_create - 1024", "2")                     // no histogram: not exported
	pieceIO(c, d, ioop.Read, 0, 8, msNs(10), msNs(10)+500)   // 0 ms, 500 ns
	pieceIO(c, d, ioop.Write, 4, 8, msNs(20), msNs(20)+1500) // 0 ms, 1500 ns
	pieceIO(c, d, ioop.Read, 600, 8, msNs(30), msNs(33))     // 3 ms
	pieceIO(c, d, ioop.Read, 510, 4, msNs(40), msNs(50))     // 10 ms, two areas
	var b strings.Builder
	WriteRegionHistograms(&b, []Named{{Name: "z", Disk: NewDisk(c)}, {Name: "dev", Disk: d}})
	golden(t, "dmstats/prom.golden", []byte(b.String()))
	for _, want := range []string{
		`dmfuse_dmstats_region_latency_seconds_bucket{device="dev",region="0",program_id="ms",le="0"} 2` + "\n",
		`dmfuse_dmstats_region_latency_seconds_bucket{device="dev",region="0",program_id="ms",le="0.004"} 3` + "\n",
		`dmfuse_dmstats_region_latency_seconds_count{device="dev",region="0",program_id="ms"} 5` + "\n",
		`dmfuse_dmstats_region_latency_seconds_bucket{device="dev",region="1",program_id="ns",le="9.99e-07"} 1` + "\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), `region="2"`) {
		t.Error("a region without histogram was exported")
	}
	set := RegionHistograms(func() []Named { return []Named{{Name: "dev", Disk: d}} })
	var all bytes.Buffer
	metrics.WritePrometheus(&all, false)
	if strings.Contains(all.String(), RegionHistogramName) {
		t.Error("region histograms written before their set was registered")
	}
	metrics.RegisterSet(set)
	all.Reset()
	metrics.WritePrometheus(&all, false)
	metrics.UnregisterSet(set, true)
	if !strings.Contains(all.String(), `program_id="ns"`) {
		t.Error("registered region histograms missing from metrics.WritePrometheus")
	}
	all.Reset()
	metrics.WritePrometheus(&all, false)
	if strings.Contains(all.String(), RegionHistogramName) {
		t.Error("region histograms still written after unregister")
	}
}
