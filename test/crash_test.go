package test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// crashBlock is the write size of the crash tests; every 512-byte sector of
// a block carries its block number and generation, so that a block torn by
// the kill shows which of its sectors are old and which new.
const crashBlock = 4096

// stampBlock fills b with block blk's generation gen.
func stampBlock(b []byte, blk, gen uint64) {
	for s := 0; s < len(b); s += sector {
		binary.LittleEndian.PutUint64(b[s:], 0xd0f05e<<40|blk)
		binary.LittleEndian.PutUint64(b[s+8:], gen)
		for i := s + 16; i < s+sector; i++ {
			b[i] = byte(gen*31 + blk + uint64(i))
		}
	}
}

// sectorGen returns the generation a sector of block blk holds: 0 for a
// sector never written (all zeros); an error if it holds neither zeros nor
// a well-formed stamp of blk.
func sectorGen(b []byte, blk uint64, s int) (uint64, error) {
	sec := b[s : s+sector]
	if hdr := binary.LittleEndian.Uint64(sec); hdr != 0xd0f05e<<40|blk {
		for _, c := range sec {
			if c != 0 {
				return 0, fmt.Errorf("block %d sector %d: foreign header %#x", blk, s/sector, hdr)
			}
		}
		return 0, nil
	}
	gen := binary.LittleEndian.Uint64(sec[8:])
	for i := 16; i < sector; i++ {
		if sec[i] != byte(gen*31+blk+uint64(s+i)) {
			return 0, fmt.Errorf("block %d sector %d: generation %d with corrupt byte %d", blk, s/sector, gen, i)
		}
	}
	return gen, nil
}

// crashWriters write stamped blocks to one file from several goroutines,
// each owning the blocks i with i%jobs == job, and remember per block the
// last generation whose write returned (acknowledged) and the one in flight.
type crashWriters struct {
	path   string
	blocks int
	jobs   int
	acked  []uint64
	flight []uint64
	done   atomic.Int64
	fsyncs atomic.Int64
	wg     sync.WaitGroup
	errMu  sync.Mutex
	errs   []error // the errors that stopped each job
}

func startCrashWriters(t *testing.T, path string, blocks, jobs int) *crashWriters {
	w := &crashWriters{path: path, blocks: blocks, jobs: jobs, acked: make([]uint64, blocks), flight: make([]uint64, blocks)}
	for j := range jobs {
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.wg.Go(func() {
			defer f.Close()
			w.run(f, j)
		})
	}
	return w
}

func (w *crashWriters) run(f *os.File, job int) {
	buf := alignedBuf(crashBlock)
	for i := 0; ; i++ {
		blk := (i*7919+job*13)%(w.blocks/w.jobs)*w.jobs + job
		gen := w.acked[blk] + 1
		stampBlock(buf, uint64(blk), gen)
		w.flight[blk] = gen
		_, err := f.WriteAt(buf, int64(blk)*crashBlock)
		if err == nil && i%16 == 15 {
			// fsync returns only after the daemon's fdatasync of every
			// backing file returned.
			if err = f.Sync(); err == nil {
				w.fsyncs.Add(1)
			}
		}
		if err != nil {
			w.errMu.Lock()
			w.errs = append(w.errs, err)
			w.errMu.Unlock()
			return
		}
		w.acked[blk] = gen
		w.flight[blk] = 0
		w.done.Add(1)
	}
}

// waitDone waits until more than n writes were acknowledged.
func (w *crashWriters) waitDone(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for w.done.Load() <= n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d writes acknowledged within 30s", w.done.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wait waits for every job to stop (they stop at their first error) and
// checks that each stopped because the daemon went away.
func (w *crashWriters) wait(t *testing.T) {
	t.Helper()
	w.wg.Wait()
	for _, err := range w.errs {
		if !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) &&
			!errors.Is(err, syscall.ECANCELED) && !errors.Is(err, syscall.EIO) {
			t.Errorf("a writer stopped with %v, want ENOTCONN, ECONNABORTED, ECANCELED or (through a loop device) EIO", err)
		}
	}
}

// verify checks data (the whole device, offset 0) against what was
// acknowledged: each sector of a block holds its last acknowledged
// generation, or the generation that was in flight at the kill.
func (w *crashWriters) verify(t *testing.T, what string, data []byte) {
	t.Helper()
	bad, torn := 0, 0
	for blk := range w.blocks {
		b := data[blk*crashBlock : (blk+1)*crashBlock]
		var gens []uint64
		for s := 0; s < crashBlock; s += sector {
			g, err := sectorGen(b, uint64(blk), s)
			if err == nil && g != w.acked[blk] && (w.flight[blk] == 0 || g != w.flight[blk]) {
				err = fmt.Errorf("block %d sector %d: generation %d, acknowledged %d, in flight %d",
					blk, s/sector, g, w.acked[blk], w.flight[blk])
			}
			if err != nil {
				if bad++; bad <= 5 {
					t.Errorf("%s: %v", what, err)
				}
			}
			gens = append(gens, g)
		}
		for _, g := range gens {
			if g != gens[0] {
				torn++
				break
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d sectors lost acknowledged writes", what, bad)
	}
	t.Logf("%s: %d blocks checked, %d writes and %d fsyncs acknowledged before the kill, %d blocks with the in-flight write partly applied",
		what, w.blocks, w.done.Load(), w.fsyncs.Load(), torn)
}

// killDaemon kills d with SIGKILL and waits until its mount reports ENOTCONN.
func killDaemon(t *testing.T, d *daemon, probe string) {
	t.Helper()
	d.cmd.Process.Kill()
	err := <-d.done
	d.done <- err
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := os.Stat(probe)
		if errors.Is(err, syscall.ENOTCONN) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after kill -9: %v, want ENOTCONN", err)
		}
	}
}

// crashConfig stacks top (linear) on st (striped over two files), beside
// lin (linear over a third file, checked on the file itself).
func crashConfig(t *testing.T, dir string, sectors int) string {
	for _, n := range []string{"a.img", "b.img", "c.img"} {
		sparseFile(t, filepath.Join(dir, n), int64(sectors)*sector)
	}
	return fmt.Sprintf("st,,,rw,0 %d striped 2 16 ./a.img 0 ./b.img 0;\n"+
		"top,,,rw,0 %d linear st 0;\n"+
		"lin,,,rw,0 %d linear ./c.img 0;\n", 2*sectors, 2*sectors, sectors)
}

// TestCrashKillDuringIO kills the daemon with SIGKILL while writers hammer a
// stacked device and a linear one with O_DIRECT writes and fsyncs: every
// write acknowledged before the kill is on the backing files, and the next
// `dmfuse mount` on the same folder clears the dead mount and serves the same
// data. It runs with the backing files on disk (pread and pwrite), on
// tmpfs (mapped in memory: filemap.go) and behind loop devices (block
// devices, written with direct I/O where aligned: filedirect.go).
func TestCrashKillDuringIO(t *testing.T) {
	t.Run("disk", func(t *testing.T) { crashKillDuringIO(t, t.TempDir(), false) })
	t.Run("tmpfs", func(t *testing.T) { crashKillDuringIO(t, lwMemDir(t), false) })
	t.Run("block", func(t *testing.T) { crashKillDuringIO(t, t.TempDir(), true) })
}

func crashKillDuringIO(t *testing.T, dir string, block bool) {
	const sectors = 8192 // 4 MiB per file
	cfg := crashConfig(t, dir, sectors)
	linBacking := filepath.Join(dir, "c.img")
	if block {
		// The same table over loop devices over the files.
		requireTool(t, "losetup")
		for _, n := range []string{"a.img", "b.img", "c.img"} {
			loop := strings.TrimSpace(run(t, "losetup", "-f", "--show", filepath.Join(dir, n)))
			t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
			cfg = strings.ReplaceAll(cfg, "./"+n, loop)
			if n == "c.img" {
				linBacking = loop
			}
		}
	}
	d := startDaemon(t, dir, cfg)
	wTop := startCrashWriters(t, d.path("top"), 2*sectors*sector/crashBlock, 4)
	wLin := startCrashWriters(t, d.path("lin"), sectors*sector/crashBlock, 2)
	wTop.waitDone(t, 3000)
	wLin.waitDone(t, 1000)
	killDaemon(t, d, d.path("lin"))
	wTop.wait(t)
	wLin.wait(t)

	// The linear device's data is on its backing file or device at once.
	c, err := os.ReadFile(linBacking)
	if err != nil {
		t.Fatal(err)
	}
	wLin.verify(t, linBacking+" after kill -9", c)

	d2 := startDaemon(t, dir, cfg)
	if !strings.Contains(d2.stderr.String(), "cleared a stale mount") {
		t.Errorf("the new daemon did not say it cleared the stale mount: %s", d2.stderr)
	}
	for _, c := range []struct {
		name string
		w    *crashWriters
	}{{"top", wTop}, {"lin", wLin}} {
		data, err := os.ReadFile(d2.path(c.name))
		if err != nil {
			t.Fatalf("%s after restart: %v", c.name, err)
		}
		c.w.verify(t, c.name+" after restart", data)
	}
	// The new mount takes writes again.
	if err := os.WriteFile(d2.path("lin"), make([]byte, crashBlock), 0); err != nil {
		t.Errorf("write after restart: %v", err)
	}
}

// TestCrashKillWithLoop kills the daemon while writers go through a loop
// device attached to a device file: the next `dmfuse mount` clears the dead
// mount and names the loop device, which stays broken until `losetup -d`;
// the acknowledged writes are there after the restart.
func TestCrashKillWithLoop(t *testing.T) {
	requireTool(t, "losetup")
	dir := t.TempDir()
	const sectors = 8192
	cfg := crashConfig(t, dir, sectors)
	d := startDaemon(t, dir, cfg)
	loop := strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", d.path("top")))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	w := startCrashWriters(t, loop, 2*sectors*sector/crashBlock, 4)
	w.waitDone(t, 2000)
	killDaemon(t, d, d.path("top"))
	w.wait(t)

	d2 := startDaemon(t, dir, cfg)
	errs := d2.stderr.String()
	for _, want := range []string{"cleared a stale mount", "stays broken until `losetup -d`", "losetup -d " + loop} {
		if !strings.Contains(errs, want) {
			t.Errorf("the new daemon's message lacks %q: %s", want, errs)
		}
	}
	// The loop device still points at the dead mount.
	f, err := os.OpenFile(loop, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(crashBlock)
	if _, err := f.ReadAt(buf, 0); err == nil {
		t.Errorf("a read through %s, attached to the dead mount, succeeded", loop)
	}
	f.Close()
	run(t, "losetup", "-d", loop)

	data, err := os.ReadFile(d2.path("top"))
	if err != nil {
		t.Fatal(err)
	}
	w.verify(t, "top after restart (written through "+loop+")", data)
}
