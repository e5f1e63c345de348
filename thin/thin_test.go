package thin

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/stack"
)

func TestPoolArgErrors(t *testing.T) {
	for _, tc := range []struct {
		params, reason string
		errno          syscall.Errno
	}{
		{"meta data 128", "Invalid argument count", syscall.EINVAL},
		{"meta meta 128 0", "Error setting metadata or data device", syscall.EINVAL},
		{"meta data 128 0 5 a b c d e", "Invalid number of pool feature arguments", syscall.EINVAL},
		{"meta data 128 0 2 skip_block_zeroing", "Invalid number of pool feature arguments", syscall.EINVAL},
		{"meta data 128 0 -1", "Invalid number of pool feature arguments", syscall.EINVAL},
		{"meta data 128 0 1 frobnicate", "Unrecognised pool feature requested", syscall.EINVAL},
		{"nosuch data 128 0", "Error opening metadata block device", syscall.EINVAL},
		{"meta nosuch 128 0", "Error getting data device", syscall.EINVAL},
		{"meta data 0 0", "Invalid block size", syscall.EINVAL},
		{"meta data 64 0", "Invalid block size", syscall.EINVAL},
		{"meta data 192 0", "Invalid block size", syscall.EINVAL},
		{"meta data 4194304 0", "Invalid block size", syscall.EINVAL},
		{"meta data 12x 0", "Invalid block size", syscall.EINVAL},
		{"meta data 128 -1", "Invalid low water mark", syscall.EINVAL},
		{"meta data 128 18446744073709551616", "Invalid low water mark", syscall.EINVAL},
		{"meta data 128 0 1 read_only", "Error creating metadata object", syscall.EPERM},
	} {
		r := newRig(t)
		r.mem("meta", 4<<20)
		r.mem("data", 1<<20)
		err := r.createErr("pool", "0 2048 thin-pool "+tc.params)
		if err == nil || !strings.Contains(err.Error(), "thin-pool: "+tc.reason) {
			t.Errorf("%q: %v, want %q", tc.params, err, tc.reason)
			continue
		}
		errnoIs(t, tc.params, err, tc.errno)
	}
}

func TestPoolFeaturesTableLine(t *testing.T) {
	for _, tc := range []struct{ features, table string }{
		{"", "meta data 128 10 0 "},
		{"0", "meta data 128 10 0 "},
		{"1 skip_block_zeroing", "meta data 128 10 1 skip_block_zeroing "},
		{"1 SKIP_BLOCK_ZEROING", "meta data 128 10 1 skip_block_zeroing "},
		{"2 error_if_no_space skip_block_zeroing", "meta data 128 10 2 skip_block_zeroing error_if_no_space "},
		{"4 no_discard_passdown ignore_discard error_if_no_space skip_block_zeroing", "meta data 128 10 4 skip_block_zeroing ignore_discard no_discard_passdown error_if_no_space "},
		{"2 ignore_discard ignore_discard", "meta data 128 10 1 ignore_discard "},
		{"1 no_discard_passdown trailing words", "meta data 128 10 1 no_discard_passdown "},
	} {
		r := newRig(t)
		d := r.pool(16, 10, tc.features)
		// The data device, a mapped device, prints by its number.
		want := "0 2048 thin-pool " + strings.Replace(tc.table, "data", r.mgr.Lookup("data").DevNo(), 1)
		if got := r.table(d); got != want {
			t.Errorf("%q: table %q, want %q", tc.features, got, want)
		}
	}
}

func TestPoolStatusLine(t *testing.T) {
	for _, tc := range []struct{ features, status string }{
		{"", "0 112/1024 0/16 - rw discard_passdown queue_if_no_space - 256 "},
		{"1 ignore_discard", "0 112/1024 0/16 - rw ignore_discard queue_if_no_space - 256 "},
		{"1 no_discard_passdown", "0 112/1024 0/16 - rw no_discard_passdown queue_if_no_space - 256 "},
		{"1 error_if_no_space", "0 112/1024 0/16 - rw discard_passdown error_if_no_space - 256 "},
	} {
		r := newRig(t)
		d := r.pool(16, 4, tc.features)
		if got := r.status(d); got != "0 2048 thin-pool "+tc.status {
			t.Errorf("%q: status %q, want %q", tc.features, got, "0 2048 thin-pool "+tc.status)
		}
	}
	// A used pool: transaction id, used data blocks, a held root.
	r := newRig(t)
	d := r.pool(16, 4, "")
	th := r.thin("t1", 1, 1<<20)
	if got := r.status(th); got != "0 2048 thin 0 -" {
		t.Errorf("fresh thin status %q", got)
	}
	if got, want := r.table(th), "0 2048 thin "+d.DevNo()+" 1"; got != want {
		t.Errorf("thin table %q, want %q", got, want)
	}
	write(t, th, fill(1, 4096), 3*65536)
	write(t, th, fill(1, 4096), 65536)
	r.mustMsg("pool", "set_transaction_id", "0", "7")
	r.mustMsg("pool", "reserve_metadata_snap")
	if got, want := r.status(d), "0 2048 thin-pool 7 112/1024 2/16 7 rw discard_passdown queue_if_no_space - 256 "; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
	if got, want := r.status(th), "0 2048 thin 256 511"; got != want {
		t.Errorf("thin status %q, want %q", got, want)
	}
}

func TestThinArgErrors(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	r.mustMsg("pool", "create_thin", "1")
	r.mem("origin", 1<<20)
	r.create("lin", "0 2048 linear data 0")
	for _, tc := range []struct {
		params, reason string
		errno          syscall.Errno
	}{
		{"pool", "Invalid argument count", syscall.EINVAL},
		{"pool 1 origin x", "Invalid argument count", syscall.EINVAL},
		{"pool 1 pool", "Error setting origin device", syscall.EINVAL},
		{"pool 1 nosuch", "Error opening origin device", syscall.EINVAL},
		{"nosuch 1", "Error opening pool device", syscall.EINVAL},
		{"pool 16777216", "Invalid device id", syscall.EINVAL},
		{"pool x", "Invalid device id", syscall.EINVAL},
		{"origin 1", "Couldn't get pool mapped device", syscall.EINVAL},
		{"lin 1", "Couldn't find pool object", syscall.EINVAL},
		{"pool 2", "Couldn't open thin internal device", syscall.ENODATA},
	} {
		err := r.createErr("t", "0 2048 thin "+tc.params)
		if err == nil || !strings.Contains(err.Error(), "thin: "+tc.reason) {
			t.Errorf("%q: %v, want %q", tc.params, err, tc.reason)
			continue
		}
		errnoIs(t, tc.params, err, tc.errno)
	}
	// A suspended pool refuses new thin devices.
	if err := r.mgr.Suspend("pool", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	err := r.createErr("t", "0 2048 thin pool 1")
	if err == nil || !strings.Contains(err.Error(), "Unable to activate thin device while pool is suspended") {
		t.Errorf("suspended pool: %v", err)
	}
	if err := r.mgr.Resume("pool", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	r.create("t", "0 2048 thin pool 1 origin")
	if got, want := r.table(r.mgr.Lookup("t")), "0 2048 thin "+r.mgr.Lookup("pool").DevNo()+" 1 origin"; got != want {
		t.Errorf("table %q, want %q", got, want)
	}
}

func TestPoolIdentity(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	r.mem("data2", 1<<20)
	r.mem("meta2", 4<<20)
	for _, tc := range []struct {
		name, params, reason string
		errno                syscall.Errno
	}{
		{"p2", "meta data2 128 0", "metadata device already in use by a pool", syscall.EBUSY},
		{"p2", "meta2 data 128 0", "data device already in use by a pool", syscall.EBUSY},
		{"pool", "meta data2 128 0", "data device already in use by a pool", syscall.EBUSY},
		{"pool", "meta2 data2 128 0", "different pool cannot replace a pool", syscall.EINVAL},
		{"pool", "meta data 128 0 1 ignore_discard", "Discard support cannot be disabled once enabled", syscall.EINVAL},
	} {
		var err error
		if tc.name == "pool" {
			err = r.mgr.Load("pool", "0 2048 thin-pool "+tc.params, "")
		} else {
			err = r.createErr(tc.name, "0 2048 thin-pool "+tc.params)
		}
		if err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%q: %v, want %q", tc.params, err, tc.reason)
			continue
		}
		errnoIs(t, tc.params, err, tc.errno)
	}
	// A reload reuses the pool object and keeps its block size.
	if err := r.mgr.Load("pool", "0 2048 thin-pool meta data 256 5", ""); err != nil {
		t.Fatal(err)
	}
	if err := r.mgr.Resume("pool", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if got, want := r.table(r.mgr.Lookup("pool")), "0 2048 thin-pool meta "+r.mgr.Lookup("data").DevNo()+" 128 5 0 "; got != want {
		t.Errorf("reloaded table %q, want %q", got, want)
	}
	if len(r.stores) != 1 {
		t.Errorf("%d stores opened, want 1", len(r.stores))
	}
}

func TestMessages(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	for _, tc := range []struct {
		words []string
		errno syscall.Errno // 0: success
	}{
		{[]string{"create_thin", "2"}, 0},
		{[]string{"CREATE_THIN", "3"}, 0},
		{[]string{"create_thin", "2"}, syscall.EEXIST},
		{[]string{"create_thin"}, syscall.EINVAL},
		{[]string{"create_thin", "4", "5"}, syscall.EINVAL},
		{[]string{"create_thin", "16777216"}, syscall.EINVAL},
		{[]string{"create_thin", "-1"}, syscall.EINVAL},
		{[]string{"create_thin", "+16777215"}, 0},
		{[]string{"create_snap", "10", "1"}, 0},
		{[]string{"create_snap", "10", "1"}, syscall.EEXIST},
		{[]string{"create_snap", "11", "99"}, syscall.ENODATA},
		{[]string{"create_snap", "11"}, syscall.EINVAL},
		{[]string{"delete", "99"}, syscall.ENODATA},
		{[]string{"delete", "1"}, syscall.EBUSY},
		{[]string{"delete", "3"}, 0},
		{[]string{"delete"}, syscall.EINVAL},
		{[]string{"set_transaction_id", "0", "1"}, 0},
		{[]string{"set_transaction_id", "0", "2"}, syscall.EINVAL},
		{[]string{"set_transaction_id", "x", "2"}, syscall.EINVAL},
		{[]string{"set_transaction_id", "1"}, syscall.EINVAL},
		{[]string{"reserve_metadata_snap"}, 0},
		{[]string{"reserve_metadata_snap"}, syscall.EBUSY},
		{[]string{"reserve_metadata_snap", "x"}, syscall.EINVAL},
		{[]string{"release_metadata_snap"}, 0},
		{[]string{"release_metadata_snap"}, syscall.EINVAL},
		{[]string{"trim", "1", "0"}, syscall.EINVAL},
	} {
		err := r.msg("pool", tc.words...)
		if tc.errno == 0 {
			if err != nil {
				t.Errorf("%q: %v", tc.words, err)
			}
			continue
		}
		errnoIs(t, strings.Join(tc.words, " "), err, tc.errno)
	}
	if got := r.store().TransactionID(); got != 1 {
		t.Errorf("transaction id %d", got)
	}
	// A successful message commits.
	if r.store().Changed() {
		t.Error("changes left uncommitted after a message")
	}
	_ = th
	// The thin device takes no messages.
	if err := r.msg("t1", "create_thin", "5"); err == nil {
		t.Error("a thin device took a message")
	}
}

func TestProvisionZeroesNewBlocks(t *testing.T) {
	for _, skip := range []bool{false, true} {
		r := newRig(t)
		f := ""
		if skip {
			f = "1 skip_block_zeroing"
		}
		r.pool(16, 0, f)
		copy(r.mems["databack"].Bytes(), fill(0xee, 16*65536)) // stale contents
		th := r.thin("t1", 1, 1<<20)
		write(t, th, fill(7, 4096), 65536+8192)
		got := read(t, th, 65536, 65536)
		if !bytes.Equal(got[8192:12288], fill(7, 4096)) {
			t.Errorf("skip %v: written data not read back", skip)
		}
		want := byte(0)
		if skip {
			want = 0xee
		}
		if got[0] != want || got[65535] != want {
			t.Errorf("skip %v: rest of the new block %#x %#x, want %#x", skip, got[0], got[65535], want)
		}
		// Unprovisioned blocks read as zeros and stay unmapped.
		if !bytes.Equal(read(t, th, 4096, 0), make([]byte, 4096)) {
			t.Error("unprovisioned read not zeros")
		}
		if got := r.status(th); got != "0 2048 thin 128 255" {
			t.Errorf("status %q", got)
		}
	}
}

func TestSnapshotCopyOnWrite(t *testing.T) {
	r := newRig(t)
	r.pool(32, 0, "")
	o := r.thin("origin", 1, 1<<20)
	write(t, o, fill(1, 65536), 0)
	write(t, o, fill(2, 4096), 65536)
	if err := r.mgr.Suspend("origin", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	r.mustMsg("pool", "create_snap", "2", "1")
	if err := r.mgr.Resume("origin", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	s := r.create("snap", "0 2048 thin pool 2")
	// Writes to either side break sharing and leave the other alone.
	write(t, o, fill(3, 4096), 4096)
	write(t, s, fill(4, 4096), 65536+8192)
	if got := read(t, s, 8192, 0); !bytes.Equal(got, fill(1, 8192)) {
		t.Error("snapshot saw the origin's write")
	}
	og := read(t, o, 65536, 0)
	if !bytes.Equal(og[:4096], fill(1, 4096)) || !bytes.Equal(og[4096:8192], fill(3, 4096)) || !bytes.Equal(og[8192:], fill(1, 65536-8192)) {
		t.Error("origin lost its copied block's data")
	}
	sg := read(t, s, 65536, 65536)
	if !bytes.Equal(sg[:4096], fill(2, 4096)) || !bytes.Equal(sg[8192:12288], fill(4, 4096)) {
		t.Error("snapshot's copied block wrong")
	}
	if got := read(t, o, 4096, 65536+8192); !bytes.Equal(got, make([]byte, 4096)) {
		t.Error("origin saw the snapshot's write")
	}
	// A snapshot of the snapshot, then a third generation of writes.
	r.mustMsg("pool", "create_snap", "3", "2")
	s2 := r.create("snap2", "0 2048 thin pool 3")
	write(t, s2, fill(5, 65536), 0)
	if got := read(t, s, 4096, 0); !bytes.Equal(got, fill(1, 4096)) {
		t.Error("snapshot changed by a write to its snapshot")
	}
	// 2 origin blocks, 2 copies, 1 whole-block overwrite.
	if free, _ := r.store().FreeDataBlocks(); free != 32-5 {
		t.Errorf("%d free data blocks, want %d", free, 32-5)
	}
}

func TestConcurrentWritesProvisionOnce(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			write(t, th, fill(byte(i+1), 4096), int64(i)*4096)
		}()
	}
	wg.Wait()
	got := read(t, th, 65536, 0)
	for i := range 16 {
		if !bytes.Equal(got[i*4096:(i+1)*4096], fill(byte(i+1), 4096)) {
			t.Errorf("piece %d lost", i)
		}
	}
	if free, _ := r.store().FreeDataBlocks(); free != 15 {
		t.Errorf("%d free blocks, want 15: the block was provisioned more than once", free)
	}
}

func TestDiscard(t *testing.T) {
	for _, tc := range []struct {
		features   string
		passdown   bool
		noDiscards bool
	}{
		{"", true, false},
		{"1 no_discard_passdown", false, false},
		{"1 ignore_discard", false, true},
	} {
		r := newRig(t)
		r.pool(16, 0, tc.features)
		th := r.thin("t1", 1, 1<<20)
		write(t, th, fill(9, 4*65536), 0)
		data := r.mems["databack"].Bytes()
		err := th.Discard(context.Background(), 1000, 3*65536)
		if tc.noDiscards {
			errnoIs(t, "discard with ignore_discard", err, syscall.EOPNOTSUPP)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		// Blocks 1 and 2 lie wholly inside; 0 and 3 only partly.
		if got := r.status(th); got != "0 2048 thin 256 511" {
			t.Errorf("%q: status %q", tc.features, got)
		}
		if got := read(t, th, 65536, 65536); !bytes.Equal(got, make([]byte, 65536)) {
			t.Errorf("%q: discarded block not zeros", tc.features)
		}
		if got := read(t, th, 1000, 0); !bytes.Equal(got, fill(9, 1000)) {
			t.Errorf("%q: partly discarded block changed", tc.features)
		}
		passed := bytes.Equal(data[65536:3*65536], make([]byte, 2*65536))
		if passed != tc.passdown {
			t.Errorf("%q: passed down %v, want %v", tc.features, passed, tc.passdown)
		}
	}
}

func TestDiscardKeepsSharedBlocks(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	o := r.thin("origin", 1, 1<<20)
	write(t, o, fill(1, 65536), 0)
	r.mustMsg("pool", "create_snap", "2", "1")
	s := r.create("snap", "0 2048 thin pool 2")
	if err := o.Discard(context.Background(), 0, 65536); err != nil {
		t.Fatal(err)
	}
	if got := read(t, s, 65536, 0); !bytes.Equal(got, fill(1, 65536)) {
		t.Error("discard on the origin reached the snapshot's shared block")
	}
}

func TestFlushCommitsAfterDataFlush(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	st := r.store()
	data := r.mems["databack"]
	write(t, th, fill(1, 4096), 0)
	if !st.Changed() {
		t.Fatal("provisioning changed nothing")
	}
	c0, f0 := st.commits, data.Flushes()
	if err := th.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.Changed() || st.commits != c0+1 || data.Flushes() <= f0 {
		t.Errorf("flush: changed %v, commits %d->%d, data flushes %d->%d", st.Changed(), c0, st.commits, f0, data.Flushes())
	}
	// A flush of an unchanged device flushes the data device only.
	c0, f0 = st.commits, data.Flushes()
	if err := th.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.commits != c0 || data.Flushes() != f0+1 {
		t.Errorf("unchanged flush: commits %d->%d, data flushes %d->%d", c0, st.commits, f0, data.Flushes())
	}
	// A FUA write that provisions commits.
	c0 = st.commits
	if _, err := th.WriteAt(stack.WithFUA(context.Background()), fill(2, 4096), 65536); err != nil {
		t.Fatal(err)
	}
	if st.commits != c0+1 {
		t.Errorf("FUA write: commits %d->%d", c0, st.commits)
	}
}

func TestPeriodicCommit(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	p := poolFor(t, r)
	write(t, th, fill(1, 4096), 0)
	p.tick()
	if !r.store().Changed() {
		t.Fatal("committed before a second passed")
	}
	r.clock.Advance(time.Second)
	p.tick()
	if r.store().Changed() {
		t.Error("not committed after a second")
	}
}

// poolFor returns the pool object of the rig's pool device.
func poolFor(t *testing.T, r *rig) *pool {
	t.Helper()
	p, _ := poolOf(r.mgr.Lookup("pool"))
	if p == nil {
		t.Fatal("no pool object")
	}
	return p
}

func TestOutOfSpaceQueuesThenTimesOut(t *testing.T) {
	r := newRig(t)
	const timeout = 5 * time.Second
	if err := SetNoSpaceTimeout(r.mgr.Shared(), timeout); err != nil {
		t.Fatal(err)
	}
	d := r.pool(4, 2, "")
	th := r.thin("t1", 1, 1<<20)
	p := poolFor(t, r)
	ev := d.EventNr()
	for i := range 4 {
		write(t, th, fill(1, 4096), int64(i)*65536)
	}
	if d.EventNr() <= ev {
		t.Error("no event at the low water mark")
	}
	done := make(chan error, 1)
	go func() {
		_, err := th.WriteAt(context.Background(), fill(2, 4096), 5*65536)
		done <- err
	}()
	waitFor(t, "out of data space", func() bool { return p.getMode() == modeOutOfDataSpace })
	if got := r.status(d); !strings.Contains(got, " out_of_data_space discard_passdown queue_if_no_space ") {
		t.Errorf("status %q", got)
	}
	// Mapped blocks are still written.
	write(t, th, fill(3, 4096), 0)
	select {
	case err := <-done:
		t.Fatalf("queued write returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	r.clock.Advance(timeout - time.Millisecond)
	p.tick()
	select {
	case err := <-done:
		t.Fatalf("queued write returned %v before the manager's timeout", err)
	case <-time.After(20 * time.Millisecond):
	}
	r.clock.Advance(time.Millisecond)
	p.tick()
	errnoIs(t, "queued write after the timeout", <-done, syscall.ENOSPC)
	if got := r.status(d); !strings.Contains(got, " out_of_data_space discard_passdown error_if_no_space ") {
		t.Errorf("status after timeout %q", got)
	}
	// Growing the pool by reload and resume returns it to write mode.
	if err := r.grow(8, 2, ""); err != nil {
		t.Fatal(err)
	}
	if p.getMode() != modeWrite {
		t.Errorf("mode %v after growth", p.getMode())
	}
	write(t, th, fill(2, 4096), 5*65536)
	if got := r.status(d); !strings.HasSuffix(got, " 5/8 - rw discard_passdown queue_if_no_space - 256 ") {
		t.Errorf("status after growth %q", got)
	}
	// A smaller pool is refused at resume.
	if err := r.mgr.Load("pool", "0 512 thin-pool meta data 128 2", ""); err != nil {
		t.Fatal(err)
	}
	err := r.mgr.Resume("pool", stack.Flags{})
	if err == nil || !strings.Contains(err.Error(), "pool target (4 blocks) too small: expected 8") {
		t.Errorf("shrink: %v", err)
	}
}

func TestOutOfSpaceReleasedByGrowth(t *testing.T) {
	r := newRig(t)
	r.pool(2, 0, "")
	th := r.thin("t1", 1, 1<<20)
	p := poolFor(t, r)
	write(t, th, fill(1, 65536), 0)
	write(t, th, fill(1, 65536), 65536)
	done := make(chan error, 1)
	go func() {
		_, err := th.WriteAt(context.Background(), fill(2, 4096), 2*65536)
		done <- err
	}()
	waitFor(t, "out of data space", func() bool { return p.getMode() == modeOutOfDataSpace })
	if err := r.grow(4, 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("queued write after growth: %v", err)
	}
	if got := read(t, th, 4096, 2*65536); !bytes.Equal(got, fill(2, 4096)) {
		t.Error("queued write lost")
	}
}

func TestErrorIfNoSpace(t *testing.T) {
	r := newRig(t)
	d := r.pool(1, 0, "1 error_if_no_space")
	th := r.thin("t1", 1, 1<<20)
	write(t, th, fill(1, 4096), 0)
	_, err := th.WriteAt(context.Background(), fill(1, 4096), 65536)
	errnoIs(t, "write past the space", err, syscall.ENOSPC)
	if got := r.status(d); !strings.Contains(got, " 1/1 - out_of_data_space discard_passdown error_if_no_space ") {
		t.Errorf("status %q", got)
	}
	// Discarding frees a block; the next commit returns to write mode.
	if err := th.Discard(context.Background(), 0, 65536); err != nil {
		t.Fatal(err)
	}
	if err := poolFor(t, r).commit(); err != nil {
		t.Fatal(err)
	}
	write(t, th, fill(1, 4096), 65536)
}

func TestMetadataFailureMakesPoolReadOnly(t *testing.T) {
	r := newRig(t)
	d := r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	write(t, th, fill(1, 4096), 0)
	r.store().fail["Commit"] = errors.New("injected")
	if err := th.Flush(context.Background()); err == nil {
		t.Error("flush succeeded over a failed commit")
	}
	if got := r.status(d); !strings.HasSuffix(got, " ro discard_passdown queue_if_no_space needs_check 256 ") {
		t.Errorf("status %q", got)
	}
	errnoIs(t, "message in read-only mode", r.msg("pool", "create_thin", "2"), syscall.EOPNOTSUPP)
	_, err := th.WriteAt(context.Background(), fill(1, 4096), 65536)
	errnoIs(t, "write needing a block in read-only mode", err, syscall.EIO)
	// The aborted write's block is unmapped again; reads still work.
	if got := read(t, th, 4096, 0); !bytes.Equal(got, make([]byte, 4096)) {
		t.Error("aborted mapping still visible")
	}
	// needs_check keeps a reload from going back to write mode.
	if err := r.mgr.Load("pool", "0 2048 thin-pool meta data 128 0", ""); err != nil {
		t.Fatal(err)
	}
	if err := r.mgr.Resume("pool", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if m := poolFor(t, r).getMode(); m != modeReadOnly {
		t.Errorf("mode %v after reload with needs_check", m)
	}
}

func TestExternalOrigin(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	org := r.mem("origin", 65536+4096)
	copy(org.Bytes(), fill(5, len(org.Bytes())))
	r.mustMsg("pool", "create_thin", "1")
	th := r.create("t1", "0 2048 thin pool 1 origin")
	got := read(t, th, 65536, 65536)
	if !bytes.Equal(got[:4096], fill(5, 4096)) || !bytes.Equal(got[4096:], make([]byte, 65536-4096)) {
		t.Error("read across the origin's end")
	}
	write(t, th, fill(6, 512), 65536+8192)
	got = read(t, th, 65536, 65536)
	if !bytes.Equal(got[:4096], fill(5, 4096)) || !bytes.Equal(got[8192:8704], fill(6, 512)) || got[4096] != 0 || got[65535] != 0 {
		t.Error("block copied from the origin wrong")
	}
	write(t, th, fill(7, 512), 0)
	if got := read(t, th, 4096, 0); !bytes.Equal(got[512:], fill(5, 4096-512)) {
		t.Error("copy from the origin lost")
	}
	if org.Bytes()[0] != 5 {
		t.Error("origin written")
	}
}

func TestNoflushSuspendPushesBackQueuedIO(t *testing.T) {
	r := newRig(t)
	r.pool(1, 0, "")
	th := r.thin("t1", 1, 1<<20)
	write(t, th, fill(1, 65536), 0)
	p := poolFor(t, r)
	done := make(chan error, 1)
	go func() {
		_, err := th.WriteAt(context.Background(), fill(2, 4096), 65536)
		done <- err
	}()
	waitFor(t, "out of data space", func() bool { return p.getMode() == modeOutOfDataSpace })
	if err := r.mgr.Suspend("t1", stack.Flags{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.grow(2, 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.mgr.Resume("t1", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("pushed-back write: %v", err)
	}
	if got := read(t, th, 4096, 65536); !bytes.Equal(got, fill(2, 4096)) {
		t.Error("pushed-back write lost")
	}
}

func TestPoolReopensMetadata(t *testing.T) {
	r := newRig(t)
	r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	write(t, th, fill(3, 4096), 65536)
	if err := r.mgr.Remove("t1", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	if err := r.mgr.Remove("pool", stack.Flags{}); err != nil {
		t.Fatal(err)
	}
	r.create("pool", "0 2048 thin-pool meta data 128 0")
	th = r.create("t1", "0 2048 thin pool 1")
	if got := read(t, th, 4096, 65536); !bytes.Equal(got, fill(3, 4096)) {
		t.Error("mapping lost across a pool's removal (the last table commits)")
	}
	// Another block size over the same metadata is refused.
	r.mgr.RemoveAll(stack.Flags{})
	r.create("data", "0 2048 linear databack 0")
	err := r.createErr("pool", "0 2048 thin-pool meta data 256 0")
	if err == nil || !strings.Contains(err.Error(), "Error creating metadata object") {
		t.Errorf("block size change: %v", err)
	}
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	for range 2000 {
		if f() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestMetadataLowWaterEvent(t *testing.T) {
	r := newRig(t)
	r.mem("meta", 64<<10) // 16 blocks: threshold 4
	r.mem("databack", 64*65536)
	r.create("data", "0 8192 linear databack 0")
	d := r.create("pool", "0 8192 thin-pool meta data 128 0")
	th := r.thin("t1", 1, 4<<20)
	st := r.store()
	ev := d.EventNr()
	write(t, th, fill(1, 512), 0) // 10 used of 16: 6 free
	if d.EventNr() != ev {
		t.Fatalf("event with 6 free metadata blocks")
	}
	st.mu.Lock()
	st.cur.metaN = 14 // 4 free
	st.mu.Unlock()
	write(t, th, fill(1, 512), 65536)
	if d.EventNr() != ev+1 {
		t.Errorf("event number %d, want %d at the metadata low water mark", d.EventNr(), ev+1)
	}
	write(t, th, fill(1, 512), 2*65536)
	if d.EventNr() != ev+1 {
		t.Errorf("event raised again below the mark")
	}
}

// TestNoSpaceTimeoutPerManager: no_space_timeout is a setting of one
// Manager's pools (the kernel's module parameter, one per daemon), 60 s
// unless set; another Manager keeps its own, and a closed Manager's set
// refuses it.
func TestNoSpaceTimeoutPerManager(t *testing.T) {
	a, b := newRig(t), newRig(t)
	if err := SetNoSpaceTimeout(a.mgr.Shared(), time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := NoSpaceTimeout(a.mgr.Shared()); err != nil || got != time.Second {
		t.Errorf("a: %v, %v; want 1s", got, err)
	}
	if got, err := NoSpaceTimeout(b.mgr.Shared()); err != nil || got != DefaultNoSpaceTimeout {
		t.Errorf("b: %v, %v; want the default", got, err)
	}
	if err := SetNoSpaceTimeout(b.mgr.Shared(), -time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := NoSpaceTimeout(b.mgr.Shared()); got != 0 {
		t.Errorf("negative timeout: got %v, want 0", got)
	}
	var closed stack.SharedSet
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	if err := SetNoSpaceTimeout(&closed, time.Second); err == nil {
		t.Error("a closed set took a timeout")
	}
}

// TestClosedManagerRefusesPool: a pool table built after its Manager
// closed fails with a clear error instead of sharing pools with every
// other table of the process.
func TestClosedManagerRefusesPool(t *testing.T) {
	r := newRig(t)
	r.mem("meta", 4<<20)
	r.mem("data", 64<<20)
	if err := r.mgr.Close(); err != nil {
		t.Fatal(err)
	}
	err := r.createErr("pool", "0 131072 thin-pool meta data 128 0")
	if err == nil || !strings.Contains(err.Error(), "manager is closed") {
		t.Errorf("pool after Close: %v, want an error naming the closed manager", err)
	}
}

// TestStatusNoFlush: the pool's status commits first (pool_status), unless
// it is asked for with noflush (DM_STATUS_NOFLUSH_FLAG, `dmsetup status
// --noflush`), which prints the same line and leaves the transaction open.
// Other targets print their INFO status for either.
func TestStatusNoFlush(t *testing.T) {
	r := newRig(t)
	d := r.pool(16, 0, "")
	th := r.thin("t1", 1, 1<<20)
	st := r.store()
	write(t, th, fill(1, 4096), 0)
	if !st.Changed() {
		t.Fatal("provisioning changed nothing")
	}
	c0 := st.commits
	noflush := strings.TrimSuffix(d.FormatTable(stack.StatusInfoNoFlush, false), "\n")
	if st.commits != c0 || !st.Changed() {
		t.Errorf("status --noflush committed: commits %d->%d, changed %v", c0, st.commits, st.Changed())
	}
	if f := strings.Fields(noflush); len(f) < 6 || f[5] != "1/16" {
		t.Errorf("status --noflush %q: want 1/16 data blocks used", noflush)
	}
	if got := r.status(d); got != noflush {
		t.Errorf("status %q differs from status --noflush %q", got, noflush)
	}
	if st.commits != c0+1 || st.Changed() {
		t.Errorf("status: commits %d->%d, changed %v; want one commit", c0, st.commits, st.Changed())
	}
	// A target without NoFlushStatuser answers its INFO status.
	data := r.mgr.Lookup("data")
	if got, want := data.FormatTable(stack.StatusInfoNoFlush, false), data.FormatTable(stack.StatusInfo, false); got != want {
		t.Errorf("linear status --noflush %q, want %q", got, want)
	}
}
