package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// The fault target end to end, through FUSE and the dmsetup drop-in: rules
// armed by message, the event log read from the mount, presets' throttles
// measured by fio, one atlas over three devices.

// faultDev makes a fault device over a new sparse file of size bytes with
// the given options and rules, and returns its /dev/mapper path.
func (e *dmsetupEnv) faultDev(name string, size int64, spec string) string {
	e.t.Helper()
	img := filepath.Join(e.dir, name+".img")
	sparseFile(e.t, img, size)
	e.must("create", e.name(name), "--table", fmt.Sprintf("0 %d fault %s 0 %s", size/512, img, spec))
	return "/dev/mapper/" + e.name(name)
}

// events reads MOUNTPOINT/stats/NAME/events.
func (e *dmsetupEnv) events(name string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.run, "mnt", "stats", e.name(name), "events"))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

// TestFaultExt4TornMisdirected: ext4 written through a fault device with no
// rule fscks clean; armed by message with torn and misdirected writes on
// its first 4 MiB (superblock, group descriptors, bitmaps, inode table),
// the same kind of work leaves damage that e2fsck finds, and the event log
// from the mount names the faults it injected.
func TestFaultExt4TornMisdirected(t *testing.T) {
	requireTool(t, "e2fsck", "cp")
	e := newDmsetupEnv(t)
	dev := e.faultDev("f", 128<<20, "seed=7")
	run(t, "mkfs.ext4", "-q", dev)
	work := func(mnt, tag string) {
		// 20 folders of 100 small files and a 256 KiB one each: inodes,
		// directories, bitmaps and data. Errors are expected once the
		// file system notices the damage.
		e.sh(fmt.Sprintf(`for d in $(seq 20); do mkdir -p %[1]s/%[2]s$d; for f in $(seq 100); do echo $d-$f > %[1]s/%[2]s$d/$f; done
			head -c 256K /dev/urandom > %[1]s/%[2]s$d/big; done 2>/dev/null; sync`, mnt, tag))
	}
	mnt := e.mountDev(dev, "mnt")
	work(mnt, "clean")
	run(t, "umount", mnt)
	if out, err := exec.Command("e2fsck", "-fn", dev).CombinedOutput(); err != nil {
		t.Fatalf("with no rule, e2fsck: %v\n%s", err, out)
	}
	if got := e.must("message", e.name("f"), "0", "add", "rule", "name=m", "op=write", "sectors=0+8192", "p=25%", "misdirect=512"); got != "rules 1\n" {
		t.Fatalf("arming misdirect: %q", got)
	}
	if got := e.must("message", e.name("f"), "0", "add", "rule", "name=t", "op=write", "sectors=0+8192", "size=4K-", "p=25%", "tear=512"); got != "rules 2\n" {
		t.Fatalf("arming tear: %q", got)
	}
	run(t, "mount", dev, mnt)
	work(mnt, "faulty")
	run(t, "umount", mnt)
	e.must("message", e.name("f"), "0", "rules")
	out, err := exec.Command("e2fsck", "-fn", dev).CombinedOutput()
	if err == nil {
		t.Errorf("e2fsck found nothing after torn and misdirected writes:\n%s", out)
	}
	log := e.events("f")
	for _, a := range []string{" m misdirect=512 ", " t tear=512 "} {
		if !strings.Contains(log, a) {
			t.Errorf("the event log has no %q event:\n%.2000s", a, log)
		}
	}
	st := strings.Fields(e.must("status", e.name("f")))
	// 0 SECTORS fault STATE IOS EVENTS LATENT STALLED RULES
	if len(st) < 9 || st[8] != "0" {
		t.Errorf("status after the rules were removed: %q", st)
	}
}

// statField is field i (from 0) of MOUNTPOINT/stats/NAME/stat.
func (e *dmsetupEnv) statField(name string, i int) int64 {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.run, "mnt", "stats", e.name(name), "stat"))
	if err != nil {
		e.t.Fatal(err)
	}
	f := strings.Fields(string(b))
	n, err := strconv.ParseInt(f[i], 10, 64)
	if err != nil {
		e.t.Fatalf("stat %q: %v", b, err)
	}
	return n
}

// TestFaultStallByMessage: while fio writes, a stall armed by message holds
// every write (the message answers once it is in force; the write count
// stops, the status counts the stalled I/O), and removing the rule and
// releasing lets fio finish cleanly.
func TestFaultStallByMessage(t *testing.T) {
	requireTool(t, "fio")
	e := newDmsetupEnv(t)
	dev := e.faultDev("s", 64<<20, "")
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := benchkit.RunFio(ctx, "", "--output-format=json", "--name=w", "--filename="+dev, "--rw=randwrite", "--bs=4k",
			"--direct=1", "--ioengine=libaio", "--iodepth=4", "--time_based", "--runtime=3s", "--size=64m")
		done <- err
	}()
	const writes = 4 // field 4 of stat: writes completed
	for deadline := time.Now().Add(time.Minute); e.statField("s", writes) < 100; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("fio did not start writing")
		}
	}
	if got := e.must("message", e.name("s"), "0", "add", "rule", "name=hold", "op=write", "stall"); got != "rules 1\n" {
		t.Fatalf("arming: %q", got)
	}
	// Every write that arrives now stalls; the ones already past the
	// rules complete. Wait for the count to stand still, then hold it.
	stalled := func() int64 {
		n, _ := strconv.ParseInt(strings.Fields(e.must("status", e.name("s")))[7], 10, 64)
		return n
	}
	for deadline := time.Now().Add(10 * time.Second); stalled() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no write stalled")
		}
	}
	before := e.statField("s", writes)
	time.Sleep(4 * time.Second) // past fio's runtime: it waits on the stalled writes
	if after := e.statField("s", writes); after != before {
		t.Errorf("writes completed while stalled: %d then %d", before, after)
	}
	select {
	case err := <-done:
		t.Fatalf("fio ended during the stall: %v", err)
	default:
	}
	if n := stalled(); n < 1 || n > 4 {
		t.Errorf("%d stalled writes at iodepth 4", n)
	}
	e.must("message", e.name("s"), "0", "remove", "hold")
	e.must("message", e.name("s"), "0", "release")
	if err := <-done; err != nil {
		t.Fatalf("fio after release: %v", err)
	}
	if !strings.Contains(e.events("s"), " hold stall ") {
		t.Error("the event log has no stall")
	}
}

// TestFaultPresetIOPS: a device named by a throttled preset (io2 at 1000
// provisioned IOPS) serves fio at its limit, not above it, once the
// bucket's first second of tokens is spent (fio's ramp time).
func TestFaultPresetIOPS(t *testing.T) {
	requireTool(t, "fio")
	e := newDmsetupEnv(t)
	dev := e.faultDev("p", 64<<20, "preset=io2:iops=1000")
	res, err := benchkit.RunFio(context.Background(), "", "--output-format=json", "--name=r", "--filename="+dev, "--rw=randread",
		"--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=16", "--ramp_time=2s", "--time_based", "--runtime=4s", "--size=64m")
	if err != nil {
		t.Fatal(err)
	}
	rd := res.Read.IOPS
	t.Logf("io2:iops=1000: %.0f IOPS", rd)
	// The limit is the point; the floor only says the reads ran (a busy
	// machine may serve fewer than the limit allows).
	if rd > 1000*1.05 || rd < 100 {
		t.Errorf("%.0f IOPS under a 1000 IOPS preset", rd)
	}
}

// TestFaultAtlas: three devices share an atlas that lets at most one of
// them be hit in any 2048-sector region; a rule failing every write on
// each device then fails exactly one device's write per region, and a
// reset forgets the hits.
func TestFaultAtlas(t *testing.T) {
	e := newDmsetupEnv(t)
	const size = 8 << 20
	names := []string{"a0", "a1", "a2"}
	for _, n := range names {
		e.faultDev(n, size, "atlas=rep/1/2048 rule name=x op=write atlas error")
	}
	write := func(n string, region int) bool {
		_, code := e.sh(fmt.Sprintf("dd if=/dev/urandom of=/dev/mapper/%s bs=4k count=1 seek=%d oflag=direct 2>/dev/null", e.name(n), region*256))
		return code == 0
	}
	const regions = size / 512 / 2048
	for r := 0; r < regions; r++ {
		failed := 0
		for _, n := range names {
			if !write(n, r) {
				failed++
			}
		}
		if failed != 1 {
			t.Errorf("region %d: %d of 3 devices failed a write, want 1", r, failed)
		}
	}
	// The first device's rule took every region first: the others wrote.
	if got := strings.Count(e.events("a0"), " x error "); got != regions {
		t.Errorf("a0 logged %d errors, want %d", got, regions)
	}
	if got := e.events("a1") + e.events("a2"); got != "" {
		t.Errorf("a1 and a2 logged faults:\n%s", got)
	}
	e.must("message", e.name("a0"), "0", "rules")
	e.must("message", e.name("a0"), "0", "reset")
	if write("a0", 0) == false || write("a1", 0) == true {
		t.Error("after a reset and a0's rules removed, a1 is not the one hit")
	}
}
