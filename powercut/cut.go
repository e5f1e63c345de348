package powercut

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"

	"github.com/dmfuse/dmfuse/internal/junk"
	"github.com/dmfuse/dmfuse/stack"
)

// cutSpec is a power_cut message: the mode, the seed and the options.
type cutSpec struct {
	mode  string // all, random, torn, subset or sector
	seed  uint64
	unit  int64  // tear unit of torn and sector, bytes
	fill  string // old, zero or junk
	clean float64
	opts  bool // options were given: the reply names them
}

// parseCut reads the arguments after power_cut: mode "all" for none, else
// a mode, an optional seed (picked at random when missing) and options.
func parseCut(args []string) (cutSpec, error) {
	c := cutSpec{mode: "all", unit: stack.SectorSize, fill: "old"}
	if len(args) == 0 {
		return c, nil
	}
	switch m := strings.ToLower(args[0]); m {
	case "random", "torn", "subset", "sector":
		c.mode = m
	default:
		return c, msgError("power_cut %s: unknown mode (want random, torn, subset or sector)", args[0])
	}
	args = args[1:]
	c.seed = rand.Uint64()
	if len(args) > 0 && !strings.Contains(args[0], "=") {
		seed, err := stack.ParseUint64(args[0])
		if err != nil {
			return c, msgError("power_cut %s %s: invalid seed (want an unsigned 64-bit decimal)", c.mode, args[0])
		}
		c.seed = seed
		args = args[1:]
	}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return c, msgError("power_cut %s: too many arguments", c.mode)
		}
		c.opts = true
		switch strings.ToLower(k) {
		case "unit":
			u, err := strconv.ParseInt(v, 10, 64)
			if err != nil || u < stack.SectorSize || u > 1<<20 || bits.OnesCount64(uint64(u)) != 1 {
				return c, msgError("power_cut %s: unit=%s: want a power of two from 512 to 1048576", c.mode, v)
			}
			if c.mode != "torn" && c.mode != "sector" {
				return c, msgError("power_cut %s: unit= goes with torn and sector", c.mode)
			}
			c.unit = u
		case "fill":
			switch v {
			case "old", "zero", "junk":
				c.fill = v
			default:
				return c, msgError("power_cut %s: fill=%s: want old, zero or junk", c.mode, v)
			}
		case "clean":
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || !(p >= 0 && p <= 1) {
				return c, msgError("power_cut %s: clean=%s: want a probability from 0 to 1", c.mode, v)
			}
			c.clean = p
		default:
			return c, msgError("power_cut %s: unknown option %q (want unit=, fill= or clean=)", c.mode, k)
		}
	}
	return c, nil
}

// cut switches the power off: the cache is emptied, what survives c is
// written to the device (and what c's fill puts in place of what is lost),
// and every I/O fails from now on.
func (p *powercut) cut(ctx context.Context, c cutSpec) (string, error) {
	p.wb.Lock()
	defer p.wb.Unlock()
	if p.down.Load() {
		return "", msgError("power_cut: the power is already off")
	}
	m := p.idx.lockAll()
	p.down.Store(true)
	p.list.Lock()
	first, k, sectors := p.list.head, p.count.Load(), p.sectors.Load()
	p.list.head, p.list.tail = nil, nil
	p.count.Store(0)
	p.sectors.Store(0)
	p.list.Unlock()
	p.gen.Add(1)
	p.idx.reset()
	p.idx.unlock(m)
	// Every write around that saw the power on is counted: let it land.
	for p.inAround.Load() > 0 {
		runtime.Gosched()
	}
	p.msg.Lock()
	p.msg.cuts++
	p.msg.lastMode, p.msg.lastSeed = c.mode, c.seed
	p.msg.Unlock()
	// A write-back that failed before the cut is not reported after it.
	p.room.Lock()
	p.room.err = nil
	p.room.cond.Broadcast()
	p.room.Unlock()

	// The draws: clean (only when asked for, so that the seeds of random
	// and torn cuts keep their results), then per entry oldest first.
	rng := rand.New(rand.NewPCG(c.seed, seedStream))
	clean := c.clean > 0 && rng.Float64() < c.clean
	var survived, torn, wrote int64
	var err error
	write := func(e *entry, a, b int64) {
		if err == nil && a < b {
			wrote++
			err = p.writeRange(ctx, e, a, b)
		}
	}
	lose := func(e *entry, a, b int64) {
		if c.fill != "old" && err == nil && a < b {
			wrote++
			err = p.fillRange(ctx, e, a, b, c)
		}
	}
	e := first
	for range k {
		switch {
		case clean:
			survived++
			write(e, e.off, e.end)
		case c.mode == "all":
			lose(e, e.off, e.end)
		case c.mode == "sector":
			kept, lost := int64(0), int64(0)
			for u := e.off / c.unit; u*c.unit < e.end; u++ {
				a, b := max(u*c.unit, e.off), min((u+1)*c.unit, e.end)
				if rng.Uint64()&1 == 1 {
					kept++
					write(e, a, b)
				} else {
					lost++
					lose(e, u*c.unit, (u+1)*c.unit)
				}
			}
			switch {
			case lost == 0:
				survived++
			case kept > 0:
				torn++
			}
		case rng.Uint64()&1 == 1:
			keep := e.end - e.off
			if units := (e.end+c.unit-1)/c.unit - e.off/c.unit; c.mode == "torn" && units > 1 {
				j := 1 + rng.Int64N(units)
				keep = min(e.end, (e.off/c.unit+j)*c.unit) - e.off
			}
			write(e, e.off, e.off+keep)
			if keep < e.end-e.off {
				torn++
				// The tear falls on a unit boundary; the rest of the
				// last unit is lost with it.
				lose(e, e.off+keep, (e.end+c.unit-1)/c.unit*c.unit)
			} else {
				survived++
			}
		default:
			lose(e, e.off, e.end)
		}
		next := e.next
		freeEntry(e)
		e = next
	}
	if err == nil && wrote > 0 {
		err = p.dev.Flush(ctx)
	}
	if err != nil {
		return "", fmt.Errorf("power_cut: writing the surviving entries: %w", err)
	}
	name := c.mode
	if c.opts {
		if c.mode == "torn" || c.mode == "sector" {
			name += fmt.Sprintf(" unit %d", c.unit)
		}
		name += fmt.Sprintf(" fill %s clean %g", c.fill, c.clean)
	}
	switch c.mode {
	case "all":
		return fmt.Sprintf("power_cut: %d cached writes lost (%d sectors)", k, sectors), nil
	case "random", "subset":
		return fmt.Sprintf("power_cut %s seed %d: %d of %d cached writes survived", name, c.seed, survived, k), nil
	}
	return fmt.Sprintf("power_cut %s seed %d: %d of %d cached writes survived, %d of them torn", name, c.seed, survived+torn, k, torn), nil
}

// fillRange puts c's fill over bytes [a, b) (rounded to whole units by the
// caller; they may reach past e), less the parts of e a later FUA write
// replaced: zeros, or junk drawn from the seed and the offset.
func (p *powercut) fillRange(ctx context.Context, e *entry, a, b int64, c cutSpec) error {
	a = max(a, 0)
	if c.fill == "zero" {
		return e.within(a, b, func(a, b int64) error { return p.dev.WriteZeroes(ctx, p.start+a, b-a) })
	}
	return e.within(a, b, func(a, b int64) error {
		buf := make([]byte, b-a)
		junk.Fill(buf, c.seed, a)
		_, err := p.dev.WriteAt(ctx, buf, p.start+a)
		return err
	})
}
