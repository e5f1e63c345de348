package test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/fs/export"
)

var (
	pcSeed   = flag.Uint64("powercut.seed", 0, "first workload seed of the powercut file system tests (0: from the clock; printed)")
	pcRounds = flag.Int("powercut.rounds", 20, "rounds per cut mode of the powercut file system tests")
)

// pcCall sends one control request to d and returns its output.
func pcCall(t *testing.T, d *daemon, req *control.Request) string {
	t.Helper()
	path, err := control.DefaultPath(d.mnt)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := control.Call(path, req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Op, req.Name, err)
	}
	if resp.Error != "" {
		t.Fatalf("%s %s %q: %s", req.Op, req.Name, req.Args, resp.Error)
	}
	return resp.Output
}

// pcMessage sends a message to the target at sector 0 of name.
func pcMessage(t *testing.T, d *daemon, name string, words ...string) string {
	t.Helper()
	return pcCall(t, d, &control.Request{Op: control.OpMessage, Name: name, Args: words})
}

// pcMemDir returns a new folder on tmpfs (/dev/shm) when there is one, so
// that the backing files cost no disk flushes, else under t.TempDir.
func pcMemDir(t *testing.T) string {
	if dir, err := os.MkdirTemp("/dev/shm", "dmfuse-powercut-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// TestPowercutDSyncWrites: writes that FUSE sends with O_DSYNC (to a device
// file opened O_DSYNC, or pwritev2 with RWF_DSYNC) reach the backing file
// before they complete and survive a cut, as does a write an fsync covered;
// a plain write stays in the cache and is lost; while the power is off,
// reads and fsync fail with EIO.
func TestPowercutDSyncWrites(t *testing.T) {
	dir := pcMemDir(t)
	img := filepath.Join(dir, "img")
	sparseFile(t, img, 2048*sector)
	d := startDaemon(t, dir, "pc,,,rw,0 2048 powercut "+img+" 0;")
	plain, err := os.OpenFile(d.path("pc"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	dsync, err := os.OpenFile(d.path("pc"), os.O_RDWR|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dsync.Close()
	a, b, c, e := pattern('a'), pattern('b'), pattern('c'), pattern('e')
	if _, err := plain.WriteAt(a, 0); err != nil {
		t.Fatal(err)
	}
	if err := plain.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := dsync.WriteAt(b, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwritev2(int(plain.Fd()), [][]byte{c}, 8192, unix.RWF_DSYNC); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.WriteAt(e, 12288); err != nil {
		t.Fatal(err)
	}
	st := pcCall(t, d, &control.Request{Op: control.OpStatus, Name: "pc"})
	if !strings.Contains(st, " fua 2 ") || !strings.Contains(st, "cached 1 8 ") {
		t.Errorf("status %q: want 2 FUA writes and one cached write", st)
	}
	if out := pcMessage(t, d, "pc", "power_cut"); out != "power_cut: 1 cached writes lost (8 sectors)\n" {
		t.Errorf("power_cut: %q", out)
	}
	if _, err := plain.ReadAt(make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("read while down: %v, want EIO", err)
	}
	if err := plain.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync while down: %v, want EIO", err)
	}
	pcMessage(t, d, "pc", "power_on")
	got := make([]byte, 16384)
	if _, err := plain.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := bytes.Join([][]byte{a, b, c, make([]byte, 4096)}, nil)
	for i, what := range []string{"a plain write, then fsync", "an O_DSYNC write", "an RWF_DSYNC write",
		"a plain write never flushed (lost)"} {
		if !bytes.Equal(got[i*4096:(i+1)*4096], want[i*4096:(i+1)*4096]) {
			t.Errorf("block %d, %s: wrong after the cut", i, what)
		}
	}
	onFile, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onFile[:16384], want) {
		t.Errorf("the backing file differs from what was made durable at byte %d", firstDiff(onFile[:16384], want))
	}
}

// pcFS is a file system the crash tests run on.
type pcFS struct {
	name    string
	sectors int      // device size
	mkfs    []string // command and arguments before the device
	check   []string // read-only check, exit 0 when clean
}

var pcFileSystems = []pcFS{
	{name: "ext4", sectors: 131072, mkfs: []string{"mkfs.ext4", "-q", "-F"}, check: []string{"e2fsck", "-fn"}},
	{name: "xfs", sectors: 655360, mkfs: []string{"mkfs.xfs", "-q", "-f"}, check: []string{"xfs_repair", "-n", "-P"}},
}

// pcEnv is one daemon with one device (powercut, or flakey for the
// contrast) over a tmpfs file, a loop device over it, a file system made
// once, and a mount point.
type pcEnv struct {
	fs     pcFS
	d      *daemon
	target string // "powercut" or "flakey"
	img    string
	loop   string
	mnt    string
}

func newPCEnv(t *testing.T, fs pcFS, target string) *pcEnv {
	requireTool(t, "losetup", "mount", "umount", fs.mkfs[0], fs.check[0])
	dir := pcMemDir(t)
	e := &pcEnv{fs: fs, target: target, img: filepath.Join(dir, "img"), mnt: filepath.Join(dir, "fs")}
	sparseFile(t, e.img, int64(fs.sectors)*sector)
	e.d = startDaemon(t, dir, "dev,,,rw,"+strings.ReplaceAll(e.table(false), ",", `\,`)+";")
	e.loop = strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", e.d.path("dev")))
	t.Cleanup(func() { exec.Command("losetup", "-d", e.loop).Run() })
	if err := os.Mkdir(e.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if export.Mounted(e.mnt) {
			unix.Unmount(e.mnt, unix.MNT_DETACH)
		}
	})
	run(t, fs.mkfs[0], append(fs.mkfs[1:], e.loop)...)
	return e
}

// table is the device's table: powercut, or flakey up (or dropping writes).
func (e *pcEnv) table(drop bool) string {
	if e.target == "powercut" {
		return fmt.Sprintf("0 %d powercut %s 0", e.fs.sectors, e.img)
	}
	if drop {
		return fmt.Sprintf("0 %d flakey %s 0 0 180 1 drop_writes", e.fs.sectors, e.img)
	}
	return fmt.Sprintf("0 %d flakey %s 0 180 0", e.fs.sectors, e.img)
}

// swap makes table live on the device.
func (e *pcEnv) swap(t *testing.T, drop bool) {
	pcCall(t, e.d, &control.Request{Op: control.OpLoad, Name: "dev", Table: e.table(drop), Dir: "/"})
	pcCall(t, e.d, &control.Request{Op: control.OpResume, Name: "dev"})
}

func (e *pcEnv) mount(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", e.fs.name, e.loop, e.mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", e.fs.name, err, out)
	}
}

// unmount unmounts the file system and waits until its superblock is gone
// (its folder in /sys/fs/TYPE), and returns how long that took after umount
// returned. After a cut the kernel may finish tearing the superblock down up
// to hundreds of milliseconds after umount(2) returned; a mount in that time
// gets the old superblock back, journal aborted and read-only, instead of
// replaying the journal.
func (e *pcEnv) unmount(t *testing.T) time.Duration {
	t.Helper()
	var err error
	for try := 0; try < 50; try++ {
		if err = unix.Unmount(e.mnt, 0); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("umount %s: %v", e.mnt, err)
	}
	sb := filepath.Join("/sys/fs", e.fs.name, filepath.Base(e.loop))
	start := time.Now()
	for {
		if _, err := os.Stat(sb); errors.Is(err, os.ErrNotExist) {
			return time.Since(start)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("%s still exists 20 s after umount", sb)
		}
		time.Sleep(time.Millisecond)
	}
}

// fsck runs the file system's read-only check and returns its complaint
// ("" when clean).
func (e *pcEnv) fsck() string {
	out, err := exec.Command(e.fs.check[0], append(e.fs.check[1:], e.loop)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: %v\n%s", strings.Join(e.fs.check, " "), err, out)
	}
	return ""
}

// pcResult is what one round found.
type pcResult struct {
	problems []string      // broken promises: lost or garbled fsynced data, fsck errors
	ops      int           // operations completed
	mixed    int           // sectors of unsynced files mixed from several writes
	sbWait   time.Duration // how long the superblock outlived the umount after the cut
	acked    int           // syncs acknowledged after the cut (flakey only)
	reply    string        // the cut's reply
}

// round mounts the file system, runs the workload from seed in a new
// folder, cuts the power (powercut: mode, a seed drawn from seed; flakey:
// a drop_writes table) after a random time, unmounts, brings the power back,
// mounts (journal replay), checks every file, removes the folder, unmounts
// and checks the file system.
func (e *pcEnv) round(t *testing.T, mode string, seed uint64) pcResult {
	t.Helper()
	var res pcResult
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	e.mount(t)
	sub := filepath.Join(e.mnt, fmt.Sprintf("r%d", seed))
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(sub); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(e.mnt); err != nil {
		t.Fatal(err)
	}
	w := newPCWorkload(sub, seed)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { w.run(stop) })
	wg.Go(func() { w.noise.run(stop) })
	time.Sleep(time.Duration(30+rng.IntN(220)) * time.Millisecond)
	if e.target == "powercut" {
		words := []string{"power_cut"}
		if mode != "plain" {
			words = append(words, mode, fmt.Sprint(rng.Uint64()))
		}
		res.reply = strings.TrimSpace(pcMessage(t, e.d, "dev", words...))
	} else {
		e.swap(t, true)
		w.cutAt.Store(true)
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	res.ops, res.acked = w.ops, w.ackedAfterCut
	res.sbWait = e.unmount(t)
	if e.target == "powercut" {
		pcMessage(t, e.d, "dev", "power_on")
	} else {
		e.swap(t, false)
	}
	e.mount(t)
	res.problems = w.verify()
	res.mixed = w.mixed
	if err := os.RemoveAll(sub); err != nil {
		res.problems = append(res.problems, "removing the round's folder: "+err.Error())
	}
	if len(res.problems) > 0 {
		res.problems = append(res.problems, "file system errors recorded: "+fsErrors(filepath.Base(e.loop)))
	}
	e.unmount(t)
	if p := e.fsck(); p != "" {
		res.problems = append(res.problems, p)
	}
	if len(res.problems) > 0 {
		res.problems = append(res.problems, "status: "+strings.TrimSpace(pcCall(t, e.d, &control.Request{Op: control.OpStatus, Name: "dev"})),
			"kernel log of "+filepath.Base(e.loop)+":\n"+kernelLog(filepath.Base(e.loop), 40))
	}
	return res
}

// fsErrors returns what ext4 records of its errors on dev (sysfs).
func fsErrors(dev string) string {
	var out []string
	for _, a := range []string{"errors_count", "first_error_func", "first_error_line", "first_error_errcode", "last_error_func", "last_error_line", "last_error_errcode"} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/ext4", dev, a))
		if err == nil {
			out = append(out, a+"="+strings.TrimSpace(string(b)))
		}
	}
	return strings.Join(out, " ")
}

// kernelLog returns the last n lines of the kernel log that name dev.
func kernelLog(dev string, n int) string {
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		return fmt.Sprintf("(dmesg: %v)", err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, dev) || strings.Contains(l, "suppressed") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// syncDir fsyncs a folder.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// TestPowercutFileSystems runs ext4 and xfs on a loop device over a
// powercut device through rounds of a workload (creates, writes, appends,
// renames over, deletes, fsync and fdatasync) cut at a random moment, in
// each cut mode: after power_on and journal replay every file that was
// synced reads back exactly, the others hold only data that was written to
// them (or are gone), and the file system checks clean.
func TestPowercutFileSystems(t *testing.T) {
	base := *pcSeed
	if base == 0 {
		base = uint64(time.Now().UnixNano()) & (1<<40 - 1)
	}
	t.Logf("first seed %d (rerun with -powercut.seed %d)", base, base)
	for _, fs := range pcFileSystems {
		t.Run(fs.name, func(t *testing.T) {
			e := newPCEnv(t, fs, "powercut")
			seed := base
			for _, mode := range []string{"plain", "random", "torn"} {
				ops := 0
				for range *pcRounds {
					seed++
					r := e.round(t, mode, seed)
					ops += r.ops
					if len(r.problems) > 0 {
						t.Errorf("%s %s, seed %d, %d operations, superblock gone %v after umount, cut %q:\n%s", fs.name, mode, seed, r.ops, r.sbWait, r.reply, strings.Join(r.problems, "\n"))
					} else {
						t.Logf("%s %s seed %d: %d operations, %d sectors of unsynced files mixed, superblock gone %v after umount; %s",
							fs.name, mode, seed, r.ops, r.mixed, r.sbWait.Round(10*time.Microsecond), r.reply)
					}
				}
				if ops == 0 {
					t.Errorf("%s %s: no operation completed before any cut", fs.name, mode)
				}
			}
		})
	}
}

// TestPowercutContrastDropWrites runs the same workload with flakey's
// drop_writes switched on in place of the cut. drop_writes acknowledges the
// fsyncs that come after it without writing anything, so the files those
// fsyncs covered are missing after the remount: data the file system was
// told is durable, lost in a way no disk loses it. The test checks that
// premise (fsyncs acknowledged after the switch, and lost) and logs what
// else broke; powercut, in TestPowercutFileSystems, loses none of it.
func TestPowercutContrastDropWrites(t *testing.T) {
	base := *pcSeed
	if base == 0 {
		base = uint64(time.Now().UnixNano()) & (1<<40 - 1)
	}
	const rounds = 4
	for _, fs := range pcFileSystems {
		t.Run(fs.name, func(t *testing.T) {
			e := newPCEnv(t, fs, "flakey")
			acked, broken, fsck := 0, 0, 0
			for i := range rounds {
				r := e.round(t, "drop_writes", base+uint64(i))
				acked += r.acked
				if len(r.problems) > 0 {
					broken++
				}
				for _, p := range r.problems {
					if strings.HasPrefix(p, fs.check[0]) {
						fsck++
					}
				}
				t.Logf("%s drop_writes seed %d: %d operations, %d syncs acknowledged after the switch; %d problems:\n%s",
					fs.name, base+uint64(i), r.ops, r.acked, len(r.problems), strings.Join(r.problems, "\n"))
			}
			t.Logf("%s: drop_writes broke %d of %d rounds (%d with fsck errors); %d syncs were acknowledged after the switch",
				fs.name, broken, rounds, fsck, acked)
			if acked == 0 || broken == 0 {
				t.Errorf("%s: drop_writes acknowledged %d syncs after the switch and broke %d rounds; the contrast needs both", fs.name, acked, broken)
			}
		})
	}
}

// pcFile is what the workload knows of one file: which states it may be
// found in after a cut. A file is exact when it must exist with one size
// and one generation per block.
type pcFile struct {
	id         uint64
	mayExist   bool
	mayBeGone  bool
	minBlocks  int
	maxBlocks  int
	gens       [][]uint64 // per block, the generations it may hold (0: zeros)
	unsyncedOp bool       // written without a sync since: never exact again
}

func (f *pcFile) exact() bool {
	if f.unsyncedOp || f.mayBeGone || !f.mayExist || f.minBlocks != f.maxBlocks {
		return false
	}
	for _, g := range f.gens {
		if len(g) != 1 {
			return false
		}
	}
	return true
}

// allow adds generation g as a possible content of blocks [from, to),
// growing the file's possible size to at least to blocks.
func (f *pcFile) allow(from, to int, g uint64) {
	for len(f.gens) < to {
		f.gens = append(f.gens, []uint64{0})
	}
	for i := from; i < to; i++ {
		if !slices.Contains(f.gens[i], g) {
			f.gens[i] = append(f.gens[i], g)
		}
	}
	f.maxBlocks = max(f.maxBlocks, to)
}

// settle makes the file exact: blocks [0, n) hold gens.
func (f *pcFile) settle(gens []uint64) {
	f.mayExist, f.mayBeGone = true, false
	f.minBlocks, f.maxBlocks = len(gens), len(gens)
	f.gens = f.gens[:0]
	for _, g := range gens {
		f.gens = append(f.gens, []uint64{g})
	}
}

// current returns the generation of each block of an exact file.
func (f *pcFile) current() []uint64 {
	out := make([]uint64, len(f.gens))
	for i, g := range f.gens {
		out[i] = g[0]
	}
	return out
}

// pcWorkload runs file operations in one folder, one at a time, and keeps
// the model of what may be found after a cut. Beside it, noise keeps the
// device's cache busy.
type pcWorkload struct {
	dir    string
	rng    *rand.Rand
	gen    uint64
	nextID uint64
	files  map[string]*pcFile
	ops    int
	noise  *pcNoise

	// mixed counts the sectors verify found mixed from several
	// generations.
	mixed int
	// cutAt is set once the drop_writes table is live.
	cutAt         atomic.Bool
	ackedAfterCut int
}

func newPCWorkload(dir string, seed uint64) *pcWorkload {
	return &pcWorkload{dir: dir, rng: rand.New(rand.NewPCG(seed, 0xf11e)), gen: seed << 20, files: map[string]*pcFile{},
		noise: &pcNoise{dir: dir, rng: rand.New(rand.NewPCG(seed, 0x2015e)), gen: seed<<20 | 1<<19, files: map[string]*pcFile{},
			pause: []time.Duration{0, time.Millisecond, 3 * time.Millisecond}[seed%3]}}
}

// pcNoise writes blocks to a few files of its own without ever syncing
// them, and starts their write-back at once (sync_file_range), so that the
// device always holds cached writes that no flush covered yet: the writes a
// cut loses. Its files may be found in any state a cut allows, but never
// with data that was not written to them.
type pcNoise struct {
	dir   string
	rng   *rand.Rand
	gen   uint64
	files map[string]*pcFile
	// pause between writes: rounds with heavy noise leave much in the
	// cache but slow the workload's syncs (ordered data goes first).
	pause time.Duration
}

func (n *pcNoise) run(stop <-chan struct{}) {
	fds := map[string]*os.File{}
	defer func() {
		for _, fd := range fds {
			fd.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		default:
		}
		id := uint64(1<<20 + n.rng.IntN(6))
		name := fmt.Sprintf("n%d", id)
		f := n.files[name]
		if f == nil {
			f = &pcFile{id: id, mayExist: true, mayBeGone: true, unsyncedOp: true}
			n.files[name] = f
			fd, err := os.OpenFile(filepath.Join(n.dir, name), os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return
			}
			fds[name] = fd
		}
		from := n.rng.IntN(48)
		k := 1 + n.rng.IntN(16)
		n.gen++
		f.allow(from, from+k, n.gen)
		var b []byte
		for i := from; i < from+k; i++ {
			b = append(b, pcBlock(id, i, n.gen)...)
		}
		fd := fds[name]
		if _, err := fd.WriteAt(b, int64(from)*crashBlock); err != nil {
			return
		}
		if err := unix.SyncFileRange(int(fd.Fd()), int64(from)*crashBlock, int64(len(b)), unix.SYNC_FILE_RANGE_WRITE); err != nil {
			return
		}
		if n.pause > 0 {
			time.Sleep(n.pause)
		}
	}
}

// block returns block i of file id at generation g.
func pcBlock(id uint64, i int, g uint64) []byte {
	b := make([]byte, crashBlock)
	stampBlock(b, id<<16|uint64(i), g)
	return b
}

// content returns the blocks of gens for file id.
func pcContent(id uint64, gens []uint64) []byte {
	var b []byte
	for i, g := range gens {
		b = append(b, pcBlock(id, i, g)...)
	}
	return b
}

func (w *pcWorkload) newGen() uint64 { w.gen++; return w.gen }

// pick returns the name of a random exact file, "" if none.
func (w *pcWorkload) pick() string {
	var names []string
	for n, f := range w.files {
		if f.exact() && strings.HasPrefix(n, "f") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return names[w.rng.IntN(len(names))]
}

// synced marks that a sync returned: after the drop_writes switch it counts
// as acknowledged but dropped.
func (w *pcWorkload) synced() {
	if w.cutAt.Load() {
		w.ackedAfterCut++
	}
}

// run performs operations until one fails or stop is closed.
func (w *pcWorkload) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		var err error
		switch r := w.rng.IntN(100); {
		case r < 30:
			err = w.create(true)
		case r < 38:
			err = w.create(false)
		case r < 56:
			err = w.overwrite(true)
		case r < 61:
			err = w.overwrite(false)
		case r < 71:
			err = w.appendBlocks()
		case r < 88:
			err = w.replace()
		default:
			err = w.remove()
		}
		if err != nil {
			return
		}
		w.ops++
	}
}

func (w *pcWorkload) path(name string) string { return filepath.Join(w.dir, name) }

// create writes a new file of 1 to 16 blocks; with sync, fsyncs it and the
// folder.
func (w *pcWorkload) create(sync bool) error {
	w.nextID++
	name := fmt.Sprintf("f%05d", w.nextID)
	f := &pcFile{id: w.nextID, mayExist: true, mayBeGone: true, unsyncedOp: !sync}
	w.files[name] = f
	n := 1 + w.rng.IntN(16)
	g := w.newGen()
	f.allow(0, n, g)
	gens := make([]uint64, n)
	for i := range gens {
		gens[i] = g
	}
	fd, err := os.OpenFile(w.path(name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer fd.Close()
	if _, err := fd.Write(pcContent(f.id, gens)); err != nil {
		return err
	}
	if !sync {
		return nil
	}
	if err := fd.Sync(); err != nil {
		return err
	}
	if err := syncDir(w.dir); err != nil {
		return err
	}
	w.synced()
	f.settle(gens)
	return nil
}

// overwrite writes new generations over some blocks of an exact file in
// place; with sync, fdatasyncs it.
func (w *pcWorkload) overwrite(sync bool) error {
	name := w.pick()
	if name == "" {
		return w.create(true)
	}
	f := w.files[name]
	gens := f.current()
	fd, err := os.OpenFile(w.path(name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer fd.Close()
	g := w.newGen()
	f.unsyncedOp = !sync
	for i := range gens {
		if w.rng.IntN(2) == 0 {
			continue
		}
		f.allow(i, i+1, g)
		gens[i] = g
		if _, err := fd.WriteAt(pcBlock(f.id, i, g), int64(i)*crashBlock); err != nil {
			return err
		}
	}
	if !sync {
		return nil
	}
	if err := unix.Fdatasync(int(fd.Fd())); err != nil {
		return err
	}
	w.synced()
	f.settle(gens)
	return nil
}

// appendBlocks appends 1 to 8 blocks to an exact file and fsyncs it.
func (w *pcWorkload) appendBlocks() error {
	name := w.pick()
	if name == "" {
		return w.create(true)
	}
	f := w.files[name]
	gens := f.current()
	n := len(gens)
	k := 1 + w.rng.IntN(8)
	g := w.newGen()
	f.allow(n, n+k, g)
	for range k {
		gens = append(gens, g)
	}
	fd, err := os.OpenFile(w.path(name), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer fd.Close()
	if _, err := fd.Write(pcContent(f.id, gens)[n*crashBlock:]); err != nil {
		return err
	}
	if err := fd.Sync(); err != nil {
		return err
	}
	w.synced()
	f.settle(gens)
	return nil
}

// replace writes a new version of an exact file under a temporary name,
// fsyncs it, renames it over the file and fsyncs the folder.
func (w *pcWorkload) replace() error {
	name := w.pick()
	if name == "" {
		return w.create(true)
	}
	f := w.files[name]
	tmpName := "t" + name[1:]
	tmp := &pcFile{id: f.id, mayExist: true, mayBeGone: true}
	w.files[tmpName] = tmp
	n := 1 + w.rng.IntN(16)
	g := w.newGen()
	tmp.allow(0, n, g)
	gens := make([]uint64, n)
	for i := range gens {
		gens[i] = g
	}
	fd, err := os.OpenFile(w.path(tmpName), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer fd.Close()
	if _, err := fd.Write(pcContent(f.id, gens)); err != nil {
		return err
	}
	if err := fd.Sync(); err != nil {
		return err
	}
	w.synced()
	// The temporary file's data is durable; its name may or may not be.
	tmp.settle(gens)
	tmp.mayBeGone = true
	// From the rename on, the file is the old or the new version, and the
	// temporary name may still be there until the folder is synced.
	f.allow(0, n, g)
	f.minBlocks = min(f.minBlocks, n)
	f.mayBeGone = false
	if err := os.Rename(w.path(tmpName), w.path(name)); err != nil {
		return err
	}
	if err := syncDir(w.dir); err != nil {
		return err
	}
	w.synced()
	delete(w.files, tmpName)
	f.settle(gens)
	return nil
}

// remove unlinks an exact file and fsyncs the folder.
func (w *pcWorkload) remove() error {
	name := w.pick()
	if name == "" {
		return w.create(true)
	}
	f := w.files[name]
	f.mayBeGone = true
	if err := os.Remove(w.path(name)); err != nil {
		return err
	}
	if err := syncDir(w.dir); err != nil {
		return err
	}
	w.synced()
	delete(w.files, name)
	return nil
}

// verify checks the folder against the model and returns what is wrong.
func (w *pcWorkload) verify() []string {
	for name, f := range w.noise.files {
		f.minBlocks = 0
		w.files[name] = f
	}
	var bad []string
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return []string{fmt.Sprintf("the round's folder: %v", err)}
	}
	seen := map[string]bool{}
	for _, e := range ents {
		seen[e.Name()] = true
		if w.files[e.Name()] == nil {
			bad = append(bad, fmt.Sprintf("%s: a file the workload never left there", e.Name()))
		}
	}
	names := make([]string, 0, len(w.files))
	for n := range w.files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		f := w.files[name]
		what := "synced"
		if !f.exact() {
			what = "in flight or never synced"
		}
		if !seen[name] {
			if !f.mayBeGone {
				bad = append(bad, fmt.Sprintf("%s (%s): gone", name, what))
			}
			continue
		}
		b, err := os.ReadFile(w.path(name))
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s (%s): %v", name, what, err))
			continue
		}
		if len(b)%crashBlock != 0 || len(b)/crashBlock < f.minBlocks || len(b)/crashBlock > f.maxBlocks {
			bad = append(bad, fmt.Sprintf("%s (%s): %d bytes, want %d to %d blocks of %d", name, what, len(b), f.minBlocks, f.maxBlocks, crashBlock))
			continue
		}
		for i := 0; i < len(b)/crashBlock; i++ {
			blk := b[i*crashBlock : (i+1)*crashBlock]
			for s := 0; s < crashBlock; s += sector {
				g, err := sectorGen(blk, f.id<<16|uint64(i), s)
				if err == nil && !slices.Contains(f.gens[i], g) {
					err = fmt.Errorf("block %d sector %d holds generation %d, want one of %v", i, s/sector, g, f.gens[i])
				}
				if err != nil && !f.exact() && pcMixed(blk[s:s+sector], f.id<<16|uint64(i), s, f.gens[i]) {
					// The page changed while it was being written back (no
					// stable pages here): each byte is from a generation
					// written to it.
					err = nil
					w.mixed++
				}
				if err != nil {
					bad = append(bad, fmt.Sprintf("%s (%s): %v", name, what, err))
					break
				}
			}
		}
	}
	return bad
}

// pcMixed reports whether every byte of sector s of block blk equals that
// byte in one of the generations gens (0: zeros). A file written while its
// pages were under write-back may hold such a mix until it is synced: the
// kernel does not keep pages stable for a loop device, so a page copied
// into a FUSE write while the workload rewrites it carries part of each
// version.
func pcMixed(sec []byte, blk uint64, s int, gens []uint64) bool {
	want := make([][]byte, len(gens))
	for k, g := range gens {
		b := make([]byte, crashBlock)
		if g != 0 {
			stampBlock(b, blk, g)
		}
		want[k] = b[s : s+sector]
	}
	for i, c := range sec {
		if !slices.ContainsFunc(want, func(w []byte) bool { return w[i] == c }) {
			return false
		}
	}
	return true
}
