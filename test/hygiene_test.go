package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/fs"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/targets"
	"golang.org/x/sys/unix"
)

// usage is one measurement of this process: goroutines, open file
// descriptors (/proc/self/fd), resident memory (/proc/self/status VmRSS) and
// the Go heap in use after a collection.
type usage struct {
	goroutines, fds int
	rss, heap       uint64
}

func (u usage) String() string {
	return fmt.Sprintf("%d goroutines, %d fds, RSS %.1f MiB, heap %.1f MiB",
		u.goroutines, u.fds, float64(u.rss)/(1<<20), float64(u.heap)/(1<<20))
}

func measure(t *testing.T) usage {
	t.Helper()
	// Let goroutines that are on their way out finish, then collect.
	var u usage
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u.heap = ms.HeapInuse
	u.goroutines = runtime.NumGoroutine()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	u.fds = len(ents)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			u.rss = kb << 10
		}
	}
	return u
}

// checkFlat fails the test if after grew more than the bounds allow over
// before: a leak of one goroutine, descriptor or a few hundred bytes per cycle
// shows far beyond them after 10,000 cycles.
func checkFlat(t *testing.T, what string, before, after usage) {
	t.Helper()
	t.Logf("%s: before: %v; after: %v", what, before, after)
	if after.goroutines > before.goroutines+20 {
		t.Errorf("%s: goroutines grew from %d to %d", what, before.goroutines, after.goroutines)
	}
	if after.fds > before.fds+20 {
		t.Errorf("%s: open fds grew from %d to %d", what, before.fds, after.fds)
	}
	if after.heap > before.heap+32<<20 {
		t.Errorf("%s: heap grew from %d to %d bytes", what, before.heap, after.heap)
	}
	if after.rss > before.rss+256<<20 {
		t.Errorf("%s: RSS grew from %d to %d bytes", what, before.rss, after.rss)
	}
}

// openUnpolled opens a file on a mount this process serves without handing
// it to the Go runtime's poller. os.OpenFile would register it with epoll,
// and for a FUSE file epoll_ctl sends FUSE_POLL (fs/fuse/file.c:
// fuse_file_poll) and waits for the answer on a thread that keeps its P;
// with GOMAXPROCS=1 the server in this process then never runs to answer.
// go-fuse's mount on /dev/fuse avoids this by making the kernel learn at
// mount time that FUSE_POLL is not implemented (its poll hack), but the
// io_uring transport mounts through /dev/fd/N, where go-fuse skips that.
func openUnpolled(path string, flag int) (*os.File, error) {
	fd, err := unix.Open(path, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil // blocking: not polled
}

// TestResourceHygiene mounts dmfuse in this process (so that goroutines can
// be counted) and runs 10,000 create/remove cycles through the control
// socket, each also looking the new device up in the mount, then 10,000
// open/read/close cycles of a device file: goroutines, fds and memory stay
// flat.
func TestResourceHygiene(t *testing.T) {
	requireFUSE(t)
	cycles := 10000
	if testing.Short() {
		cycles = 1000
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	sparseFile(t, img, 4<<20)
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	reg, err := stack.NewRegistry(targets.Types()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr := stack.NewManager(stack.ManagerOptions{Registry: reg, Context: ctx, CoreMessage: stack.DMStatsMessage})
	defer mgr.Close()
	if _, err := mgr.Create(stack.CreateOptions{Name: "base", Minor: -1, Table: "0 8192 linear " + img + " 0"}); err != nil {
		t.Fatal(err)
	}
	srv, err := fs.Mount(mnt, mgr, fs.Options{Transport: os.Getenv("DMFUSE_TRANSPORT")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Unmount(); err != nil {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		srv.Wait()
	}()
	sock := filepath.Join(dir, "ctl.sock")
	ln, err := control.Listen(sock, false)
	if err != nil {
		t.Fatal(err)
	}
	ctl := control.NewServer(ctx, mgr)
	go ctl.Serve(ln)
	defer ctl.Close()

	call := func(r *control.Request) {
		t.Helper()
		resp, err := control.Call(sock, r)
		if err != nil || resp.Error != "" {
			t.Fatalf("%s %s: %v %+v", r.Op, r.Name, err, resp)
		}
	}
	// Tables that open a file, stack on a device, start a delay target and
	// take messages, in turn.
	tables := []string{
		"0 64 linear " + img + " 0",
		"0 64 linear base 64",
		"0 32 delay base 0 0\n32 32 striped 2 8 base 0 " + img + " 64",
		"0 64 dust base 128 512",
		"0 64 multipath 0 0 1 1 round-robin 0 1 1 base 1",
	}
	cycle := func(i int) {
		name := fmt.Sprintf("x%d", i%7)
		call(&control.Request{Op: control.OpCreate, Name: name, Table: tables[i%len(tables)], Dir: dir})
		if _, err := os.Stat(filepath.Join(mnt, name)); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if i%10 == 0 {
			call(&control.Request{Op: control.OpMessage, Name: name, Args: []string{"@stats_create", "-", "/4"}})
		}
		call(&control.Request{Op: control.OpRemove, Name: name})
	}
	for i := range 200 { // warm up: pools, caches, the delay scheduler
		cycle(i)
	}
	before := measure(t)
	start := time.Now()
	for i := range cycles {
		cycle(i)
	}
	after := measure(t)
	t.Logf("%d create/remove cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
	checkFlat(t, "create/remove", before, after)

	path := filepath.Join(mnt, "base")
	buf := make([]byte, 4096)
	openClose := func(i int) {
		f, err := openUnpolled(path, os.O_RDWR)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		if _, err := f.ReadAt(buf, int64(i%1024)*4096); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	for i := range 200 {
		openClose(i)
	}
	before = measure(t)
	start = time.Now()
	for i := range cycles {
		openClose(i)
	}
	after = measure(t)
	t.Logf("%d open/read/close cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
	checkFlat(t, "open/close", before, after)
	if n := mgr.Lookup("base").OpenCount(); n != 0 {
		t.Errorf("open count %d after every file was closed", n)
	}
}
