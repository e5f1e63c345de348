package stack

import (
	"context"
	"fmt"
	"log"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/dmarg"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

// Dust is the dust target type (dm-dust 1.0.0): a linear mapping that emulates
// bad blocks. Blocks are listed by message; while enabled, reads of a listed
// block fail with EIO and writes to it fail a set number of times, then clear
// it.
var Dust = &TargetType{Name: "dust", Version: [3]int{1, 0, 0}, New: newDust}

// dustMaxBlockSectors is the largest block size in sectors (1 GiB).
const dustMaxBlockSectors = 2097152

// dustErrs are the errors dust returns.
var dustErrs = newInjectedErrors("dust")

// dust is one constructed dust target: a Remap that checks the bad-block
// list before passing I/O on.
type dust struct {
	Remap
	blksz int64 // bytes, a power of 2
	shift uint  // log2(blksz)
	// flushOff is where an empty flush lands, relative to the segment: dm
	// sends it with sector 0 of the mapped device (see Flush).
	flushOff int64

	enabled atomic.Bool // fail_read_on_bad_block (else bypass)
	quiet   atomic.Bool

	// nbad mirrors len(bad.m) so that I/O skips the lock when the list is empty.
	nbad atomic.Int64
	bad  struct {
		sync.RWMutex
		m map[uint64]uint8 // block on dev -> write-fail count
	}

	logger *log.Logger
}

var (
	_ Target       = (*dust)(nil)
	_ Flusher      = (*dust)(nil)
	_ Discarder    = (*dust)(nil)
	_ Messager     = (*dust)(nil)
	_ MaxIOer      = (*dust)(nil)
	_ MapAccounter = (*dust)(nil)
)

// newDust constructs a dust target. Table syntax:
//
//	<dev> <offset> <blksz>
//
// offset is in sectors on dev; blksz is the bad-block size in bytes: a power
// of 2, at least 512, at most 1 GiB and at most the target's length. Blocks
// are numbered on dev, so block b covers bytes [b*blksz, (b+1)*blksz) of dev,
// offset included. No I/O handed to the target crosses a block boundary
// counted from the segment start (MaxIO).
//
// The target starts in bypass mode (listed blocks pass), verbose, with an
// empty list. Messages (verbs case-insensitive):
//
//	addbadblock <blk> [<wr_fail_cnt>]  list blk (write-fail count 0..255, default 0)
//	removebadblock <blk>               unlist blk
//	queryblock <blk>                   "dust_query_block: block <blk> [not ]found in badblocklist"
//	countbadblocks                     "countbadblocks: <n> badblock(s) found"
//	clearbadblocks                     "dust_clear_badblocks: badblocks cleared" or "... no badblocks found"
//	listbadblocks                      "<blk>\n" per block, ascending, or "No blocks in badblocklist"
//	enable | disable                   fail I/O to listed blocks, or bypass
//	quiet                              toggle the add/remove log lines
//
// <blk> may be up to dev's size in blocks, that value included (as in the
// kernel). While enabled, a read of a listed block fails with EIO; a write to
// it fails with EIO while its write-fail count is above 0 (each failure
// decrements it), and otherwise unlists the block and passes.
//
// As drivers/md/dm-dust.c: dust_map does, everything that is not a read is a
// write to the block of its first sector: an empty flush is a write to the
// block of the mapped device's sector 0, and a discard, which the core does
// not split at the block size, is checked on its first block only. dust
// takes no write-zeroes (dust_ctr sets num_flush_bios and num_discard_bios
// only), so ZERO_RANGE reaches it as writes, block by block. The errors it
// makes up are *InjectedError (ErrInjected, EIO).
//
// TABLE is "<dev> <offset> <blksz>"; INFO is
// "<dev> <fail_read_on_bad_block|bypass> <quiet|verbose>".
func newDust(c *Ctor, args []string) (Target, error) {
	if len(args) != 3 {
		return nil, Errorf("Invalid argument count")
	}
	bs, err := ParseUint32(args[2])
	if err != nil || bs == 0 {
		return nil, Errorf("Invalid block size parameter")
	}
	if bs < SectorSize {
		return nil, Errorf("Block size must be at least 512")
	}
	if bs&(bs-1) != 0 {
		return nil, Errorf("Block size must be a power of 2")
	}
	if int64(bs/SectorSize) > min(c.Len, dustMaxBlockSectors) {
		return nil, Errorf("Block size is too large")
	}
	r, err := OpenArea(c, args[0], args[1], "Invalid device offset sector", c.Len)
	if err != nil {
		return nil, err
	}
	d := &dust{
		Remap: r,
		blksz: int64(bs), shift: uint(bits.TrailingZeros32(bs)),
		flushOff: -c.Begin * SectorSize,
		logger:   log.Default(),
	}
	d.bad.m = make(map[uint64]uint8)
	return d, nil
}

// MaxIO implements MaxIOer: one block.
func (d *dust) MaxIO() int64 { return d.blksz }

// AccountsAtMap implements MapAccounter: I/O failed on a bad block is killed
// at map time and not counted.
func (d *dust) AccountsAtMap() {}

// block is the number on dev of the block holding segment byte off.
func (d *dust) block(off int64) uint64 { return uint64(d.Off+off) >> d.shift }

// logf writes one log line unless quiet.
func (d *dust) logf(format string, a ...any) {
	if !d.quiet.Load() {
		d.logger.Printf("dust: "+format, a...)
	}
}

// readOK reports whether a read starting at segment byte off may pass.
// Unlisted blocks take at most a read lock.
func (d *dust) readOK(off int64) bool {
	if !d.enabled.Load() || d.nbad.Load() == 0 {
		return true
	}
	b := d.block(off)
	d.bad.RLock()
	_, listed := d.bad.m[b]
	d.bad.RUnlock()
	return !listed
}

// writeOK applies the write rule to the block holding segment byte off and
// reports whether the write may pass.
func (d *dust) writeOK(off int64) bool {
	if !d.enabled.Load() || d.nbad.Load() == 0 {
		return true
	}
	b := d.block(off)
	d.bad.RLock()
	_, listed := d.bad.m[b]
	d.bad.RUnlock()
	if !listed {
		return true
	}
	d.bad.Lock()
	defer d.bad.Unlock()
	cnt, listed := d.bad.m[b]
	switch {
	case !listed:
		return true
	case cnt > 0:
		d.bad.m[b] = cnt - 1
		return false
	}
	delete(d.bad.m, b)
	d.nbad.Store(int64(len(d.bad.m)))
	d.logf("block %d removed from badblocklist by write", b)
	return true
}

// ReadAt implements Target.
func (d *dust) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if !d.readOK(off) {
		return 0, dustErrs.of(ioop.Read)
	}
	StartAccounting(ctx)
	return d.Remap.ReadAt(ctx, p, off)
}

// WriteAt implements Target.
func (d *dust) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if !d.writeOK(off) {
		return 0, dustErrs.of(ioop.Write)
	}
	StartAccounting(ctx)
	return d.Remap.WriteAt(ctx, p, off)
}

// Flush implements Flusher. drivers/md/dm.c: __send_empty_flush sends the
// flush with sector 0 of the mapped device, and dust_map remaps it like any
// bio to dd->start + dm_target_offset(ti, 0): the segment-relative offset
// -Begin. There dust_map_write applies the write rule. When the segment
// starts past the offset, the kernel's sector_t wraps to a block number
// that no listed block can have, so the flush passes.
func (d *dust) Flush(ctx context.Context) error {
	if d.Off+d.flushOff >= 0 && !d.writeOK(d.flushOff) {
		return dustErrs.of(ioop.Flush)
	}
	StartAccounting(ctx)
	return d.Remap.Flush(ctx)
}

// Discard implements Discarder: the write rule on the block of the first
// byte, then the whole range passes down. The core splits a discard at
// segment ends only (drivers/md/dm.c: __process_abnormal_io leaves
// ti->max_io_len out), so dust_map sees it whole.
func (d *dust) Discard(ctx context.Context, off, n int64) error {
	if !d.writeOK(off) {
		return dustErrs.of(ioop.Discard)
	}
	StartAccounting(ctx)
	return d.Remap.Discard(ctx, off, n)
}

// Status implements Target.
func (d *dust) Status(t StatusType) string {
	if t == StatusTable {
		return d.Table() + " " + strconv.FormatInt(d.blksz, 10)
	}
	name := EscapeArg(d.Dev.Name())
	mode, verb := "bypass", "verbose"
	if d.enabled.Load() {
		mode = "fail_read_on_bad_block"
	}
	if d.quiet.Load() {
		verb = "quiet"
	}
	return name + " " + mode + " " + verb
}

// dustMsgError is a failed message: EINVAL with the reason.
func dustMsgError(format string, a ...any) error {
	return &ArgError{Reason: fmt.Sprintf(format, a...), Errno: syscall.EINVAL}
}

// Message implements Messager with dm-dust's verbs, outputs and errors.
func (d *dust) Message(_ context.Context, args []string) (string, error) {
	switch len(args) {
	case 1:
		switch verb := strings.ToLower(args[0]); verb {
		case "addbadblock", "removebadblock", "queryblock":
			return "", dustMsgError("%s requires an additional argument", args[0])
		case "disable":
			d.logger.Printf("dust: disabling read failures on bad sectors")
			d.enabled.Store(false)
			return "", nil
		case "enable":
			d.logger.Printf("dust: enabling read failures on bad sectors")
			d.enabled.Store(true)
			return "", nil
		case "countbadblocks":
			d.bad.RLock()
			n := len(d.bad.m)
			d.bad.RUnlock()
			return fmt.Sprintf("countbadblocks: %d badblock(s) found", n), nil
		case "clearbadblocks":
			d.bad.Lock()
			n := len(d.bad.m)
			d.bad.m = make(map[uint64]uint8)
			d.nbad.Store(0)
			d.bad.Unlock()
			if n == 0 {
				return "dust_clear_badblocks: no badblocks found", nil
			}
			return "dust_clear_badblocks: badblocks cleared", nil
		case "quiet":
			for {
				q := d.quiet.Load()
				if d.quiet.CompareAndSwap(q, !q) {
					return "", nil
				}
			}
		case "listbadblocks":
			return d.list(), nil
		}
		return "", dustMsgError("unrecognized message '%s' received", args[0])
	case 2, 3:
		blk, ok := dmarg.Uint64(args[1]) // sscanf "%llu%c", as dust_message
		if !ok {
			return "", dustMsgError("%s %s: invalid block number", args[0], args[1])
		}
		var cnt uint8
		if len(args) == 3 {
			c, ok := dmarg.Uint32(args[2]) // sscanf "%u%c"
			if !ok {
				return "", dustMsgError("%s %s %s: invalid write fail count", args[0], args[1], args[2])
			}
			if c > 255 {
				return "", dustMsgError("%s %s %s: selected write fail count out of range (0-255)", args[0], args[1], args[2])
			}
			cnt = uint8(c)
		}
		if limit := uint64(d.Dev.Size()/SectorSize) >> (d.shift - 9); blk > limit {
			return "", dustMsgError("%s %s: selected block value out of range (at most %d)", args[0], args[1], limit)
		}
		verb := strings.ToLower(args[0])
		switch {
		case verb == "addbadblock":
			return "", d.add(blk, cnt)
		case verb == "removebadblock" && len(args) == 2:
			return "", d.remove(blk)
		case verb == "queryblock" && len(args) == 2:
			d.bad.RLock()
			_, ok := d.bad.m[blk]
			d.bad.RUnlock()
			if ok {
				return fmt.Sprintf("dust_query_block: block %d found in badblocklist", blk), nil
			}
			return fmt.Sprintf("dust_query_block: block %d not found in badblocklist", blk), nil
		}
		return "", dustMsgError("unrecognized message '%s' received", args[0])
	}
	return "", dustMsgError("invalid number of arguments '%d'", len(args))
}

// add lists blk with write-fail count cnt.
func (d *dust) add(blk uint64, cnt uint8) error {
	d.bad.Lock()
	defer d.bad.Unlock()
	if _, ok := d.bad.m[blk]; ok {
		return dustMsgError("dust_add_block: block %d already in badblocklist", blk)
	}
	d.bad.m[blk] = cnt
	d.nbad.Store(int64(len(d.bad.m)))
	d.logf("dust_add_block: badblock added at block %d with write fail count %d", blk, cnt)
	return nil
}

// remove unlists blk.
func (d *dust) remove(blk uint64) error {
	d.bad.Lock()
	defer d.bad.Unlock()
	if _, ok := d.bad.m[blk]; !ok {
		return dustMsgError("dust_remove_block: block %d not found in badblocklist", blk)
	}
	delete(d.bad.m, blk)
	d.nbad.Store(int64(len(d.bad.m)))
	d.logf("dust_remove_block: badblock removed at block %d", blk)
	return nil
}

// list is the listbadblocks output.
func (d *dust) list() string {
	d.bad.RLock()
	blocks := make([]uint64, 0, len(d.bad.m))
	for b := range d.bad.m {
		blocks = append(blocks, b)
	}
	d.bad.RUnlock()
	if len(blocks) == 0 {
		return "No blocks in badblocklist"
	}
	slices.Sort(blocks)
	var b strings.Builder
	for _, blk := range blocks {
		b.WriteString(strconv.FormatUint(blk, 10))
		b.WriteByte('\n')
	}
	return b.String()
}
