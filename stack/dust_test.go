package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/clock"
	"github.com/dmfuse/dmfuse/internal/ioop"
)

// newTestDust builds a dust target of length sectors over dev, logging to
// logs.
func newTestDust(t testing.TB, dev *MemDevice, length int64, params string, logs *bytes.Buffer) *dust {
	t.Helper()
	tg, err := Dust.New(newFaultCtor(&clock.Manual{}, length, dev), SplitArgs(params))
	if err != nil {
		t.Fatalf("dust %q: %v", params, err)
	}
	d := tg.(*dust)
	if logs != nil {
		d.logger = log.New(logs, "", 0)
	} else {
		d.logger = log.New(&bytes.Buffer{}, "", 0)
	}
	return d
}

// dustMsg sends one message given as text.
func dustMsg(d *dust, text string) (string, error) {
	return d.Message(context.Background(), strings.Fields(text))
}

func TestDustTableVectors(t *testing.T) {
	// The table and status lines drivers/md/dm-dust.c: dust_status prints.
	dev := NewMemDevice("8:16", 8192*SectorSize)
	d := newTestDust(t, dev, 2048, "8:16 0 512", nil)
	if got, want := d.Status(StatusTable), "8:16 0 512"; got != want {
		t.Errorf("table %q, want %q", got, want)
	}
	if got, want := d.Status(StatusInfo), "8:16 bypass verbose"; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
	for _, m := range []string{"enable", "quiet"} {
		if out, err := dustMsg(d, m); out != "" || err != nil {
			t.Fatalf("%s: %q, %v", m, out, err)
		}
	}
	if got, want := d.Status(StatusInfo), "8:16 fail_read_on_bad_block quiet"; got != want {
		t.Errorf("status after enable, quiet: %q, want %q", got, want)
	}
	dustMsg(d, "QUIET")
	dustMsg(d, "Disable")
	if got, want := d.Status(StatusInfo), "8:16 bypass verbose"; got != want {
		t.Errorf("status after quiet, disable: %q, want %q", got, want)
	}
	if got := d.MaxIO(); got != 512 {
		t.Errorf("MaxIO %d, want 512", got)
	}
	if d.Dev != BlockDevice(dev) || d.Off != 0 {
		t.Errorf("remaps to %v at %d", d.Dev, d.Off)
	}

	// Block numbering with offset: dm sector 0 is block (1024+0)/8 = 128.
	o := newTestDust(t, dev, 2048, "8:16 1024 4096", nil)
	if got, want := o.Status(StatusTable), "8:16 1024 4096"; got != want {
		t.Errorf("table %q, want %q", got, want)
	}
	if o.MaxIO() != 4096 {
		t.Errorf("MaxIO %d", o.MaxIO())
	}
	for _, c := range []struct {
		off int64
		blk uint64
	}{{0, 128}, {4095, 128}, {4096, 129}, {8 * SectorSize * 10, 138}} {
		if got := o.block(c.off); got != c.blk {
			t.Errorf("offset 1024 sectors, byte %d: block %d, want %d", c.off, got, c.blk)
		}
	}
	dustMsg(o, "enable")
	dustMsg(o, "addbadblock 128")
	if _, err := o.ReadAt(context.Background(), make([]byte, 512), 4096-512); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of dm sector 7 (block 128): %v, want EIO", err)
	}
	if _, err := o.ReadAt(context.Background(), make([]byte, 512), 4096); err != nil {
		t.Errorf("read of dm sector 8 (block 129): %v", err)
	}

	// The table form is accepted back.
	for _, in := range []string{"8:16 0 512", "8:16 16 1024", "8:16 1024 4096"} {
		d := newTestDust(t, dev, 2048, in, nil)
		if got := newTestDust(t, dev, 2048, d.Status(StatusTable), nil).Status(StatusTable); got != d.Status(StatusTable) {
			t.Errorf("dust %q: table %q does not round-trip (%q)", in, d.Status(StatusTable), got)
		}
	}
}

func TestDustRejected(t *testing.T) {
	// drivers/md/dm-dust.c: dust_ctr's refusals, in the kernel's words and
	// order of checks.
	dev := NewMemDevice("8:16", 8192*SectorSize)
	tests := []struct {
		length     int64
		in, reason string
	}{
		{2048, "8:16 0 1000", "Block size must be a power of 2"},
		{2048, "8:16 0 256", "Block size must be at least 512"},
		{2048, "8:16 0 0", "Invalid block size parameter"},
		{2048, "8:16 0 x", "Invalid block size parameter"},
		{2048, "8:16 0 -512", "Invalid block size parameter"},
		{2048, "8:16 0 4294967296", "Invalid block size parameter"},
		{8, "8:16 0 8192", "Block size is too large"},
		{1 << 30, "8:16 0 2147483648", "Block size is too large"},
		{2048, "8:16 0", "Invalid argument count"},
		{2048, "8:16 0 512 1", "Invalid argument count"},
		{2048, "", "Invalid argument count"},
		{2048, "8:16 x 512", "Invalid device offset sector"},
		{2048, "8:16 x 1000", "Block size must be a power of 2"},
		{2048, "8:16 x 500", "Block size must be at least 512"},
		{2048, "8:99 0 512", "Device lookup failed"},
	}
	for _, tc := range tests {
		_, err := Dust.New(newFaultCtor(&clock.Manual{}, tc.length, dev), SplitArgs(tc.in))
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Reason != tc.reason || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("dust %q (len %d): %v, want EINVAL %q", tc.in, tc.length, err, tc.reason)
		}
	}
	// 1 GiB blocks are allowed on a long enough segment (over a device that
	// reports size 0, which is not range-checked).
	if _, err := Dust.New(newFaultCtor(&clock.Manual{}, 1<<30, NewMemDevice("8:16", 0)), SplitArgs("8:16 0 1073741824")); err != nil {
		t.Errorf("1 GiB blocks: %v", err)
	}
}

func TestDustMessageVectors(t *testing.T) {
	// drivers/md/dm-dust.c: dust_message's answers on "0 2048 dust 8:16 0 512",
	// whose device holds 2048 blocks.
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	var logs bytes.Buffer
	d := newTestDust(t, dev, 2048, "8:16 0 512", &logs)
	var transcript strings.Builder
	steps := []struct {
		msg, out string
		err      bool
	}{
		{"addbadblock 60", "", false},
		{"addbadblock 60", "", true},
		{"ADDBADBLOCK 61 3", "", false},
		{"countbadblocks", "countbadblocks: 2 badblock(s) found", false},
		{"queryblock 60", "dust_query_block: block 60 found in badblocklist", false},
		{"queryblock 7", "dust_query_block: block 7 not found in badblocklist", false},
		{"listbadblocks", "60\n61\n", false},
		{"addbadblock 99999999", "", true},
		{"addbadblock 5 256", "", true},
		{"queryblock", "", true},
		// Range: the device's size in blocks is accepted, one more is not.
		{"addbadblock 2048", "", false},
		{"addbadblock 2049", "", true},
		{"removebadblock 2048", "", false},
		{"removebadblock 2048", "", true},
		{"removebadblock", "", true},
		{"addbadblock", "", true},
		{"addbadblock x", "", true},
		{"addbadblock 5 x", "", true},
		{"removebadblock 5 1", "", true},
		{"queryblock 5 1", "", true},
		{"enable 5", "", true},
		{"frobnicate", "", true},
		{"addbadblock 1 2 3", "", true},
		{"", "", true},
		{"qUeRyBlOcK 61", "dust_query_block: block 61 found in badblocklist", false},
	}
	run := func(msg, out string, wantErr bool) {
		t.Helper()
		got, err := dustMsg(d, msg)
		fmt.Fprintf(&transcript, "message %s\n", msg)
		if err != nil {
			fmt.Fprintf(&transcript, "  error: %v\n", err)
		} else {
			fmt.Fprintf(&transcript, "  output: %q\n", got)
		}
		if wantErr {
			if !errors.Is(err, syscall.EINVAL) {
				t.Errorf("message %q: %q, %v; want EINVAL", msg, got, err)
			}
			return
		}
		if err != nil || got != out {
			t.Errorf("message %q: %q, %v; want %q", msg, got, err, out)
		}
	}
	for _, s := range steps {
		run(s.msg, s.out, s.err)
	}

	// enable; read block 60 -> EIO; write block 61 -> EIO (count 3 -> 2);
	// write block 60 -> ok, 60 removed.
	run("enable", "", false)
	io := func(write bool, blk int64) error {
		buf := make([]byte, 512)
		var err error
		if write {
			_, err = d.WriteAt(ctx, buf, blk*512)
		} else {
			_, err = d.ReadAt(ctx, buf, blk*512)
		}
		fmt.Fprintf(&transcript, "%s block %d: %v\n", map[bool]string{true: "write", false: "read"}[write], blk, err)
		return err
	}
	if err := io(false, 60); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of bad block 60: %v, want EIO", err)
	}
	if err := io(false, 59); err != nil {
		t.Errorf("read of good block 59: %v", err)
	}
	for i := range 3 {
		if err := io(true, 61); !errors.Is(err, syscall.EIO) {
			t.Errorf("write %d of block 61 (3 failures set): %v, want EIO", i+1, err)
		}
	}
	run("queryblock 61", "dust_query_block: block 61 found in badblocklist", false)
	if err := io(true, 61); err != nil {
		t.Errorf("fourth write of block 61: %v", err)
	}
	if err := io(true, 60); err != nil {
		t.Errorf("write of block 60: %v", err)
	}
	if err := io(false, 60); err != nil {
		t.Errorf("read of block 60 after the write cleared it: %v", err)
	}
	run("queryblock 60", "dust_query_block: block 60 not found in badblocklist", false)
	run("listbadblocks", "No blocks in badblocklist", false)
	run("addbadblock 10", "", false)
	run("clearbadblocks", "dust_clear_badblocks: badblocks cleared", false)
	run("clearbadblocks", "dust_clear_badblocks: no badblocks found", false)
	run("listbadblocks", "No blocks in badblocklist", false)
	run("countbadblocks", "countbadblocks: 0 badblock(s) found", false)

	transcript.WriteString("log:\n" + logs.String())
	checkGolden(t, "dust/messages.golden", transcript.String())
}

func TestDustBypass(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	d := newTestDust(t, dev, 64, "8:16 0 512", nil)
	dustMsg(d, "addbadblock 3 2")
	buf := make([]byte, 512)
	if _, err := d.ReadAt(ctx, buf, 3*512); err != nil {
		t.Errorf("read of a listed block in bypass mode: %v", err)
	}
	if _, err := d.WriteAt(ctx, bytes.Repeat([]byte{1}, 512), 3*512); err != nil {
		t.Errorf("write of a listed block in bypass mode: %v", err)
	}
	if dev.Bytes()[3*512] != 1 {
		t.Error("bypass write did not reach the device")
	}
	if out, _ := dustMsg(d, "listbadblocks"); out != "3\n" {
		t.Errorf("bypass write changed the list: %q", out)
	}
	// The write-fail count survived bypass: two failures once enabled.
	dustMsg(d, "enable")
	for i := range 2 {
		if _, err := d.WriteAt(ctx, buf, 3*512); !errors.Is(err, syscall.EIO) {
			t.Errorf("write %d: %v, want EIO", i+1, err)
		}
	}
	if dev.Bytes()[3*512] != 1 {
		t.Error("a failed write reached the device")
	}
	dustMsg(d, "disable")
	if _, err := d.ReadAt(ctx, buf, 3*512); err != nil {
		t.Errorf("read after disable: %v", err)
	}
}

func TestDustLogs(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	var logs bytes.Buffer
	d := newTestDust(t, dev, 64, "8:16 0 512", &logs)
	dustMsg(d, "addbadblock 1 0")
	dustMsg(d, "addbadblock 2")
	dustMsg(d, "removebadblock 2")
	dustMsg(d, "enable")
	d.WriteAt(ctx, make([]byte, 512), 512)
	want := "dust: dust_add_block: badblock added at block 1 with write fail count 0\n" +
		"dust: dust_add_block: badblock added at block 2 with write fail count 0\n" +
		"dust: dust_remove_block: badblock removed at block 2\n" +
		"dust: enabling read failures on bad sectors\n" +
		"dust: block 1 removed from badblocklist by write\n"
	if logs.String() != want {
		t.Errorf("log:\n%s\nwant:\n%s", logs.String(), want)
	}
	logs.Reset()
	dustMsg(d, "quiet")
	dustMsg(d, "addbadblock 4")
	dustMsg(d, "removebadblock 4")
	dustMsg(d, "addbadblock 5")
	d.WriteAt(ctx, make([]byte, 512), 5*512)
	if logs.Len() != 0 {
		t.Errorf("quiet mode logged:\n%s", logs.String())
	}
}

// TestDustDiscard: a discard is not split at dust's block size
// (drivers/md/dm.c: __process_abnormal_io and __send_changing_extent_only
// cut abnormal I/O only at max_discard_sectors when the target sets
// max_discard_granularity, never at ti->max_io_len), so dust_map sees one
// bio and dust_map_write checks only the block of its first sector.
func TestDustDiscard(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 2048*SectorSize)
	faultPattern(dev)
	d := newTestDust(t, dev, 64, "8:16 0 1024", nil)
	dustMsg(d, "enable")
	dustMsg(d, "addbadblock 2 0")
	dustMsg(d, "addbadblock 3 1")
	// Blocks 1..3 (bytes 1024..4095): block 1 is good, so the whole range
	// is discarded and blocks 2 and 3 stay listed.
	if err := d.Discard(ctx, 1024, 3072); err != nil {
		t.Fatalf("discard starting on a good block: %v", err)
	}
	if !bytes.Equal(dev.Bytes()[1024:4096], make([]byte, 3072)) {
		t.Error("the discard did not reach the whole range")
	}
	if out, _ := dustMsg(d, "listbadblocks"); out != "2\n3\n" {
		t.Errorf("blocks after the discard: %q, want 2 and 3 still listed", out)
	}
	// Starting on block 3 (write-fail count 1): the discard fails and
	// nothing is discarded, block 4 included.
	faultPattern(dev)
	before := bytes.Clone(dev.Bytes())
	if err := d.Discard(ctx, 3072, 2048); !errors.Is(err, syscall.EIO) {
		t.Fatalf("discard starting on bad block 3: %v, want EIO", err)
	}
	if !bytes.Equal(dev.Bytes(), before) {
		t.Error("a failed discard changed the device")
	}
	// The count is spent: the next one clears block 3 and passes.
	if err := d.Discard(ctx, 3072, 2048); err != nil {
		t.Fatalf("discard after the count ran out: %v", err)
	}
	if out, _ := dustMsg(d, "listbadblocks"); out != "2\n" {
		t.Errorf("blocks after the clearing discard: %q, want 2", out)
	}
}

// TestDustEmptyFlush: an empty flush is a write to sector 0 of the dm
// device (drivers/md/dm.c: __send_empty_flush sends a bio initialised by
// bio_init, bi_sector 0). drivers/md/dm-dust.c: dust_map remaps it to
// dd->start + dm_target_offset(ti, 0) and, being a write, hands it to
// dust_map_write; __dust_map_write fails it while that block's write-fail
// count is above 0 (decrementing it) and otherwise drops the block from the
// list and passes the flush on.
func TestDustEmptyFlush(t *testing.T) {
	ctx := context.Background()
	dev := NewMemDevice("8:16", 8192*SectorSize)
	var logs bytes.Buffer
	d := newTestDust(t, dev, 2048, "8:16 0 512", &logs)
	dustMsg(d, "addbadblock 0 1")
	dustMsg(d, "addbadblock 1 5")
	if err := d.Flush(ctx); err != nil || dev.Flushes() != 1 {
		t.Fatalf("flush in bypass mode: %v, %d flushes", err, dev.Flushes())
	}
	dustMsg(d, "enable")
	if err := d.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush with block 0 bad: %v, want EIO", err)
	}
	if dev.Flushes() != 1 {
		t.Error("a failed flush reached the device")
	}
	if out, _ := dustMsg(d, "listbadblocks"); out != "0\n1\n" {
		t.Errorf("list after the failed flush: %q", out)
	}
	logs.Reset()
	if err := d.Flush(ctx); err != nil || dev.Flushes() != 2 {
		t.Fatalf("flush after block 0's count ran out: %v, %d flushes", err, dev.Flushes())
	}
	if out, _ := dustMsg(d, "queryblock 0"); out != "dust_query_block: block 0 not found in badblocklist" {
		t.Errorf("the flush did not clear block 0: %q", out)
	}
	if logs.String() != "dust: block 0 removed from badblocklist by write\n" {
		t.Errorf("log of the clearing flush: %q", logs.String())
	}
	// Block 1 is not the flush's block.
	if err := d.Flush(ctx); err != nil {
		t.Errorf("flush with only block 1 bad: %v", err)
	}
	// Quiet mode silences the clearing, as for writes.
	dustMsg(d, "quiet")
	dustMsg(d, "addbadblock 0")
	logs.Reset()
	if err := d.Flush(ctx); err != nil || logs.Len() != 0 {
		t.Errorf("quiet clearing flush: %v, log %q", err, logs.String())
	}

	// With an offset the flush lands on the block holding the offset:
	// sector 1024 with 4096-byte blocks is block 128.
	o := newTestDust(t, dev, 2048, "8:16 1024 4096", nil)
	dustMsg(o, "enable")
	dustMsg(o, "addbadblock 0 3")
	dustMsg(o, "addbadblock 128 1")
	if err := o.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("flush with block 128 bad: %v, want EIO", err)
	}
	if out, _ := dustMsg(o, "listbadblocks"); out != "0\n128\n" {
		t.Errorf("list: %q", out)
	}

	// A segment starting at sector 2048 of the mapped device: the flush
	// lands at offset - 2048. With offset 4096 that is sector 2048 of the
	// device (block 2048 of 512 bytes); with offset 0 it is before the
	// device, where no block can be listed.
	for _, tc := range []struct {
		params string
		block  string
		fails  bool
	}{
		{"8:16 4096 512", "2048", true},
		{"8:16 4096 512", "4096", false},
		{"8:16 0 512", "0", false},
	} {
		c := newFaultCtor(&clock.Manual{}, 2048, dev)
		c.Begin = 2048
		tg, err := Dust.New(c, SplitArgs(tc.params))
		if err != nil {
			t.Fatal(err)
		}
		b := tg.(*dust)
		b.logger = log.New(&bytes.Buffer{}, "", 0)
		dustMsg(b, "enable")
		dustMsg(b, "addbadblock "+tc.block+" 1")
		if err := b.Flush(ctx); errors.Is(err, syscall.EIO) != tc.fails {
			t.Errorf("segment at 2048, %q, block %s bad: flush %v, want failure %v", tc.params, tc.block, err, tc.fails)
		}
	}
}

func TestDustAccounting(t *testing.T) {
	// I/O killed on a bad block (DM_MAPIO_KILL) is not accounted
	// (drivers/md/dm.c: __dm_io_complete).
	dev := NewMemDevice("8:16", 2048*SectorSize)
	d := newTestDust(t, dev, 64, "8:16 0 512", nil)
	dustMsg(d, "enable")
	dustMsg(d, "addbadblock 1 1")
	buf := make([]byte, 512)
	for _, c := range []struct {
		name string
		op   ioop.Op
		f    func(context.Context) error
		want bool
	}{
		{"killed read", ioop.Read, func(c context.Context) error { _, err := d.ReadAt(c, buf, 512); return err }, false},
		{"killed write", ioop.Write, func(c context.Context) error { _, err := d.WriteAt(c, buf, 512); return err }, false},
		{"read of a good block", ioop.Read, func(c context.Context) error { _, err := d.ReadAt(c, buf, 0); return err }, true},
		{"clearing write", ioop.Write, func(c context.Context) error { _, err := d.WriteAt(c, buf, 512); return err }, true},
		{"discard", ioop.Discard, func(c context.Context) error { return d.Discard(c, 0, 512) }, true},
	} {
		p := faultAcctPiece(c.op)
		c.f(p)
		if got := faultAcctStarted(p); got != c.want {
			t.Errorf("%s: accounting started %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDustConcurrent(t *testing.T) {
	// I/O and messages at once; run with -race.
	dev := NewMemDevice("8:16", 2048*SectorSize)
	d := newTestDust(t, dev, 256, "8:16 0 512", nil)
	dustMsg(d, "enable")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 512)
			for i := range 500 {
				off := int64((g*31+i*7)%256) * 512
				var err error
				if i%3 == 0 {
					_, err = d.WriteAt(context.Background(), buf, off)
				} else {
					_, err = d.ReadAt(context.Background(), buf, off)
				}
				if err != nil && !errors.Is(err, syscall.EIO) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 300 {
			dustMsg(d, fmt.Sprintf("addbadblock %d %d", i%256, i%3))
			dustMsg(d, fmt.Sprintf("removebadblock %d", (i*5)%256))
			dustMsg(d, "listbadblocks")
			if i%50 == 0 {
				dustMsg(d, "clearbadblocks")
			}
		}
	}()
	wg.Wait()
	// Count and list agree afterwards.
	count, _ := dustMsg(d, "countbadblocks")
	list, _ := dustMsg(d, "listbadblocks")
	n := strings.Count(list, "\n")
	if want := fmt.Sprintf("countbadblocks: %d badblock(s) found", n); count != want {
		t.Errorf("%q but the list has %d blocks", count, n)
	}
	if d.nbad.Load() != int64(n) {
		t.Errorf("nbad %d, list %d", d.nbad.Load(), n)
	}
}

func BenchmarkDustReadEnabled(b *testing.B) {
	dev := NewMemDevice("8:16", 2048*SectorSize)
	d := newTestDust(b, dev, 1024, "8:16 0 4096", nil)
	dustMsg(d, "enable")
	dustMsg(d, "addbadblock 100")
	b.SetBytes(4096)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		for pb.Next() {
			d.ReadAt(context.Background(), buf, 0)
		}
	})
}

func FuzzDustMessage(f *testing.F) {
	for _, s := range []string{
		"addbadblock 60", "ADDBADBLOCK 61 3", "countbadblocks", "queryblock 7", "listbadblocks",
		"addbadblock 99999999", "addbadblock 5 256", "queryblock", "clearbadblocks", "enable", "disable",
		"quiet", "removebadblock 60", "addbadblock +4 +1", "foo bar baz qux",
	} {
		f.Add(s, "8:16 0 512")
	}
	f.Add("addbadblock 3", "8:16 16 4096")
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f.Fuzz(func(t *testing.T, msgs, params string) {
		tg, err := Dust.New(newFaultCtor(&clock.Manual{}, 2048, dev), SplitArgs(params))
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) || ae.Reason == "" || !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("%q: error %v is not an EINVAL *ArgError with a reason", params, err)
			}
			return
		}
		d := tg.(*dust)
		d.logger = log.New(&bytes.Buffer{}, "", 0)
		table := d.Status(StatusTable)
		tg2, err := Dust.New(newFaultCtor(&clock.Manual{}, 2048, dev), SplitArgs(table))
		if err != nil || tg2.Status(StatusTable) != table {
			t.Fatalf("%q: table %q does not round-trip: %v", params, table, err)
		}
		buf := make([]byte, 512)
		for _, line := range strings.Split(msgs, ";") {
			out, err := d.Message(context.Background(), SplitArgs(line))
			if err != nil && (out != "" || !errors.Is(err, syscall.EINVAL)) {
				t.Fatalf("message %q: %q, %v", line, out, err)
			}
			for _, off := range []int64{0, 512, 4096, 1 << 20} {
				d.ReadAt(context.Background(), buf, off)
				d.WriteAt(context.Background(), buf, off)
			}
		}
		count, _ := d.Message(context.Background(), []string{"countbadblocks"})
		list, _ := d.Message(context.Background(), []string{"listbadblocks"})
		if n := strings.Count(list, "\n"); count != fmt.Sprintf("countbadblocks: %d badblock(s) found", n) {
			t.Fatalf("%q but list %q", count, list)
		}
	})
}
