package test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/fs/export"
)

// Crash safety of thin provisioning: power cuts under the pool's devices,
// the metadata at every flush of a log, and a daemon killed with SIGKILL.

// tcSeed is the first seed of the thin power-cut rounds: DMFUSE_THIN_SEED
// when set (to replay a failure), else the clock.
func tcSeed(t *testing.T) uint64 {
	if s := os.Getenv("DMFUSE_THIN_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DMFUSE_THIN_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// tcFile writes a file of random contents made from rng, fsynced when
// sync, and returns the contents.
func tcFile(t *testing.T, rng *rand.Rand, path string, sync bool) string {
	t.Helper()
	b := make([]byte, 4096+rng.IntN(64<<10))
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	writeFile(t, path, string(b), sync)
	return string(b)
}

// tcVerify mounts dev (replaying its journal), checks that every file of
// want reads back with its contents, unmounts it and runs e2fsck -fn.
func (e *dmsetupEnv) tcVerify(dev, mntName string, want map[string]string) {
	t := e.t
	t.Helper()
	mnt := e.mountDev(dev, mntName)
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil {
			t.Errorf("%s: fsynced file %s: %v", dev, name, err)
		} else if !bytes.Equal(got, []byte(data)) {
			t.Errorf("%s: fsynced file %s differs from byte %d (%d bytes, want %d)", dev, name, firstDiff(got, []byte(data)), len(got), len(data))
		}
	}
	run(t, "umount", mnt)
	if out, err := exec.Command("e2fsck", "-fn", dev).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", dev, err, out)
	}
}

// TestThinPowerCut: a pool whose metadata and data devices are both
// powercut devices over tmpfs files; ext4 on a thin volume, a workload of
// fsynced and unsynced files, a snapshot taken with suspend, create_snap
// and resume, and files deleted with discards (fstrim); the power of both
// devices is cut after a random step of the workload (seeded, each cached
// write surviving or not at random): in even rounds while a writer works,
// in odd ones after an in-place overwrite left the data device holding
// writes no flush covered (checked). After power_on, thin_check is clean
// on the metadata, the recreated pool serves the thin volume and its
// snapshot, every fsynced file reads back, and e2fsck finds both clean.
func TestThinPowerCut(t *testing.T) {
	requireTool(t, "thin_check", "thin_dump", "e2fsck", "fstrim")
	seed := tcSeed(t)
	t.Logf("seed %d (DMFUSE_THIN_SEED=%d replays it)", seed, seed)
	const rounds = 4
	for r := range rounds {
		rs := seed + uint64(r)
		t.Run(fmt.Sprintf("round%d-seed%d", r, rs), func(t *testing.T) { thinPowerCutRound(t, rs, r%2 == 1) })
	}
}

// thinPowerCutRound runs one round; with dirty, the cut comes after the
// writer stopped and an in-place overwrite left the data device holding
// cached writes that no flush covered (checked), rather than at a random
// moment of the writer's work.
func thinPowerCutRound(t *testing.T, seed uint64, dirty bool) {
	rng := rand.New(rand.NewPCG(seed, 0x7468696e))
	e := newDmsetupEnv(t)
	dir := pcMemDir(t)
	const metaSectors, dataSectors = 16384, 131072 // 8 MiB, 64 MiB
	metaImg, dataImg := filepath.Join(dir, "meta.img"), filepath.Join(dir, "data.img")
	sparseFile(t, metaImg, metaSectors*sector)
	sparseFile(t, dataImg, dataSectors*sector)
	meta, data, pool, vol, snap := e.name("meta"), e.name("data"), e.name("pool"), e.name("vol"), e.name("snap")
	e.must("create", meta, "--table", fmt.Sprintf("0 %d powercut %s 0", metaSectors, metaImg))
	e.must("create", data, "--table", fmt.Sprintf("0 %d powercut %s 0", dataSectors, dataImg))
	poolTable := fmt.Sprintf("0 %d thin-pool /dev/mapper/%s /dev/mapper/%s 128 256 0", dataSectors, meta, data)
	e.createPool(pool, poolTable)
	e.must("message", pool, "0", "create_thin 1")
	e.must("create", vol, "--table", "0 131072 thin /dev/mapper/"+pool+" 1")
	run(t, "mkfs.ext4", "-q", "/dev/mapper/"+vol)
	mnt := e.mountDev("/dev/mapper/"+vol, "vol-mnt")

	// durable: the files fsynced (and not deleted since) on the volume;
	// inSnap: those the snapshot holds.
	durable, inSnap := map[string]string{}, map[string]string{}
	snapped, committedSnap := false, false
	write := func(prefix string, sync bool) {
		for i := range 4 {
			name := fmt.Sprintf("%s%d", prefix, i)
			data := tcFile(t, rng, filepath.Join(mnt, name), sync)
			if sync {
				durable[name] = data
				if snapped {
					committedSnap = true // the fsync's flush commits the pool
				}
			}
		}
	}
	steps := []func(){
		func() { write("a", true) },
		func() { write("b", false) },
		func() {
			e.must("suspend", vol)
			e.must("message", pool, "0", "create_snap 2 1")
			e.must("resume", vol)
			snapped = true
			for k, v := range durable {
				inSnap[k] = v
			}
		},
		func() { write("c", true) },
		func() {
			for _, n := range []string{"a0", "a1", "c0"} {
				if err := os.Remove(filepath.Join(mnt, n)); err != nil {
					t.Fatal(err)
				}
				delete(durable, n)
			}
			run(t, "sync")
			run(t, "fstrim", mnt)
		},
		func() { write("d", true) },
		func() { write("e", false) },
	}
	cut := 1 + rng.IntN(len(steps))
	for _, step := range steps[:cut] {
		step()
	}
	// The cut comes while a writer creates files, one of four fsynced
	// and the others written out in place without a flush, so that it
	// falls among
	// data writes, metadata writes and commits: the files whose fsync
	// returned before it must survive.
	cutSeeds := [2]uint64{rng.Uint64(), rng.Uint64()}
	delay := time.Duration(rng.IntN(400)) * time.Millisecond
	wrng := rand.New(rand.NewPCG(rng.Uint64(), 1))
	stop := make(chan struct{})
	type synced struct{ name, data string }
	done := make(chan []synced)
	go func() {
		var ok []synced
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- ok
				return
			default:
			}
			// Fsynced files are new; the others overwrite one of four
			// files in place, on blocks the pool has provisioned.
			name, flags := fmt.Sprintf("w%d", i), os.O_CREATE|os.O_WRONLY|os.O_TRUNC
			if i%4 != 0 {
				name, flags = fmt.Sprintf("u%d", i%4), os.O_CREATE|os.O_WRONLY
			}
			b := make([]byte, 4096+wrng.IntN(32<<10))
			for j := range b {
				b[j] = byte('A' + wrng.IntN(26))
			}
			f, err := os.OpenFile(filepath.Join(mnt, name), flags, 0o644)
			if err == nil {
				_, err = f.Write(b)
				if err == nil && i%4 != 0 {
					// Written out without a flush: cached below.
					err = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
				} else if err == nil {
					err = f.Sync()
				}
				f.Close()
			}
			if err != nil {
				<-stop
				done <- ok
				return
			}
			if i%4 == 0 {
				ok = append(ok, synced{name, string(b)})
			}
		}
	}()
	time.Sleep(delay)
	var ws []synced
	stopWriter := func() {
		close(stop)
		ws = <-done
	}
	if dirty {
		// The writer stops; a file is written and fsynced, then
		// overwritten in place and written out without a flush, so
		// that the data device holds cached writes when the power
		// goes (the pool has nothing to commit for an overwrite of
		// provisioned blocks, and ext4's next journal commit is seconds
		// away).
		stopWriter()
		p := filepath.Join(mnt, "p")
		b := []byte(tcFile(t, rng, p, true))
		for j := range b {
			b[j] = byte('a' + rng.IntN(26))
		}
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteAt(b, 0)
		if err == nil {
			err = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
		f.Close()
		if err != nil {
			t.Fatalf("overwrite of %s: %v", p, err)
		}
		if st := e.must("status", data); strings.Contains(st, " cached 0 ") {
			t.Fatalf("the data device holds no cached write before the cut: %s", st)
		}
	}
	t.Logf("power cut after step %d of %d and %v of writes (dirty %v); power_cut random %d (data), %d (metadata)", cut, len(steps), delay, dirty, cutSeeds[0], cutSeeds[1])
	for i, dev := range []string{data, meta} {
		t.Logf("%s", strings.TrimSpace(e.must("status", dev)))
		t.Logf("%s", strings.TrimSpace(e.must("message", dev, "0", "power_cut random "+strconv.FormatUint(cutSeeds[i], 10))))
	}
	if !dirty {
		stopWriter()
	}
	t.Logf("%d files fsynced by the writer before the cut", len(ws))
	for _, w := range ws {
		durable[w.name] = w.data
	}

	// Everything above the dead devices goes away; the pool's last
	// commit fails.
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Logf("umount after the cut: %v: %s", err, bytes.TrimSpace(out))
		unix.Unmount(mnt, unix.MNT_DETACH)
	}
	e.must("remove", "--retry", vol)
	if out, errs, code := e.dmsetup("", "remove", pool); code != 0 {
		t.Logf("remove of the pool without power: exit %d %s%s", code, out, errs)
		e.must("remove", "-f", pool)
	}
	for _, dev := range []string{meta, data} {
		e.must("message", dev, "0", "power_on")
	}
	dump := thinCheck(t, "/dev/mapper/"+meta)
	hasSnap := strings.Contains(dump, `<device dev_id="2"`)
	if !strings.Contains(dump, `<device dev_id="1"`) {
		t.Fatalf("thin device 1 lost:\n%s", dump)
	}
	if committedSnap && !hasSnap {
		t.Errorf("the snapshot, committed by a later fsync, is lost:\n%s", dump)
	}
	if !snapped && hasSnap {
		t.Errorf("a snapshot never taken is in the metadata:\n%s", dump)
	}

	e.createPool(pool, poolTable)
	e.must("create", vol, "--table", "0 131072 thin /dev/mapper/"+pool+" 1")
	e.tcVerify("/dev/mapper/"+vol, "vol-again", durable)
	if hasSnap {
		e.must("create", snap, "--table", "0 131072 thin /dev/mapper/"+pool+" 2")
		e.tcVerify("/dev/mapper/"+snap, "snap-mnt", inSnap)
		e.must("remove", snap)
	}
	e.must("remove", vol, pool)
	thinCheck(t, "/dev/mapper/"+meta)
	e.must("remove", meta, data)
	if export.Mounted(mnt) {
		t.Errorf("%s still mounted", mnt)
	}
	e.stopDaemon()
}

// stopDaemon stops the daemon with `dmfuse stop` and waits until it has
// exited.
func (e *dmsetupEnv) stopDaemon() {
	t := e.t
	t.Helper()
	pid := e.pid()
	if pid == 0 {
		return
	}
	stop := exec.Command(dmfuseBin, "stop")
	stop.Env = e.env
	if out, err := stop.CombinedOutput(); err != nil {
		t.Fatalf("dmfuse stop: %v\n%s", err, out)
	}
	start := time.Now()
	for alive(pid) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("daemon %d still runs 10 s after dmfuse stop", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Logf("daemon %d exited %v after dmfuse stop returned", pid, d)
	}
}

// TestThinLogWritesMetadata: a pool whose metadata device is a log-writes
// device; a workload of provisioning writes, fsyncs, a snapshot and
// discards; then the metadata replayed to every FLUSH point of the log
// after the pool's creation passes thin_check.
func TestThinLogWritesMetadata(t *testing.T) {
	requireTool(t, "thin_check", "thin_dump", "fstrim")
	e := newDmsetupEnv(t)
	dir := lwMemDir(t)
	const metaSectors = 16384 // 8 MiB
	metaImg, logImg := filepath.Join(dir, "meta.img"), filepath.Join(dir, "log.img")
	sparseFile(t, metaImg, metaSectors*sector)
	sparseFile(t, logImg, 256<<20)
	data := e.loop("data", 64<<20)
	lw, pool, vol := e.name("lw"), e.name("pool"), e.name("vol")
	e.must("create", lw, "--table", fmt.Sprintf("0 %d log-writes %s %s", metaSectors, metaImg, logImg))
	e.createPool(pool, fmt.Sprintf("0 131072 thin-pool /dev/mapper/%s %s 128 256 0", lw, data))
	e.must("message", lw, "0", "mark pool")
	e.must("message", pool, "0", "create_thin 1")
	e.must("create", vol, "--table", "0 131072 thin /dev/mapper/"+pool+" 1")
	run(t, "mkfs.ext4", "-q", "/dev/mapper/"+vol)
	mnt := e.mountDev("/dev/mapper/"+vol, "vol-mnt")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 12 {
		tcFile(t, rng, filepath.Join(mnt, fmt.Sprintf("a%d", i)), true)
	}
	e.must("suspend", vol)
	e.must("message", pool, "0", "create_snap 2 1")
	e.must("resume", vol)
	for i := range 12 {
		tcFile(t, rng, filepath.Join(mnt, fmt.Sprintf("a%d", i)), true) // breaks sharing
		if i%2 == 0 {
			if err := os.Remove(filepath.Join(mnt, fmt.Sprintf("a%d", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(t, "sync")
	run(t, "fstrim", mnt)
	e.must("message", pool, "0", "delete 2")
	run(t, "umount", mnt)
	e.must("remove", vol, pool, lw)
	e.stopDaemon()
	thinCheck(t, metaImg)

	script := "#!/bin/sh\nexec thin_check \"${1:-$DMFUSE_REPLAY_TARGET}\"\n"
	if err := os.WriteFile(filepath.Join(dir, "check.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	sparseFile(t, filepath.Join(dir, "r.img"), metaSectors*sector)
	out := mustReplayLog(t, dir, "dmfuse", "--log", "log.img", "--replay", "r.img", "--each", "flush", "--each-from", "pool", "--fsck", "./check.sh")
	var points int
	if _, err := fmt.Sscanf(out[strings.LastIndex(out, "\nall ")+1:], "all %d", &points); err != nil || points < 10 {
		t.Fatalf("--each: %d flush points checked (want at least 10):\n%s", points, out)
	}
	t.Logf("%s", out[strings.LastIndex(out[:len(out)-1], "\n")+1:])
	replayed, err := os.ReadFile(filepath.Join(dir, "r.img"))
	if err != nil {
		t.Fatal(err)
	}
	final, err := os.ReadFile(metaImg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(replayed, final) {
		t.Errorf("the whole log replayed differs from the metadata device from byte %d", firstDiff(replayed, final))
	}
}

// TestThinKilledDaemon: a daemon killed with SIGKILL loses no committed
// transaction: thin devices created, the transaction id set and data
// written and flushed before the kill are all there when the next daemon
// opens the pool again.
func TestThinKilledDaemon(t *testing.T) {
	requireTool(t, "thin_check", "thin_dump")
	e := newDmsetupEnv(t)
	meta, data := e.loop("meta", 16<<20), e.loop("data", 64<<20)
	pool, vol := e.name("pool"), e.name("vol")
	poolTable := fmt.Sprintf("0 131072 thin-pool %s %s 128 256 0", meta, data)
	e.createPool(pool, poolTable)
	e.must("message", pool, "0", "create_thin 1")
	e.must("message", pool, "0", "set_transaction_id 0 1")
	e.must("create", vol, "--table", "0 65536 thin /dev/mapper/"+pool+" 1")
	want := make([]byte, 3<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	f, err := os.OpenFile("/dev/mapper/"+vol, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	e.must("message", pool, "0", "create_thin 2")
	e.must("message", pool, "0", "set_transaction_id 1 2")
	if f := strings.Fields(e.must("status", pool)); len(f) < 4 || f[3] != "2" {
		t.Fatalf("pool status %q: want transaction id 2", f)
	}

	pid := e.pid()
	if pid == 0 {
		t.Fatal("no daemon pid")
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Gone, not only a zombie leader whose threads still hold its sockets.
	for deadline := time.Now().Add(5 * time.Second); unix.Kill(pid, 0) == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed daemon is still there")
		}
	}
	if out, errs, code := e.dmsetup("", "ls"); code != 0 || out != "No devices found\n" || !strings.Contains(errs, "died; cleaned up:") {
		t.Fatalf("first command after the kill: exit %d, %q, %q", code, out, errs)
	}
	dump := thinCheck(t, meta)
	if !strings.Contains(dump, `transaction="2"`) || !strings.Contains(dump, `<device dev_id="2"`) {
		t.Errorf("thin_dump after the kill:\n%s", dump)
	}

	e.createPool(pool, poolTable)
	if f := strings.Fields(e.must("status", pool)); len(f) < 4 || f[3] != "2" {
		t.Errorf("pool status after the kill %q: want transaction id 2", f)
	}
	e.failsWith("File exists", "message", pool, "0", "create_thin 2")
	e.must("create", vol, "--table", "0 65536 thin /dev/mapper/"+pool+" 1")
	got := make([]byte, len(want))
	f, err = os.Open("/dev/mapper/" + vol)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(got, 1<<20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("flushed data differs after the kill from byte %d", firstDiff(got, want))
	}
	e.must("remove", vol, pool)
	e.stopDaemon()
	thinCheck(t, meta)
}
