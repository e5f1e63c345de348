package stack

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

// Flakey is the flakey target type (dm-flakey 1.5.0): a linear mapping that is
// up for a number of seconds, then down for a number of seconds, in a cycle
// that starts when the table is constructed. While down, it fails, drops or
// corrupts I/O according to its features.
var Flakey = &TargetType{Name: "flakey", Version: [3]int{1, 5, 0}, New: newFlakey}

// flakeyProbabilityBase is the scale of random_read_corrupt and
// random_write_corrupt: p/1e9 is the probability per I/O.
const flakeyProbabilityBase = 1_000_000_000

// flakeyMaxFeatureArgs is the largest num_features the kernel accepts.
const flakeyMaxFeatureArgs = 11

// flakeyErrs are the errors flakey returns.
var flakeyErrs = newInjectedErrors("flakey")

// flakey is one constructed flakey target: a Remap that decides, while
// down, what becomes of each I/O before passing it on. Everything but the
// PRNG is fixed at construction, so the I/O path reads it without locks.
type flakey struct {
	Remap
	clock Clock
	t0    int64 // construction time, clock ns
	up    uint32
	down  uint32

	errorReads, dropWrites, errorWrites bool

	corruptByte  uint32 // 1-based; 0 when corrupt_bio_byte is not set
	corruptWrite bool   // direction w (else r)
	corruptValue byte
	corruptFlags uint32 // always 0 once constructed; kept for the table form

	randomRead, randomWrite uint32 // 0..1e9; 0 when not set

	seed    uint64
	hasSeed bool
	rngMu   sync.Mutex // held only for the draws of one I/O
	rng     *rand.Rand
}

var (
	_ Target       = (*flakey)(nil)
	_ Flusher      = (*flakey)(nil)
	_ Discarder    = (*flakey)(nil)
	_ MapAccounter = (*flakey)(nil)
)

// newFlakey constructs a flakey target. Table syntax:
//
//	<dev> <offset> <up_seconds> <down_seconds> [<num_features> <feature args>...]
//
// offset is in sectors on dev; up_seconds and down_seconds are 0..2^32-1 and
// not both 0. The cycle starts when the table is constructed (load), not at
// resume. Feature names are matched case-insensitively; num_features counts
// every word after it (0..11):
//
//	error_reads                                   reads fail with EIO while down
//	drop_writes                                   writes, flushes and discards succeed without reaching dev while down
//	error_writes                                  writes, flushes and discards fail with EIO while down
//	                                              (drivers/md/dm-flakey.c: flakey_map treats every bio that
//	                                              is not a read as a write: an empty flush or a discard is
//	                                              dropped or failed, and passes otherwise, since it has no
//	                                              data to corrupt)
//	corrupt_bio_byte <Nth> <r|w> <value> <flags>  while down, byte Nth (1-based) of each read's data (after the
//	                                              read) or of each write's data (on a copy) is set to value
//	                                              (0..255); flags must be 0 in dmfuse, since FUSE requests carry
//	                                              no bio flags to match
//	random_read_corrupt <p>                       while down, with probability p/1e9 per read, one random byte
//	                                              of the data read gets a random value
//	random_write_corrupt <p>                      the same for writes, on a copy of the caller's data
//	random_seed <N>                               (dmfuse extension, counts 2) seeds the random corruption with
//	                                              the unsigned 64-bit N so that a run can be repeated; without
//	                                              it the seed comes from the time of construction
//
// drop_writes and error_writes exclude each other and write corruption;
// error_reads excludes read corruption. With no feature at all (or only
// random_seed, or random_* with p = 0) the target behaves as if error_reads
// and error_writes were given, and its table form says so. As in the kernel,
// arguments after the feature list are ignored.
//
// The table form is canonical: features in the fixed order error_reads,
// drop_writes or error_writes, corrupt_bio_byte, random_read_corrupt,
// random_write_corrupt, then random_seed, with their recomputed count. The
// status (INFO) form is empty.
//
// flakey takes discards but not write-zeroes (flakey_ctr sets
// num_flush_bios and num_discard_bios only), so ZERO_RANGE reaches it as
// writes of zeros, which it drops, fails or corrupts like any write. The
// errors it makes up are *InjectedError (ErrInjected, EIO).
func newFlakey(c *Ctor, args []string) (Target, error) {
	if len(args) < 4 {
		return nil, Errorf("Invalid argument count")
	}
	a := NewArgs(args)
	devArg, _ := a.Next()
	offArg, _ := a.Next()
	off, err := ParseSector(offArg)
	if err != nil {
		return nil, Errorf("Invalid device sector")
	}
	f := &flakey{}
	if f.up, err = a.Uint(0, 1<<32-1, "Invalid up interval"); err != nil {
		return nil, err
	}
	if f.down, err = a.Uint(0, 1<<32-1, "Invalid down interval"); err != nil {
		return nil, err
	}
	if f.up == 0 && f.down == 0 {
		return nil, Errorf("Total (up + down) interval is zero")
	}
	if f.up+f.down < f.up {
		return nil, Errorf("Interval overflow")
	}
	if err := f.parseFeatures(a); err != nil {
		return nil, err
	}

	f.clock = c.Clock
	if f.clock == nil {
		f.clock = clock.System
	}
	f.t0 = f.clock.Nanotime()
	if !f.hasSeed {
		f.seed = uint64(time.Now().UnixNano())
	}
	f.rng = rand.New(rand.NewPCG(f.seed, flakeySeedStream))

	// The device comes last, as in flakey_ctr.
	if f.Remap, err = OpenRemap(c, devArg, off, c.Len); err != nil {
		return nil, err
	}
	return f, nil
}

// flakeySeedStream is the second PCG seed word; random_seed sets the first.
const flakeySeedStream = 0x9e3779b97f4a7c15

// parseFeatures reads [<num_features> <feature args>...] as the kernel's
// parse_features does, with the same reasons.
func (f *flakey) parseFeatures(a *Args) error {
	var n uint32
	if a.Len() > 0 {
		var err error
		if n, err = a.Group(0, flakeyMaxFeatureArgs, "Invalid number of feature args"); err != nil {
			return err
		}
	}
	for n > 0 {
		name, _ := a.Next() // Group guaranteed n words
		n--
		switch strings.ToLower(name) {
		case "error_reads":
			if f.errorReads {
				return Errorf("Feature error_reads duplicated")
			}
			f.errorReads = true
		case "drop_writes":
			if f.dropWrites {
				return Errorf("Feature drop_writes duplicated")
			}
			if f.errorWrites {
				return Errorf("Feature drop_writes conflicts with feature error_writes")
			}
			f.dropWrites = true
		case "error_writes":
			if f.errorWrites {
				return Errorf("Feature error_writes duplicated")
			}
			if f.dropWrites {
				return Errorf("Feature error_writes conflicts with feature drop_writes")
			}
			f.errorWrites = true
		case "corrupt_bio_byte":
			if f.corruptByte != 0 {
				return Errorf("Feature corrupt_bio_byte duplicated")
			}
			if n < 4 {
				return Errorf("Feature corrupt_bio_byte requires 4 parameters")
			}
			v, err := a.Uint(1, 1<<32-1, "Invalid corrupt bio byte")
			if err != nil {
				return err
			}
			f.corruptByte = v
			dir, _ := a.Next()
			switch strings.ToLower(dir) {
			case "w":
				f.corruptWrite = true
			case "r":
				f.corruptWrite = false
			default:
				return Errorf("Invalid corrupt bio direction (r or w)")
			}
			val, err := a.Uint(0, 255, "Invalid corrupt value to write into bio byte (0-255)")
			if err != nil {
				return err
			}
			f.corruptValue = byte(val)
			flags, err := a.Uint(0, 1<<32-1, "Invalid corrupt bio flags mask")
			if err != nil {
				return err
			}
			if flags != 0 {
				return Errorf("Invalid corrupt bio flags mask %d: dmfuse requests carry no bio flags, so only 0 (every request) can match", flags)
			}
			f.corruptFlags = flags
			n -= 4
		case "random_read_corrupt", "random_write_corrupt":
			p := &f.randomRead
			if strings.EqualFold(name, "random_write_corrupt") {
				p = &f.randomWrite
			}
			lname := strings.ToLower(name)
			if *p != 0 {
				return Errorf("Feature %s duplicated", lname)
			}
			if n == 0 {
				return Errorf("Feature %s requires a parameter", lname)
			}
			v, err := a.Uint(0, flakeyProbabilityBase, "Invalid random corrupt argument")
			if err != nil {
				return err
			}
			*p = v
			n--
		case "random_seed":
			if f.hasSeed {
				return Errorf("Feature random_seed duplicated")
			}
			if n == 0 {
				return Errorf("Feature random_seed requires a parameter")
			}
			s, _ := a.Next()
			v, err := ParseUint64(s)
			if err != nil {
				return Errorf("Invalid random seed %q: not an unsigned 64-bit decimal", s)
			}
			f.seed, f.hasSeed = v, true
			n--
		default:
			return Errorf("Unrecognised flakey feature requested")
		}
	}
	corruptW := f.corruptByte != 0 && f.corruptWrite
	corruptR := f.corruptByte != 0 && !f.corruptWrite
	switch {
	case f.dropWrites && (corruptW || f.randomWrite != 0):
		return Errorf("drop_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set")
	case f.errorWrites && (corruptW || f.randomWrite != 0):
		return Errorf("error_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set")
	case f.errorReads && (corruptR || f.randomRead != 0):
		return Errorf("error_reads is incompatible with random_read_corrupt or corrupt_bio_byte with the READ flag set")
	}
	if !f.errorReads && !f.dropWrites && !f.errorWrites && f.corruptByte == 0 && f.randomRead == 0 && f.randomWrite == 0 {
		f.errorReads, f.errorWrites = true, true
	}
	return nil
}

// isDown reports whether the device is in its down period now: whole seconds
// since construction, modulo up+down, are at least up.
func (f *flakey) isDown() bool {
	if f.down == 0 {
		return false
	}
	if f.up == 0 {
		return true
	}
	d := f.clock.Nanotime() - f.t0
	if d < 0 {
		d = 0
	}
	elapsed := uint64(d) / uint64(time.Second)
	return elapsed%(uint64(f.up)+uint64(f.down)) >= uint64(f.up)
}

// AccountsAtMap implements MapAccounter: a read failed by error_reads is
// killed at map time and not counted.
func (f *flakey) AccountsAtMap() {}

// ReadAt implements Target.
func (f *flakey) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if !f.isDown() {
		StartAccounting(ctx)
		return f.Remap.ReadAt(ctx, p, off)
	}
	if f.errorReads {
		return 0, flakeyErrs.of(ioop.Read)
	}
	StartAccounting(ctx)
	n, err := f.Remap.ReadAt(ctx, p, off)
	if err != nil || len(p) == 0 {
		return n, err
	}
	if f.corruptByte != 0 && !f.corruptWrite {
		f.corruptFixed(p)
	}
	if f.randomRead != 0 {
		f.corruptRandom(p, f.randomRead)
	}
	return n, nil
}

// WriteAt implements Target. Corruption works on a pooled copy, never on p.
func (f *flakey) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	StartAccounting(ctx)
	if !f.isDown() {
		return f.Remap.WriteAt(ctx, p, off)
	}
	switch {
	case f.dropWrites:
		return len(p), nil
	case f.errorWrites:
		return 0, flakeyErrs.of(ioop.Write)
	}
	if len(p) == 0 {
		return f.Remap.WriteAt(ctx, p, off)
	}
	fixed := f.corruptByte != 0 && f.corruptWrite && int64(f.corruptByte) <= int64(len(p))
	var pos int
	var val byte
	random := f.randomWrite != 0 && f.draw(f.randomWrite, len(p), &pos, &val)
	if !fixed && !random {
		return f.Remap.WriteAt(ctx, p, off)
	}
	bp := flakeyBufPool.Get().(*[]byte)
	if cap(*bp) < len(p) {
		*bp = make([]byte, len(p))
	}
	buf := (*bp)[:len(p)]
	copy(buf, p)
	if fixed {
		buf[f.corruptByte-1] = f.corruptValue
	}
	if random {
		buf[pos] = val
	}
	n, err := f.Remap.WriteAt(ctx, buf, off)
	flakeyBufPool.Put(bp)
	return n, err
}

// flakeyBufPool holds the copies that write corruption works on.
var flakeyBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 128<<10); return &b }}

// corruptFixed sets byte corruptByte (1-based) of p, if p is that long.
func (f *flakey) corruptFixed(p []byte) {
	if int64(f.corruptByte) <= int64(len(p)) {
		p[f.corruptByte-1] = f.corruptValue
	}
}

// corruptRandom sets one random byte of p to a random value with probability
// prob/1e9.
func (f *flakey) corruptRandom(p []byte, prob uint32) {
	var pos int
	var val byte
	if f.draw(prob, len(p), &pos, &val) {
		p[pos] = val
	}
}

// draw decides, as the kernel does (a 64-bit random number modulo 1e9 below
// prob), whether an I/O of n bytes is corrupted, and if so picks the byte
// position (a 32-bit random number modulo n) and the value.
func (f *flakey) draw(prob uint32, n int, pos *int, val *byte) bool {
	f.rngMu.Lock()
	hit := f.rng.Uint64()%flakeyProbabilityBase < uint64(prob)
	if hit {
		*pos = int(f.rng.Uint32() % uint32(n))
		*val = byte(f.rng.Uint32())
	}
	f.rngMu.Unlock()
	return hit
}

// downDataless decides a flush or a discard as drivers/md/dm-flakey.c:
// flakey_map does a write without data: while down it is dropped (done,
// nil) with drop_writes or failed (done, EIO) with error_writes; otherwise
// (up, or down with other features, which have no data to corrupt) done is
// false and the caller passes it down.
func (f *flakey) downDataless(ctx context.Context, op ioop.Op) (done bool, err error) {
	StartAccounting(ctx)
	if f.isDown() {
		switch {
		case f.dropWrites:
			return true, nil
		case f.errorWrites:
			return true, flakeyErrs.of(op)
		}
	}
	return false, nil
}

// Flush implements Flusher.
func (f *flakey) Flush(ctx context.Context) error {
	if done, err := f.downDataless(ctx, ioop.Flush); done {
		return err
	}
	return f.Remap.Flush(ctx)
}

// Discard implements Discarder.
func (f *flakey) Discard(ctx context.Context, off, n int64) error {
	if done, err := f.downDataless(ctx, ioop.Discard); done {
		return err
	}
	return f.Remap.Discard(ctx, off, n)
}

// Status implements Target: TABLE is the canonical constructor input, INFO is
// empty.
func (f *flakey) Status(t StatusType) string {
	if t != StatusTable {
		return ""
	}
	var b strings.Builder
	b.WriteString(f.Table())
	for _, v := range []uint64{uint64(f.up), uint64(f.down), uint64(f.featureCount())} {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(v, 10))
	}
	if f.errorReads {
		b.WriteString(" error_reads")
	}
	if f.dropWrites {
		b.WriteString(" drop_writes")
	} else if f.errorWrites {
		b.WriteString(" error_writes")
	}
	if f.corruptByte != 0 {
		d := "r"
		if f.corruptWrite {
			d = "w"
		}
		b.WriteString(" corrupt_bio_byte " + strconv.FormatUint(uint64(f.corruptByte), 10) + " " + d + " " +
			strconv.Itoa(int(f.corruptValue)) + " " + strconv.FormatUint(uint64(f.corruptFlags), 10))
	}
	if f.randomRead != 0 {
		b.WriteString(" random_read_corrupt " + strconv.FormatUint(uint64(f.randomRead), 10))
	}
	if f.randomWrite != 0 {
		b.WriteString(" random_write_corrupt " + strconv.FormatUint(uint64(f.randomWrite), 10))
	}
	if f.hasSeed {
		b.WriteString(" random_seed " + strconv.FormatUint(f.seed, 10))
	}
	return b.String()
}

// featureCount is num_features of the table form.
func (f *flakey) featureCount() int {
	n := 0
	for _, set := range []bool{f.errorReads, f.dropWrites, f.errorWrites} {
		if set {
			n++
		}
	}
	if f.corruptByte != 0 {
		n += 5
	}
	if f.randomRead != 0 {
		n += 2
	}
	if f.randomWrite != 0 {
		n += 2
	}
	if f.hasSeed {
		n += 2
	}
	return n
}
