package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Thin provisioning through the dmsetup drop-in, as container runtimes'
// devmapper snapshotters and xfstests' common/dmthin drive it, with
// thin_check and thin_dump on the metadata after each.

// createPool creates a thin-pool device.
func (e *dmsetupEnv) createPool(name, table string) {
	e.t.Helper()
	out, errs, code := e.dmsetup("", "create", name, "--table", table)
	if code != 0 {
		e.t.Fatalf("create %s: exit %d\n%s%s", name, code, out, errs)
	}
}

// thinCheck runs thin_check and thin_dump on a metadata device no pool
// uses and returns the dump.
func thinCheck(t *testing.T, meta string) string {
	t.Helper()
	if out, err := exec.Command("thin_check", meta).CombinedOutput(); err != nil {
		t.Fatalf("thin_check %s: %v\n%s", meta, err, out)
	}
	out, err := exec.Command("thin_dump", meta).CombinedOutput()
	if err != nil {
		t.Fatalf("thin_dump %s: %v\n%s", meta, err, out)
	}
	return string(out)
}

// failsWith runs dmsetup, which must fail with the errno text.
func (e *dmsetupEnv) failsWith(text string, args ...string) {
	e.t.Helper()
	_, errs, code := e.dmsetup("", args...)
	if code == 0 || !strings.Contains(errs, "failed: "+text) {
		e.t.Errorf("dmsetup %s: exit %d, %q; want %q", strings.Join(args, " "), code, errs, text)
	}
}

// TestThinContainerdSequence: a pool over two loop devices, thin devices
// and a snapshot taken between suspend and resume, the errnos a
// snapshotter matches, info columns, remove --retry by /dev/mapper path.
func TestThinContainerdSequence(t *testing.T) {
	requireTool(t, "thin_check", "thin_dump")
	e := newDmsetupEnv(t)
	meta, data := e.loop("meta", 16<<20), e.loop("data", 64<<20)
	pool, th, snap := e.name("pool"), e.name("thin"), e.name("snap")
	e.createPool(pool, fmt.Sprintf("0 131072 thin-pool %s %s 128 32768 1 skip_block_zeroing", meta, data))
	if got := strings.TrimSpace(e.must("table", pool)); !strings.HasSuffix(got, "128 32768 1 skip_block_zeroing") {
		t.Errorf("pool table %q", got)
	}
	if got := e.must("status", pool); !strings.HasSuffix(got, "/4096 0/1024 - rw discard_passdown queue_if_no_space - 1024 \n") {
		t.Errorf("pool status %q", got)
	}
	e.must("message", pool, "0", "create_thin 1")
	e.failsWith("File exists", "message", pool, "0", "create_thin 1")
	e.must("create", th, "--table", "0 32768 thin /dev/mapper/"+pool+" 1")
	if got := e.must("status", th); got != "0 32768 thin 0 -\n" {
		t.Errorf("fresh thin status %q", got)
	}
	run(t, "mkfs.ext4", "-q", "/dev/mapper/"+th)
	mnt := e.mountDev("/dev/mapper/"+th, "thin-mnt")
	writeFile(t, filepath.Join(mnt, "layer"), "base layer", true)
	run(t, "umount", mnt)

	e.must("suspend", th)
	e.must("message", pool, "0", "create_snap 2 1")
	e.must("resume", th)
	e.failsWith("File exists", "message", pool, "0", "create_snap 2 1")
	e.failsWith("No data available", "message", pool, "0", "create_snap 3 99")
	e.failsWith("No data available", "message", pool, "0", "delete 99")
	e.failsWith("Device or resource busy", "message", pool, "0", "delete 1")
	e.failsWith("Invalid argument", "message", pool, "0", "create_thin")
	e.must("create", snap, "--table", "0 32768 thin /dev/mapper/"+pool+" 2")
	smnt := e.mountDev("/dev/mapper/"+snap, "snap-mnt")
	writeFile(t, filepath.Join(smnt, "upper"), "snapshot layer", true)
	if b, err := os.ReadFile(filepath.Join(smnt, "layer")); err != nil || string(b) != "base layer" {
		t.Errorf("snapshot reads %q, %v", b, err)
	}
	run(t, "umount", smnt)

	cols := strings.Fields(e.must("info", "-c", "--noheadings", "-o", "name,attr,open,segments,events", "--separator", " ", snap))
	if len(cols) != 5 || cols[0] != snap || cols[1] != "L--w" || cols[2] != "0" || cols[3] != "1" {
		t.Errorf("info columns %q", cols)
	}
	if _, _, code := e.dmsetup("", "remove", pool); code == 0 {
		t.Error("removed a pool that thin devices use")
	}
	e.must("remove", "--retry", "/dev/mapper/"+snap)
	e.must("remove", "--retry", "/dev/mapper/"+th)
	e.must("message", pool, "0", "delete 2")
	if got := e.must("status", pool); !strings.Contains(got, " rw ") {
		t.Errorf("pool status %q", got)
	}
	e.must("remove", pool)
	dump := thinCheck(t, meta)
	if !strings.Contains(dump, `<device dev_id="1"`) || strings.Contains(dump, `dev_id="2"`) {
		t.Errorf("thin_dump:\n%s", dump)
	}
	// The pool opens again over the metadata it wrote.
	e.createPool(pool, fmt.Sprintf("0 131072 thin-pool %s %s 128 32768 0", meta, data))
	e.must("create", th, "--table", "0 32768 thin /dev/mapper/"+pool+" 1")
	if got := e.must("status", th); got == "0 32768 thin 0 -\n" {
		t.Errorf("thin device empty after reopening: %q", got)
	}
	e.must("remove", th, pool)
	thinCheck(t, meta)
}

// TestThinXfstestsSequence: common/dmthin's pool on two linear devices
// carved from one device, the metadata's first 4 KiB zeroed, a file system
// filled past the low water mark and out of space, error_if_no_space and
// growth by reload.
func TestThinXfstestsSequence(t *testing.T) {
	requireTool(t, "thin_check", "thin_dump")
	e := newDmsetupEnv(t)
	dev := e.loop("scratch", 128<<20)
	meta, data, pool, vol := e.name("meta"), e.name("data"), e.name("pool"), e.name("vol")
	const metaSectors, dataSectors = 8192, 98304 // 4 MiB, 48 MiB
	e.must("create", meta, "--table", fmt.Sprintf("0 %d linear %s 0", metaSectors, dev))
	e.must("create", data, "--table", fmt.Sprintf("0 %d linear %s %d", dataSectors, dev, metaSectors))
	run(t, "dd", "if=/dev/zero", "of=/dev/mapper/"+meta, "bs=4096", "count=1", "oflag=direct", "status=none")
	// 64 KiB blocks; low water mark 128 blocks (8 MiB) of 768.
	poolTable := func(sectors int, extra string) string {
		return fmt.Sprintf("0 %d thin-pool /dev/mapper/%s /dev/mapper/%s 128 128 %s", sectors, meta, data, extra)
	}
	e.createPool(pool, poolTable(dataSectors, "0"))
	// common/dmthin reads the block size and the low water mark as $7 and
	// $8 of the pool's line of `dmsetup table`, which starts with its name.
	var fields []string
	for _, l := range strings.Split(e.must("table"), "\n") {
		if strings.HasPrefix(l, pool+": ") {
			fields = strings.Fields(l)
		}
	}
	if len(fields) < 8 || fields[6] != "128" || fields[7] != "128" {
		t.Errorf("table fields %q", fields)
	}
	e.must("message", pool, "0", "create_thin 0")
	e.must("create", vol, "--table", "0 262144 thin /dev/mapper/"+pool+" 0") // 128 MiB virtual
	run(t, "mkfs.ext4", "-q", "-E", "nodiscard", "/dev/mapper/"+vol)
	mnt := e.mountDev("/dev/mapper/"+vol, "vol-mnt")
	events := func() int {
		f := strings.Fields(e.must("info", "-c", "--noheadings", "-o", "events", pool))
		n, _ := strconv.Atoi(f[0])
		return n
	}
	ev := events()
	// Past the low water mark: an event.
	run(t, "dd", "if=/dev/urandom", "of="+filepath.Join(mnt, "a"), "bs=1M", "count=42", "oflag=direct", "status=none")
	if events() <= ev {
		t.Errorf("no event past the low water mark (event number %d)", events())
	}
	// error_if_no_space by reload, then out of space.
	e.must("suspend", pool)
	e.must("load", pool, "--table", poolTable(dataSectors, "1 error_if_no_space"))
	e.must("resume", pool)
	out, code := e.sh("dd if=/dev/urandom of=" + filepath.Join(mnt, "b") + " bs=1M count=32 oflag=direct status=none")
	// The pool fails a write that needs a block with ENOSPC, the whole of a
	// request that also covers mapped blocks (the kernel fails the bio with
	// BLK_STS_NOSPC), and ext4 passes it on to the direct write. (A request
	// answered short through FUSE became EIO: TestThinNoSpaceErrnoCrossingBlocks.)
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("filling past the pool: exit %d, %q", code, out)
	}
	if got := e.must("status", pool); !strings.Contains(got, " out_of_data_space discard_passdown error_if_no_space ") {
		t.Errorf("status out of space %q", got)
	}
	// Grow the data device and the pool by reload; a smaller pool is refused.
	e.must("suspend", pool)
	e.must("load", pool, "--table", poolTable(dataSectors/2, "0"))
	if _, _, code := e.dmsetup("", "resume", pool); code == 0 {
		t.Error("resumed a pool smaller than its data")
	}
	e.must("load", data, "--table", fmt.Sprintf("0 %d linear %s %d", 2*dataSectors, dev, metaSectors))
	e.must("resume", data)
	e.must("load", pool, "--table", poolTable(2*dataSectors, "0"))
	e.must("resume", pool)
	if got := e.must("status", pool); !strings.Contains(got, "/1536 - rw discard_passdown queue_if_no_space - ") {
		t.Errorf("status after growth %q", got)
	}
	run(t, "dd", "if=/dev/urandom", "of="+filepath.Join(mnt, "c"), "bs=1M", "count=8", "oflag=direct", "status=none")
	run(t, "rm", filepath.Join(mnt, "a"))
	run(t, "fstrim", mnt)
	run(t, "umount", mnt)
	run(t, "e2fsck", "-fn", "/dev/mapper/"+vol)
	e.must("remove", vol, pool)
	dump := thinCheck(t, "/dev/mapper/"+meta)
	if !strings.Contains(dump, `nr_data_blocks="1536"`) {
		t.Errorf("thin_dump:\n%s", dump)
	}
	e.must("remove", data, meta)
}

// TestThinStatusNoFlush: `dmsetup status` of a pool commits its metadata
// first (pool_status) and `dmsetup status --noflush` does not
// (DM_STATUS_NOFLUSH_FLAG): after a write that provisions a block, the
// metadata device is unchanged by status --noflush, whose line already
// counts the block, and changed by the plain status that follows.
func TestThinStatusNoFlush(t *testing.T) {
	requireTool(t, "thin_dump")
	e := newDmsetupEnv(t)
	dir := pcMemDir(t)
	metaImg, dataImg := filepath.Join(dir, "meta.img"), filepath.Join(dir, "data.img")
	sparseFile(t, metaImg, 8<<20)
	sparseFile(t, dataImg, 64<<20)
	pool, vol := e.name("pool"), e.name("vol")
	e.createPool(pool, fmt.Sprintf("0 131072 thin-pool %s %s 128 0", metaImg, dataImg))
	e.must("message", pool, "0", "create_thin 1")
	e.must("create", vol, "--table", "0 131072 thin /dev/mapper/"+pool+" 1")
	readMeta := func() []byte {
		b, err := os.ReadFile(metaImg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	used := func(status string) string {
		if f := strings.Fields(status); len(f) > 5 {
			return f[5]
		}
		return status
	}
	// The pool commits on its own once a second: a round in which that
	// commit falls between the write and the read of the metadata proves
	// nothing, so up to five rounds are tried, each provisioning one more
	// block; status --noflush must leave the metadata alone in one of them,
	// and the plain status must change it in every one.
	unchanged := 0
	for round := range 5 {
		e.must("status", pool) // commits what came before
		before := readMeta()
		e.must("status", pool, "--noflush") // nothing to commit: no change either way
		f, err := os.OpenFile("/dev/mapper/"+vol, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteAt(make([]byte, 4096), int64(round)*65536) // one new block, no flush
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		noflush := e.must("status", pool, "--noflush")
		if got, want := used(noflush), fmt.Sprintf("%d/", round+1); !strings.HasPrefix(got, want) {
			t.Errorf("round %d: status --noflush %q: want %s... data blocks used", round, noflush, want)
		}
		if bytes.Equal(readMeta(), before) {
			unchanged++
		}
		flushed := e.must("status", pool)
		if used(flushed) != used(noflush) {
			t.Errorf("round %d: status %q and status --noflush %q count different blocks", round, flushed, noflush)
		}
		if bytes.Equal(readMeta(), before) {
			t.Errorf("round %d: status left the metadata device unchanged after a provisioning write", round)
		}
		if unchanged > 0 {
			break
		}
	}
	if unchanged == 0 {
		t.Error("status --noflush changed the metadata device in every round: it commits")
	}
	e.must("remove", vol, pool)
	dump := thinCheck(t, metaImg)
	if !strings.Contains(dump, `<device dev_id="1"`) {
		t.Errorf("thin_dump after status --noflush:\n%s", dump)
	}
	e.stopDaemon()
}

// TestThinNoSpaceErrnoCrossingBlocks: on a full error_if_no_space pool, a
// direct write that starts in a mapped block and reaches into one that
// needs space fails with ENOSPC, as the kernel fails the whole bio with
// BLK_STS_NOSPC (dm-thin.c: should_error_unserviceable_bio), not with the
// EIO that a short write through FUSE becomes.
func TestThinNoSpaceErrnoCrossingBlocks(t *testing.T) {
	e := newDmsetupEnv(t)
	dir := pcMemDir(t)
	metaImg, dataImg := filepath.Join(dir, "meta.img"), filepath.Join(dir, "data.img")
	sparseFile(t, metaImg, 4<<20)
	sparseFile(t, dataImg, 4*65536)
	pool, vol := e.name("pool"), e.name("vol")
	e.createPool(pool, fmt.Sprintf("0 512 thin-pool %s %s 128 0 1 error_if_no_space", metaImg, dataImg))
	e.must("message", pool, "0", "create_thin 1")
	e.must("create", vol, "--table", "0 2048 thin /dev/mapper/"+pool+" 1")
	buf, err := unix.Mmap(-1, 0, 2*65536, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = byte(i)
	}
	f, err := os.OpenFile("/dev/mapper/"+vol, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for b := range 4 { // every block of the pool
		if _, err := f.WriteAt(buf[:65536], int64(b)*65536); err != nil {
			t.Fatalf("block %d: %v", b, err)
		}
	}
	for _, c := range []struct {
		what string
		off  int64
		n    int
	}{
		{"from mapped block 3 into block 4", 3*65536 + 61440, 8192},
		{"all of mapped block 3 and block 4", 3 * 65536, 2 * 65536},
		{"into unmapped block 5", 5 * 65536, 4096},
	} {
		n, err := f.WriteAt(buf[:c.n], c.off)
		if !errors.Is(err, unix.ENOSPC) {
			t.Errorf("write %s: %d, %v; want ENOSPC", c.what, n, err)
		}
	}
	if got := e.must("status", pool); !strings.Contains(got, " out_of_data_space ") {
		t.Errorf("pool status %q: want out_of_data_space", got)
	}
	f.Close()
	e.must("remove", vol, pool)
	e.stopDaemon()
}
