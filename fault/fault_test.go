package fault

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// manual is a clock.Manual with a Clock's Lead and Yield: time moves only
// when the test sets it.
type manual struct{ *clock.Manual }

func (manual) Lead() int64 { return 0 }
func (manual) Yield()      {}

func newClock() manual {
	c := manual{&clock.Manual{}}
	c.Set(1e9)
	return c
}

var bg = context.Background()

// dev is a fault Device over a memory device of size bytes, on a manual
// clock.
func dev(t testing.TB, clk manual, spec string, size int64) (*Device, *stacktest.MemDevice) {
	t.Helper()
	mem := stacktest.NewMemDevice("m", size)
	d, err := NewDevice(mem, spec, delay.NewScheduler(clk))
	if err != nil {
		t.Fatalf("NewDevice(%q): %v", spec, err)
	}
	t.Cleanup(func() { d.Close() })
	return d, mem
}

func read(t testing.TB, d stack.BlockDevice, off, n int64) ([]byte, error) {
	t.Helper()
	p := make([]byte, n)
	_, err := d.ReadAt(bg, p, off)
	return p, err
}

func pattern(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

// TestParseErrors: every refusal names the rule or option and the word at
// fault.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"rule op=read", "rule r0: no action"},
		{"rule op=rd error", `rule r0: "op=rd": unknown op "rd"`},
		{"rule bogus=1 error", `rule r0: "bogus=1": unknown selector or action`},
		{"rule p=1.5 error", `rule r0: "p=1.5": probability "1.5" is not between 0 and 1`},
		{"rule p=0 error", `"p=0": a probability of 0 never fires`},
		{"rule sectors=0+9999 error", `"sectors=0+9999": the range ends at sector 9999, past the device's 2048`},
		{"rule delay=lognormal(2ms,1ms)", `p99 1ms must be at least p50 2ms`},
		{"rule delay=uniform(-1ms,2ms)", `negative duration`},
		{"rule state=9 error", `rule r0: "state=9": no rule moves to state 9`},
		{"rule error drop", `a rule has one action`},
		{"rule error=EWHAT", `unknown errno "EWHAT"`},
		{"rule tear=700 op=write", `tear=UNIT`},
		{"rule name=a error rule name=a drop", `rule a: two rules of that name`},
		{"rule op=read lie", `lie acts on flushes`},
		{"iops=0", `"iops=0"`},
		{"iops=100/50", `the burst "50" must be a rate at least the base`},
		{"seed=x", `"seed=x"`},
		{"preset=gp9", `unknown preset "gp9"`},
		{"preset=gp3:iops=99", `iops 3000-16000`},
		{"wat", `"wat": an option is KEY=VALUE`},
		{"stall=1s/2s", `stall: an episode lasts more than 0 and less than its period`},
		{"rule cycle=0/1s error", `a cycle needs an ON time`},
		{"rule delay=mix(0.5*1ms,0.4*2ms)", `the weights sum to 0.9, not 1`},
	} {
		mem := stacktest.NewMemDevice("m", 2048*512)
		_, err := NewDevice(mem, tc.spec, delay.NewScheduler(newClock()))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// TestSelectors: each selector on its own, counted by the rule's firings.
func TestSelectors(t *testing.T) {
	clk := newClock()
	type io struct {
		op      Op
		off, n  int64
		advance int64 // ns before the I/O
	}
	reads := func(k int) []io {
		var out []io
		for i := 0; i < k; i++ {
			out = append(out, io{OpRead, int64(i%8) * 4096, 4096, 0})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		rule  string
		ios   []io
		fired uint64
	}{
		{"nth", "rule nth=3 count", reads(10), 1},
		{"every", "rule every=3 count", reads(10), 3},
		{"first", "rule first=4 count", reads(10), 4},
		{"after", "rule after=7 count", reads(10), 3},
		{"after and nth", "rule after=2 nth=2 count", reads(10), 1},
		{"op", "rule op=write count", append(reads(3), io{OpWrite, 0, 512, 0}, io{OpFlush, 0, 0, 0}), 1},
		{"fua", "rule op=fua count", []io{{OpWrite, 0, 512, 0}, {OpFUA, 0, 512, 0}}, 1},
		{"flush", "rule op=flush count", []io{{OpFlush, 0, 0, 0}, {OpWrite, 0, 512, 0}}, 1},
		{"sectors", "rule sectors=8+8 count", []io{{OpRead, 0, 4096, 0}, {OpRead, 4096, 512, 0}, {OpRead, 3584, 1024, 0}, {OpRead, 8192, 512, 0}}, 2},
		{"size", "rule size=1K-4K count", []io{{OpRead, 0, 512, 0}, {OpRead, 0, 1024, 0}, {OpRead, 0, 4096, 0}, {OpRead, 0, 8192, 0}}, 2},
		{"window", "rule window=1s-2s count", []io{{OpRead, 0, 512, 500e6}, {OpRead, 0, 512, 600e6}, {OpRead, 0, 512, 600e6}, {OpRead, 0, 512, 600e6}}, 2},
		// on 100 ms, off 300 ms: fires at 0 and 450 ms, not at 150 or 350
		{"cycle", "rule cycle=100ms/300ms count", []io{{OpRead, 0, 512, 0}, {OpRead, 0, 512, 150e6}, {OpRead, 0, 512, 200e6}, {OpRead, 0, 512, 100e6}}, 2},
		{"budget", "rule budget=8K count", reads(4), 2},
		// the second read moves to state 2 after the first rule was looked at
		{"state", "rule state=2 count rule nth=2 goto=2 count", reads(5), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := dev(t, clk, tc.rule, 1<<20)
			for _, x := range tc.ios {
				clk.Set(clk.Nanotime() + x.advance)
				switch x.op {
				case OpRead:
					read(t, d, x.off, x.n)
				case OpWrite:
					d.WriteAt(bg, make([]byte, x.n), x.off)
				case OpFUA:
					d.WriteAt(stack.WithFUA(bg), make([]byte, x.n), x.off)
				case OpFlush:
					d.Flush(bg)
				}
			}
			if got := d.rules.Load().rules[0].fired.Load(); got != tc.fired {
				t.Errorf("fired %d times, want %d (status %s)", got, tc.fired, d.Status())
			}
		})
	}
}

// TestProbability: a rule with p fires on about that share of its matches,
// the same ones on every run with the seed, other ones with another seed;
// adding a rule does not change its draws.
func TestProbability(t *testing.T) {
	run := func(spec string) []uint64 {
		d, _ := dev(t, newClock(), spec, 1<<20)
		var got []uint64
		for i := 0; i < 2000; i++ {
			if _, err := read(t, d, 0, 512); err != nil {
				got = append(got, uint64(i))
			}
		}
		return got
	}
	a := run("seed=7 rule name=x p=10% error")
	if len(a) < 150 || len(a) > 250 {
		t.Errorf("p=10%% fired %d of 2000", len(a))
	}
	if b := run("seed=7 rule name=x p=10% error"); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Error("the same seed gave other faults")
	}
	if b := run("seed=8 rule name=x p=10% error"); fmt.Sprint(a) == fmt.Sprint(b) {
		t.Error("another seed gave the same faults")
	}
	if b := run("seed=7 rule name=y p=50% count rule name=x p=10% error"); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Error("a rule added before changed the draws of x")
	}
}

// TestActions: each action's effect on the data and the caller.
func TestActions(t *testing.T) {
	const size = 1 << 20
	clk := newClock()
	t.Run("error", func(t *testing.T) {
		d, _ := dev(t, clk, "rule op=write error=ENOSPC rule op=read sectors=0+1 error", size)
		if _, err := d.WriteAt(bg, pattern(1, 512), 0); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("write: %v", err)
		}
		if _, err := read(t, d, 0, 512); !errors.Is(err, syscall.EIO) {
			t.Errorf("read: %v", err)
		}
		if _, err := read(t, d, 512, 512); err != nil {
			t.Errorf("read outside: %v", err)
		}
	})
	t.Run("drop", func(t *testing.T) {
		d, mem := dev(t, clk, "rule op=write drop", size)
		if n, err := d.WriteAt(bg, pattern(1, 512), 0); n != 512 || err != nil {
			t.Errorf("write: %d %v", n, err)
		}
		if p, _ := read(t, mem, 0, 512); !bytes.Equal(p, make([]byte, 512)) {
			t.Error("a dropped write was stored")
		}
	})
	t.Run("phantom", func(t *testing.T) {
		d, mem := dev(t, clk, "rule op=write nth=1 phantom", size)
		d.WriteAt(bg, pattern(1, 1024), 0)
		if p, _ := read(t, d, 0, 1024); !bytes.Equal(p, pattern(1, 1024)) {
			t.Error("a phantom write does not read back before the flush")
		}
		if p, _ := read(t, mem, 0, 1024); !bytes.Equal(p, make([]byte, 1024)) {
			t.Error("a phantom write reached the device")
		}
		d.Flush(bg)
		if p, _ := read(t, d, 0, 1024); !bytes.Equal(p, make([]byte, 1024)) {
			t.Error("a phantom write reads back after the flush")
		}
	})
	t.Run("misdirect", func(t *testing.T) {
		d, mem := dev(t, clk, "rule op=write misdirect=+8", size)
		d.WriteAt(bg, pattern(3, 512), 0)
		if p, _ := read(t, mem, 0, 512); !bytes.Equal(p, make([]byte, 512)) {
			t.Error("the intended sector changed")
		}
		if p, _ := read(t, mem, 8*512, 512); !bytes.Equal(p, pattern(3, 512)) {
			t.Error("the write did not land 8 sectors on")
		}
	})
	t.Run("tear", func(t *testing.T) {
		for _, side := range []string{"prefix", "suffix"} {
			d, mem := dev(t, clk, "seed=3 rule op=write tear=512:"+side, size)
			d.WriteAt(bg, pattern(4, 4096), 0)
			p, _ := read(t, mem, 0, 4096)
			kept := bytes.Count(p, []byte{4}) / 512
			if kept < 1 || kept > 7 || bytes.Count(p, []byte{4})%512 != 0 {
				t.Errorf("%s: %d bytes kept", side, bytes.Count(p, []byte{4}))
			}
			if side == "prefix" && p[0] != 4 || side == "suffix" && p[4095] != 4 {
				t.Errorf("%s: the wrong end was kept", side)
			}
			ev := d.Events()
			if len(ev) != 1 || ev[0].Action != "tear=512:"+side {
				t.Errorf("%s: events %v", side, ev)
			}
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		d, mem := dev(t, clk, "rule op=write nth=1 corrupt=byte:10:0xff rule op=read nth=1 corrupt=bits:3", size)
		in := pattern(0, 512)
		d.WriteAt(bg, in, 0)
		if in[10] != 0 {
			t.Error("the caller's buffer was corrupted")
		}
		if p, _ := read(t, mem, 0, 512); p[10] != 0xff {
			t.Errorf("stored byte 10: %#x", p[10])
		}
		p, _ := read(t, d, 0, 512)
		diff := 0
		for i := range p {
			x := p[i] ^ map[bool]byte{true: 0xff, false: 0}[i == 10]
			for ; x != 0; x &= x - 1 {
				diff++
			}
		}
		if diff < 1 || diff > 3 {
			t.Errorf("%d bits flipped, want 1 to 3", diff)
		}
	})
	t.Run("stuck", func(t *testing.T) {
		d, _ := dev(t, clk, "seed=5 rule op=read corrupt=stuck:0.5", size)
		a, _ := read(t, d, 0, 64*512)
		b, _ := read(t, d, 0, 64*512)
		if !bytes.Equal(a, b) {
			t.Error("stuck bits differ between reads")
		}
		bad := 0
		for i := 0; i < 64; i++ {
			if !bytes.Equal(a[i*512:(i+1)*512], make([]byte, 512)) {
				bad++
			}
		}
		if bad < 5 || bad > 40 {
			t.Errorf("%d of 64 sectors read with a stuck bit set, p=0.5 of them stuck (set or cleared)", bad)
		}
	})
	t.Run("stale", func(t *testing.T) {
		d, _ := dev(t, clk, "rule op=read stale=2", size)
		for b := byte(1); b <= 3; b++ {
			d.WriteAt(bg, pattern(b, 512), 0)
		}
		if p, _ := read(t, d, 0, 512); p[0] != 1 {
			t.Errorf("a read from before the last 2 writes got %d, want 1", p[0])
		}
	})
	t.Run("latent", func(t *testing.T) {
		d, _ := dev(t, clk, "rule op=read nth=1 latent=2", size)
		read(t, d, 0, 1024) // marks sectors 0 and 1
		if _, err := read(t, d, 512, 512); !errors.Is(err, syscall.EIO) {
			t.Errorf("read of a latent sector: %v", err)
		}
		for i := 0; i < 2; i++ {
			if _, err := d.WriteAt(bg, pattern(1, 512), 0); !errors.Is(err, syscall.EIO) {
				t.Errorf("write %d to a latent sector: %v", i, err)
			}
		}
		if _, err := d.WriteAt(bg, pattern(1, 512), 0); err != nil {
			t.Errorf("the third write: %v", err)
		}
		if _, err := read(t, d, 0, 512); err != nil {
			t.Errorf("a rewritten sector: %v", err)
		}
		if _, err := read(t, d, 512, 512); !errors.Is(err, syscall.EIO) {
			t.Errorf("the other latent sector: %v", err)
		}
	})
	t.Run("lie", func(t *testing.T) {
		d, mem := dev(t, clk, "rule op=flush nth=2 lie", size)
		d.WriteAt(bg, pattern(1, 512), 0)
		d.Flush(bg) // a true flush
		d.WriteAt(bg, pattern(2, 512), 0)
		d.WriteAt(bg, pattern(3, 512), 512)
		if err := d.Flush(bg); err != nil {
			t.Fatal(err)
		}
		p, _ := read(t, mem, 0, 1024)
		if !bytes.Equal(p, append(pattern(1, 512), make([]byte, 512)...)) {
			t.Errorf("after a lying flush: %x %x", p[0], p[512])
		}
	})
	t.Run("stall", func(t *testing.T) {
		d, _ := dev(t, clk, "rule op=read nth=1 stall", size)
		done := make(chan error)
		go func() { _, err := read(t, d, 0, 512); done <- err }()
		for d.stalled.Load() == 0 {
			select {
			case err := <-done:
				t.Fatalf("a stall for ever returned: %v", err)
			case <-time.After(time.Millisecond):
			}
		}
		if st := strings.Fields(d.Status()); st[4] != "1" {
			t.Errorf("status %q: want 1 stalled", st)
		}
		if _, err := d.Message("release"); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("released read: %v", err)
		}
	})
}

// TestMessages: rule changes answer once in force, a bad one changes
// nothing, state and log answer.
func TestMessages(t *testing.T) {
	d, _ := dev(t, newClock(), "rule name=a op=write count", 1<<20)
	if out, err := d.Message("add rule name=b op=read error"); err != nil || out != "rules 2\n" {
		t.Fatalf("add: %q %v", out, err)
	}
	if _, err := read(t, d, 0, 512); !errors.Is(err, syscall.EIO) {
		t.Errorf("the added rule is not in force: %v", err)
	}
	if _, err := d.Message("rules rule name=c op=read p=2 error"); err == nil || !strings.Contains(err.Error(), `"p=2"`) {
		t.Errorf("a bad rule set: %v", err)
	}
	if _, err := read(t, d, 0, 512); !errors.Is(err, syscall.EIO) {
		t.Error("a refused message changed the rules")
	}
	if _, err := d.Message("remove b"); err != nil {
		t.Fatal(err)
	}
	if _, err := read(t, d, 0, 512); err != nil {
		t.Errorf("after remove: %v", err)
	}
	if out, _ := d.Message("state 2"); out != "state 2\n" {
		t.Errorf("state: %q", out)
	}
	if out, _ := d.Message("log"); !strings.Contains(out, " read 0 1 b error ") {
		t.Errorf("log: %q", out)
	}
	if st := d.Status(); !strings.HasPrefix(st, "2 3 2 0 0 1 a:0:0") {
		t.Errorf("status %q", st)
	}
}

// TestDeterminismAndReplay: the same spec and I/O sequence give the same
// event log twice; a device with the rules but another seed, replaying
// that log, injects the same faults at the same I/O and changes the data
// the same way.
func TestDeterminismAndReplay(t *testing.T) {
	spec := "seed=11 rule name=e op=read p=5% error rule name=t op=write p=5% tear=512 rule name=c op=write p=3% corrupt=random:4 rule name=l op=read p=1% latent=1"
	run := func(spec string) (string, []byte) {
		d, mem := dev(t, newClock(), spec, 1<<20)
		for i := 0; i < 3000; i++ {
			off := int64(i*7919%2048) * 512
			if i%2 == 0 {
				d.WriteAt(bg, pattern(byte(i), 1024+512*(i%4)), off)
			} else {
				read(t, d, off, 512)
			}
		}
		b, _ := read(t, mem, 0, 1<<20)
		return d.EventLog(), b
	}
	l1, b1 := run(spec)
	l2, b2 := run(spec)
	if l1 != l2 || !bytes.Equal(b1, b2) {
		t.Fatal("two runs of one sequence differ")
	}
	if strings.Count(l1, "\n") < 100 {
		t.Fatalf("only %d events", strings.Count(l1, "\n"))
	}
	path := t.TempDir() + "/log"
	if err := writeString(path, l1); err != nil {
		t.Fatal(err)
	}
	l3, b3 := run(strings.Replace(spec, "seed=11", "seed=99 replay="+path, 1))
	if l3 != l1 || !bytes.Equal(b3, b1) {
		t.Errorf("the replay differs from the run")
	}
}

func writeString(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }
