package test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/fs/export"

	"github.com/dmfuse/dmfuse/internal/golden"
)

// checkGolden compares got with the file at path (golden.Check).
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	golden.Check(t, path, []byte(got))
}

// dmfuse runs the client binary against the daemon d (through DMFUSE_MOUNT)
// in folder cwd with stdin, and returns stdout, stderr and the exit code.
func (d *daemon) dmfuse(cwd, stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(dmfuseBin, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "DMFUSE_MOUNT="+d.mnt)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			d.t.Fatalf("dmfuse %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// must runs a client command that must succeed and returns its stdout.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	out, errs, code := d.dmfuse("/", "", args...)
	if code != 0 {
		d.t.Fatalf("dmfuse %s: exit %d: %s", strings.Join(args, " "), code, errs)
	}
	return out
}

// call sends one request straight to the daemon's socket (faster than the
// client binary, for loops).
func (d *daemon) call(req *control.Request) error {
	path, err := control.DefaultPath(d.mnt)
	if err != nil {
		return err
	}
	resp, err := control.Call(path, req)
	if err != nil {
		return err
	}
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	return nil
}

// TestControlVerbs runs every verb through the client binary, good and bad
// input, through create, load, suspend, resume, clear, rename and remove as
// dmsetup runs them, and compares the transcript (stdout, stderr, exit code)
// with a golden file.
func TestControlVerbs(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "base.img"), 4096*sector)
	d := startDaemon(t, dir, "base,,,rw,0 4096 linear ./base.img 0\n")
	if err := os.WriteFile(filepath.Join(dir, "rel.table"), []byte("# a table file\n0 100 linear ./base.img 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		stdin string
		args  []string
	}{
		{"", []string{"ls"}},
		{"", []string{"targets"}},
		{"", []string{"create", "d1", "--notable"}},
		{"", []string{"info", "d1"}},
		{"", []string{"load", "d1", "--table", "0 2048 zero"}},
		{"", []string{"info", "d1"}},
		{"", []string{"table", "d1"}},
		{"", []string{"table", "--inactive", "d1"}},
		{"", []string{"status", "d1", "--inactive"}},
		{"", []string{"resume", "d1"}},
		{"", []string{"info", "d1"}},
		{"", []string{"reload", "d1", "--table", "0 4096 zero"}},
		{"", []string{"info", "d1"}},
		{"", []string{"clear", "d1"}},
		{"", []string{"info", "d1"}},
		{"", []string{"suspend", "d1"}},
		{"", []string{"suspend", "--noflush", "d1"}},
		{"", []string{"info", "d1"}},
		{"", []string{"resume", "d1"}},
		{"", []string{"info", "d1"}},
		{"", []string{"create", "d2", "--notable"}},
		{"", []string{"suspend", "d2"}},
		{"", []string{"resume", "d2"}},
		{"", []string{"message", "d1", "0", "foo"}},
		{"", []string{"message", "d1", "4096", "foo"}},
		{"", []string{"message", "d1", "x", "foo"}},
		{"", []string{"message", "d1", "0", "@stats_list"}},
		{"", []string{"message", "d1", "0", "@cancel_deferred_remove"}},
		{"0 1024 dust base 0 512\n", []string{"create", "dust1"}},
		{"", []string{"message", "dust1", "0", "addbadblock", "60"}},
		{"", []string{"message", "dust1", "0", "addbadblock", "60"}},
		{"", []string{"message", "dust1", "0", "ADDBADBLOCK", "61", "3"}},
		{"", []string{"message", "dust1", "0", "countbadblocks"}},
		{"", []string{"message", "dust1", "0", "listbadblocks"}},
		{"", []string{"message", "dust1", "0", "queryblock", "7"}},
		{"", []string{"status", "dust1"}},
		{"", []string{"create", "rel", "rel.table"}},
		{"", []string{"table", "rel"}},
		{"", []string{"create", "ro1", "--readonly", "--uuid", "my-uuid", "--table", "0 8 zero"}},
		{"", []string{"info", "ro1"}},
		{"", []string{"rename", "ro1", "ro2"}},
		{"", []string{"rename", "d2", "--setuuid", "u2"}},
		{"", []string{"rename", "d2", "--setuuid", "u3"}},
		{"", []string{"rename", "d2", "ro2"}},
		{"", []string{"remove", "base"}},
		{"", []string{"remove", "d2"}},
		{"", []string{"remove", "d2"}},
		{"", []string{"create", "d1", "--notable"}},
		{"", []string{"create", "stats", "--notable"}},
		{"", []string{"create", "bad", "--table", "0 100 linear ./nope.img 0"}},
		{"", []string{"create", "bad", "--table", "0 100 linear base 0\n200 8 zero"}},
		{"", []string{"create", "bad", "--table", "0 8192 linear base 0"}},
		{"", []string{"load", "d1", "--table", "0 8 striped 2 3 base 0 base 8"}},
		{"", []string{"create", "bad", "--notable", "--table", "0 8 zero"}},
		{"", []string{"table"}},
		{"", []string{"status"}},
		{"", []string{"info"}},
		{"", []string{"ls"}},
	}
	var tr strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&tr, "$ dmfuse %s\n", strings.Join(quoteArgs(s.args), " "))
		if s.stdin != "" {
			fmt.Fprintf(&tr, "< %q\n", s.stdin)
		}
		out, errs, code := d.dmfuse(dir, s.stdin, s.args...)
		tr.WriteString(out)
		for _, l := range strings.SplitAfter(errs, "\n") {
			if l != "" {
				fmt.Fprintf(&tr, "stderr: %s", l)
			}
		}
		if code != 0 {
			fmt.Fprintf(&tr, "exit %d\n", code)
			if n := strings.Count(errs, "\n"); n != 1 {
				t.Errorf("dmfuse %s: %d lines on stderr, want 1:\n%s", strings.Join(s.args, " "), n, errs)
			}
		}
	}
	checkGolden(t, "testdata/control/verbs.golden", strings.ReplaceAll(tr.String(), dir, "$DIR"))

	// The device file follows the live table.
	if st, err := os.Stat(d.path("d1")); err != nil || st.Size() != 2048*sector {
		t.Errorf("d1 file: %v, %v; want %d bytes", st, err, 2048*sector)
	}
	if _, err := os.Stat(d.path("ro2")); err != nil {
		t.Errorf("renamed device ro2: %v", err)
	}
	if _, err := os.Stat(d.path("ro1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old name ro1 of a renamed device still listed: %v", err)
	}
	if _, err := os.Stat(d.path("d2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed device d2 still listed: %v", err)
	}
	// A rename reaches the kernel's cache of names at once.
	d.must("rename", "d1", "d1x")
	if _, err := os.Stat(d.path("d1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old name d1 after rename: %v", err)
	}
	if st, err := os.Stat(d.path("d1x")); err != nil || st.Size() != 2048*sector {
		t.Errorf("new name d1x after rename: %v, %v", st, err)
	}
	d.must("rename", "d1x", "d1")
	d.must("load", "d1", "--table", "0 4096 zero")
	d.must("resume", "d1")
	if st, err := os.Stat(d.path("d1")); err != nil || st.Size() != 4096*sector {
		t.Errorf("d1 file after a growing reload: %v, %v; want %d bytes", st, err, 4096*sector)
	}

	// An open device cannot be removed; --force swaps in an error table.
	f, err := os.OpenFile(d.path("rel"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := d.dmfuse("/", "", "remove", "rel"); code == 0 || errs != "dmfuse: rel: device is open\n" {
		t.Errorf("remove of an open device: exit %d, %q", code, errs)
	}
	if got := d.must("info", "rel"); !strings.Contains(got, "Open count:        1\n") {
		t.Errorf("info of an open device:\n%s", got)
	}
	if _, _, code := d.dmfuse("/", "", "remove", "--force", "rel"); code == 0 {
		t.Error("remove --force of an open device succeeded")
	}
	if _, err := f.WriteAt(make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("write after remove --force: %v, want EIO", err)
	}
	f.Close()
	d.must("remove", "--force", "rel")

	// Global flags before and after the verb, and --control.
	sock, err := control.DefaultPath(d.mnt)
	if err != nil {
		t.Fatal(err)
	}
	want := d.must("ls")
	for _, args := range [][]string{{"--mount", d.mnt, "ls"}, {"ls", "--mount", d.mnt}, {"--control", sock, "ls"}, {"ls", "--control", sock}} {
		cmd := exec.Command(dmfuseBin, args...)
		cmd.Env = append(os.Environ(), "DMFUSE_MOUNT=")
		out, err := cmd.Output()
		if err != nil || string(out) != want {
			t.Errorf("dmfuse %s: %q, %v; want %q", strings.Join(args, " "), out, err, want)
		}
	}
	cmd := exec.Command(dmfuseBin, "ls")
	cmd.Env = append(os.Environ(), "DMFUSE_MOUNT=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "no daemon given") {
		t.Errorf("dmfuse ls without a daemon: %q, %v", out, err)
	}
}

// TestControlMessageWithoutLiveTable sends a message through the client to
// a device without a live table, then to one with only an inactive table:
// as with dmsetup over dm's target_message, each exits 0 and prints nothing.
// Once the table is live, the same message reaches its target.
func TestControlMessageWithoutLiveTable(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "z,,,rw,0 8 zero\n")
	d.must("create", "nt", "--notable")
	for _, setup := range [][]string{nil, {"load", "nt", "--table", "0 8 zero"}} {
		if setup != nil {
			d.must(setup...)
		}
		if out, errs, code := d.dmfuse("/", "", "message", "nt", "0", "foo"); out != "" || errs != "" || code != 0 {
			t.Errorf("message after %q: exit %d, stdout %q, stderr %q; want exit 0 and no output", setup, code, out, errs)
		}
	}
	d.must("resume", "nt")
	if _, errs, code := d.dmfuse("/", "", "message", "nt", "0", "foo"); code != 1 || errs != "dmfuse: nt: zero: Target type does not support messages\n" {
		t.Errorf("message to the live table: exit %d, %q", code, errs)
	}
}

// quoteArgs quotes arguments with spaces or newlines for the transcript.
func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \n") {
			a = fmt.Sprintf("%q", a)
		}
		out[i] = a
	}
	return out
}

// TestControlSocketFile checks the default socket's place and modes, its
// removal at exit and the replacement of a stale socket.
func TestControlSocketFile(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir, "z,,,rw,0 8 zero\n")
	sock, err := control.DefaultPath(d.mnt)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/run/dmfuse/" + control.EscapePath(d.mnt) + ".sock"; sock != want {
		t.Errorf("socket %s, want %s", sock, want)
	}
	for p, mode := range map[string]os.FileMode{filepath.Dir(sock): os.ModeDir | 0o700, sock: os.ModeSocket | 0o600} {
		if st, err := os.Stat(p); err != nil || st.Mode() != mode {
			t.Errorf("%s: %v, %v; want mode %v", p, st, err, mode)
		}
	}
	if err := d.stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after exit: %v", err)
	}

	// A daemon killed with SIGKILL leaves its socket; the next one replaces it.
	d = startDaemon(t, dir, "z,,,rw,0 8 zero\n")
	d.cmd.Process.Kill()
	<-d.done
	d.done <- nil
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("socket of a killed daemon: %v", err)
	}
	d = startDaemon(t, dir, "z,,,rw,0 8 zero\n")
	if got := d.must("ls"); got != fmt.Sprintf("z\t(%d:0)\n", export.FreeMajor()) {
		t.Errorf("ls after replacing a stale socket: %q", got)
	}

	// --control puts the socket elsewhere.
	other := filepath.Join(t.TempDir(), "ctl", "dm.sock")
	d2 := startDaemon(t, t.TempDir(), "y,,,rw,0 8 zero\n", "--control", other)
	if st, err := os.Stat(other); err != nil || st.Mode() != os.ModeSocket|0o600 {
		t.Errorf("--control socket: %v, %v", st, err)
	}
	out, err := exec.Command(dmfuseBin, "--control", other, "ls").Output()
	if err != nil || string(out) != fmt.Sprintf("y\t(%d:0)\n", export.FreeMajor()) {
		t.Errorf("ls over --control: %q, %v", out, err)
	}
	d2.stop(syscall.SIGTERM)
}

// alignedBuf returns a zeroed buffer of n bytes aligned to 4096 for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(4096-uintptr(unsafe.Pointer(&b[0]))%4096) % 4096
	return b[off : off+n : off+n]
}

// fill writes a pattern for (block, gen) into b.
func fill(b []byte, block, gen int) {
	r := rand.New(rand.NewPCG(uint64(block), uint64(gen)))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

// verifier writes and checks 4 KiB blocks of one device file with O_DIRECT
// from several goroutines, each owning the blocks i with i%jobs == job.
type verifier struct {
	path   string
	blocks int
	jobs   int
	gens   []int // per block: last generation written (0: never)
	done   atomic.Int64
	errs   chan error
	stop   atomic.Bool
	wg     sync.WaitGroup
}

func newVerifier(path string, blocks, jobs int) *verifier {
	return &verifier{path: path, blocks: blocks, jobs: jobs, gens: make([]int, blocks), errs: make(chan error, 2*jobs)}
}

func (v *verifier) start() {
	for j := 0; j < v.jobs; j++ {
		v.wg.Add(1)
		go v.run(j)
	}
}

func (v *verifier) run(job int) {
	defer v.wg.Done()
	f, err := os.OpenFile(v.path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		v.errs <- err
		return
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(uint64(job), 99))
	buf, want := alignedBuf(4096), make([]byte, 4096)
	for i := 0; !v.stop.Load(); i++ {
		blk := r.IntN(v.blocks/v.jobs)*v.jobs + job
		if i%3 == 2 {
			if err := v.check(f, blk, buf, want); err != nil {
				v.errs <- err
				return
			}
			continue
		}
		gen := v.gens[blk] + 1
		fill(buf, blk, gen)
		if _, err := f.WriteAt(buf, int64(blk)*4096); err != nil {
			v.errs <- fmt.Errorf("write of block %d: %w", blk, err)
			return
		}
		v.gens[blk] = gen
		v.done.Add(1)
	}
}

// check reads block blk and compares it with its last written generation.
func (v *verifier) check(f *os.File, blk int, buf, want []byte) error {
	if _, err := f.ReadAt(buf, int64(blk)*4096); err != nil {
		return fmt.Errorf("read of block %d: %w", blk, err)
	}
	if g := v.gens[blk]; g > 0 {
		fill(want, blk, g)
		if !bytes.Equal(buf, want) {
			return fmt.Errorf("block %d does not hold generation %d", blk, g)
		}
	}
	return nil
}

// finish stops the jobs, then verifies every block written.
func (v *verifier) finish(t *testing.T) {
	t.Helper()
	v.stop.Store(true)
	v.wg.Wait()
	close(v.errs)
	for err := range v.errs {
		t.Error(err)
	}
	f, err := os.OpenFile(v.path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf, want := alignedBuf(4096), make([]byte, 4096)
	bad := 0
	for blk := range v.gens {
		if err := v.check(f, blk, buf, want); err != nil {
			if bad++; bad < 5 {
				t.Error(err)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d blocks failed verification", bad)
	}
}

// waitProgress waits until the verifier completed more than n writes.
func (v *verifier) waitProgress(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for v.done.Load() <= n {
		if time.Now().After(deadline) {
			t.Fatalf("no write completed within 30s (%d done)", v.done.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReloadUnderLoad swaps 100 times between two tables that map the same
// data differently while two jobs write and verify with O_DIRECT: no I/O
// error, no verify error.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "v.img")
	sparseFile(t, img, 65536*sector)
	d := startDaemon(t, dir, "v,,,rw,0 65536 linear ./v.img 0\n")
	tables := []string{
		"0 65536 linear " + img + " 0",
		fmt.Sprintf("0 1000 linear %[1]s 0\n1000 20000 linear %[1]s 1000\n21000 40001 linear %[1]s 21000\n61001 4535 linear %[1]s 61001", img),
	}
	v := newVerifier(d.path("v"), 65536*sector/4096, 2)
	v.start()
	for i := 0; i < 100; i++ {
		v.waitProgress(t, int64(i))
		if err := d.call(&control.Request{Op: control.OpLoad, Name: "v", Table: tables[(i+1)%2], Dir: dir}); err != nil {
			t.Fatal(err)
		}
		if err := d.call(&control.Request{Op: control.OpResume, Name: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	v.finish(t)
	if got := d.must("table", "v"); got != tables[0]+"\n" {
		t.Errorf("final table %q", got)
	}
	if got := d.must("info", "v"); !strings.Contains(got, "Event number:      0\n") || !strings.Contains(got, "State:             ACTIVE\n") {
		t.Errorf("info after 100 reloads:\n%s", got)
	}
	t.Logf("%d writes verified across 100 reloads", v.done.Load())
}

// TestSuspendStallsIO suspends a device while two jobs write to it: their
// I/O stalls, does not fail, is not counted in flight, and resumes on resume.
func TestSuspendStallsIO(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "s.img"), 8192*sector)
	d := startDaemon(t, dir, "s,,,rw,0 8192 linear ./s.img 0\n")
	v := newVerifier(d.path("s"), 8192*sector/4096, 2)
	v.start()
	v.waitProgress(t, 10)
	d.must("suspend", "s")
	held := v.done.Load()
	// Each job may finish the write that completed just before the gate
	// closed; nothing else can complete while suspended.
	time.Sleep(200 * time.Millisecond)
	if n := v.done.Load(); n > held+int64(v.jobs) {
		t.Errorf("%d writes completed while suspended", n-held)
	}
	if got, err := os.ReadFile(d.path("stats", "s", "inflight")); err != nil || string(got) != "       0        0\n" {
		t.Errorf("inflight while suspended: %q, %v", got, err)
	}
	if got := d.must("info", "s"); !strings.Contains(got, "State:             SUSPENDED\n") {
		t.Errorf("info:\n%s", got)
	}
	d.must("resume", "s")
	v.waitProgress(t, held+int64(v.jobs)+10)
	v.finish(t)
}

// TestErrorTableUnderExt4 is the xfstests pattern: ext4 on a loop device over
// a dmfuse device; after an error table is swapped in, new writes fail with
// EIO; with the original table back, e2fsck repairs or passes and every file
// fsynced before the switch reads back intact.
func TestErrorTableUnderExt4(t *testing.T) {
	requireTool(t, "losetup", "mkfs.ext4", "e2fsck", "mount", "umount", "blockdev")
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "x.img"), 262144*sector)
	d := startDaemon(t, dir, "x,,,rw,0 262144 linear ./x.img 0\n")
	orig := strings.TrimSuffix(d.must("table", "x"), "\n")
	loop := strings.TrimSpace(run(t, "losetup", "--direct-io=on", "-f", "--show", d.path("x")))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	run(t, "mkfs.ext4", "-q", "-F", loop)
	fsdir := filepath.Join(dir, "fs")
	if err := os.Mkdir(fsdir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", loop, fsdir)
	t.Cleanup(func() {
		if export.Mounted(fsdir) {
			unix.Unmount(fsdir, unix.MNT_DETACH)
		}
	})
	files := map[string][]byte{}
	for i := 0; i < 8; i++ {
		data := make([]byte, 4096*(1+i*7))
		fill(data, i, 1)
		name := filepath.Join(fsdir, fmt.Sprintf("f%d", i))
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		files[name] = data
	}
	if df, err := os.Open(fsdir); err == nil {
		df.Sync()
		df.Close()
	}

	d.must("load", "x", "--table", "0 262144 error")
	d.must("suspend", "x")
	d.must("resume", "x")
	if got := d.must("table", "x"); got != "0 262144 error \n" {
		t.Fatalf("table after the swap: %q", got)
	}
	err := func() error {
		f, err := os.Create(filepath.Join(fsdir, "new"))
		if err != nil {
			return err
		}
		defer f.Close()
		data := make([]byte, 1<<20)
		if _, err := f.Write(data); err != nil {
			return err
		}
		return f.Sync()
	}()
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("a new write on the error table: %v, want EIO", err)
	}
	if err := unix.Unmount(fsdir, 0); err != nil {
		t.Fatalf("unmount after the error table: %v", err)
	}

	d.must("load", "x", "--table", orig)
	d.must("resume", "x")
	// The loop device's page cache may hold blocks read before the switch.
	run(t, "blockdev", "--flushbufs", loop)
	fsck := exec.Command("e2fsck", "-fy", loop)
	out, err := fsck.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() <= 2) {
		t.Fatalf("e2fsck -fy: %v\n%s", err, out)
	}
	run(t, "mount", loop, fsdir)
	for name, want := range files {
		got, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s after recovery: %d bytes, %v; want the %d bytes fsynced", name, len(got), err, len(want))
		}
	}
	run(t, "umount", fsdir)
}
