package test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/fs/export"
)

// mpConfig is two path devices over one backing file (two routes to the same
// storage) and a multipath device over them.
func mpConfig(img, features string) string {
	return fmt.Sprintf("p1,,,rw,0 8192 linear %s 0;\np2,,,rw,0 8192 linear %s 0;\n"+
		"mp,,,rw,0 8192 multipath %s 0 1 1 round-robin 0 2 1 p1 1 p2 1\n", img, img, features)
}

// mpStatus returns `dmfuse status mp`, with the paths' numbers (p1 and p2
// are the first two devices of mpConfig: minors 0 and 1) written as their
// names.
func mpStatus(t *testing.T, d *daemon) string {
	t.Helper()
	out, err := d.ctl("status", "mp")
	if err != nil {
		t.Fatalf("dmfuse status mp: %v: %s", err, out)
	}
	maj := export.FreeMajor()
	names := strings.NewReplacer(fmt.Sprintf(" %d:0 ", maj), " p1 ", fmt.Sprintf(" %d:1 ", maj), " p2 ")
	return strings.TrimRight(names.Replace(out), "\n")
}

// mpMessage sends a message to mp and fails the test if it is refused.
func mpMessage(t *testing.T, d *daemon, words ...string) {
	t.Helper()
	if out, err := d.ctl(append([]string{"message", "mp", "0"}, words...)...); err != nil {
		t.Errorf("dmfuse message mp 0 %s: %v: %s", strings.Join(words, " "), err, out)
	}
}

// stamp fills b with a block that names its offset and generation.
func stamp(b []byte, off int64, gen uint64) {
	for i := 0; i < len(b); i += 16 {
		binary.LittleEndian.PutUint64(b[i:], uint64(off))
		binary.LittleEndian.PutUint64(b[i+8:], gen)
	}
}

// TestMultipathFailoverUnderLoad: writers and verifiers on a 2-path device
// with queue_if_no_path see no error and no wrong byte while a loop fails and
// reinstates paths by message, sometimes both at once.
func TestMultipathFailoverUnderLoad(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "lun.img")
	sparseFile(t, img, 4<<20)
	d := startDaemon(t, dir, mpConfig(img, "1 queue_if_no_path"))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	var ios int
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.OpenFile(d.path("mp"), os.O_RDWR|syscall.O_DIRECT, 0)
			if err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
				return
			}
			defer f.Close()
			buf := make([]byte, 4096)
			got := make([]byte, 4096)
			n := 0
			for gen := uint64(1); ; gen++ {
				select {
				case <-stop:
					mu.Lock()
					ios += n
					mu.Unlock()
					return
				default:
				}
				// Each writer owns 256 blocks of 4 KiB.
				off := int64(w)*256*4096 + int64(gen%256)*4096
				stamp(buf, off, gen)
				_, werr := f.WriteAt(buf, off)
				_, rerr := f.ReadAt(got, off)
				n += 2
				if werr != nil || rerr != nil || !bytes.Equal(buf, got) {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("writer %d at %d gen %d: write %v, read %v, equal %v", w, off, gen, werr, rerr, bytes.Equal(buf, got)))
					mu.Unlock()
					return
				}
			}
		}()
	}
	for i := range 40 {
		a, b := "p1", "p2"
		if i%2 == 1 {
			a, b = b, a
		}
		mpMessage(t, d, "fail_path", a)
		if i%5 == 0 {
			// Both down for a moment: I/O waits in the target.
			mpMessage(t, d, "fail_path", b)
			time.Sleep(5 * time.Millisecond)
			mpMessage(t, d, "reinstate_path", b)
		}
		time.Sleep(5 * time.Millisecond)
		mpMessage(t, d, "reinstate_path", a)
	}
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d I/O errors, first: %s", len(errs), errs[0])
	}
	if ios == 0 {
		t.Fatal("no I/O was done")
	}
	st := mpStatus(t, d)
	if !strings.Contains(st, " p1 A ") || !strings.Contains(st, " p2 A ") {
		t.Errorf("status after the loop: %q", st)
	}
	t.Logf("%d I/Os; %s", ios, st)
}

// TestMultipathPathToErrorTable: a path device swapped to an error table is
// failed by the first I/O that reaches it, and I/O goes on on the other path.
func TestMultipathPathToErrorTable(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "lun.img")
	sparseFile(t, img, 4<<20)
	d := startDaemon(t, dir, mpConfig(img, "0"))
	for _, args := range [][]string{{"load", "p2", "--table", "0 8192 error"}, {"resume", "p2"}} {
		if out, err := d.ctl(args...); err != nil {
			t.Fatalf("dmfuse %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	f := openDirect(t, d.path("mp"))
	buf := make([]byte, 4096)
	for i := range 16 {
		stamp(buf, int64(i)*4096, 1)
		if _, err := f.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	got := make([]byte, 4096)
	for i := range 16 {
		stamp(buf, int64(i)*4096, 1)
		if _, err := f.ReadAt(got, int64(i)*4096); err != nil || !bytes.Equal(got, buf) {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	st := mpStatus(t, d)
	if !strings.HasSuffix(st, "p1 A 0 p2 F 1 ") {
		t.Errorf("status %q: want p2 failed once, p1 active", st)
	}
	// The only path left fails too: no queue_if_no_path, so EIO.
	for _, args := range [][]string{{"load", "p1", "--table", "0 8192 error"}, {"resume", "p1"}} {
		if out, err := d.ctl(args...); err != nil {
			t.Fatalf("dmfuse %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if _, err := f.ReadAt(got, 0); err == nil {
		t.Error("read with every path failing succeeded")
	}
}

// TestMultipathQueueIfNoPathBlocks: with queue_if_no_path and every path
// failed, a read waits; after a reinstate it completes with the data. With no
// path it could only have failed, so success shows that it waited.
func TestMultipathQueueIfNoPathBlocks(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "lun.img")
	sparseFile(t, img, 4<<20)
	want := pattern(0x5a)
	if err := os.WriteFile(img, want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 4<<20); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dir, mpConfig(img, "1 queue_if_no_path"))
	mpMessage(t, d, "fail_path", "p1")
	mpMessage(t, d, "fail_path", "p2")
	f := openDirect(t, d.path("mp"))
	type result struct {
		buf []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		buf := make([]byte, 4096)
		_, err := f.ReadAt(buf, 0)
		done <- result{buf, err}
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("read returned with every path failed: %v", r.err)
	default:
	}
	mpMessage(t, d, "reinstate_path", "p2")
	r := <-done
	if r.err != nil || !bytes.Equal(r.buf, want) {
		t.Fatalf("held read: %v", r.err)
	}
	if st := mpStatus(t, d); !strings.HasSuffix(st, "p1 F 1 p2 A 1 ") {
		t.Errorf("status %q", st)
	}
}
