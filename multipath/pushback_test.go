package multipath

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/stack"
)

// TestNoflushKeepsPushedBackIO: with queue_if_no_path and every path
// failed, a held read survives `suspend --noflush` (it is pushed back to the
// device and waits at the gate), is issued again after resume, and completes
// once a path is reinstated. A flush suspend fails it with EIO instead.
func TestNoflushKeepsPushedBackIO(t *testing.T) {
	for _, noflush := range []bool{true, false} {
		dir := t.TempDir()
		img := filepath.Join(dir, "p.img")
		data := make([]byte, 1<<20)
		for i := range data {
			data[i] = byte(i / 512)
		}
		if err := os.WriteFile(img, data, 0o600); err != nil {
			t.Fatal(err)
		}
		reg, err := stack.NewRegistry(stack.Linear, Type)
		if err != nil {
			t.Fatal(err)
		}
		m := stack.NewManager(stack.ManagerOptions{Registry: reg})
		if _, err := m.Create(stack.CreateOptions{Name: "p", Minor: -1, Table: "0 2048 linear ./p.img 0", Dir: dir}); err != nil {
			t.Fatal(err)
		}
		mp, err := m.Create(stack.CreateOptions{Name: "mp", Minor: -1,
			Table: "0 2048 multipath 1 queue_if_no_path 0 1 1 round-robin 0 1 1 p 1"})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := m.Message(ctx, "mp", 0, []string{"fail_path", "p"}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		buf := make([]byte, 4096)
		go func() {
			_, err := mp.ReadAt(ctx, buf, 8192)
			done <- err
		}()
		// Wait until the read is held inside the target.
		tg, _, err := mp.Live().TargetAt(0)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); tg.(*multipath).heldIOs() == 0; {
			if time.Now().After(deadline) {
				t.Fatal("the read never reached the target")
			}
			time.Sleep(time.Millisecond)
		}
		if err := m.Suspend("mp", stack.Flags{NoFlush: noflush}); err != nil {
			t.Fatalf("suspend noflush=%v: %v", noflush, err)
		}
		if !noflush {
			if err := <-done; !errors.Is(err, syscall.EIO) {
				t.Fatalf("held read after a flush suspend: %v, want EIO", err)
			}
			m.Close()
			continue
		}
		select {
		case err := <-done:
			t.Fatalf("held read finished during a noflush suspend: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := m.Resume("mp", stack.Flags{}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("read finished with no path after resume: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if _, err := m.Message(ctx, "mp", 0, []string{"reinstate_path", "p"}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("read after reinstate: %v", err)
		}
		if buf[0] != 16 || buf[4095] != 23 {
			t.Fatalf("read returned the wrong data: %d %d", buf[0], buf[4095])
		}
		if s := mp.Disk().Snapshot(); s.IOs[0] != 1 {
			t.Errorf("reads counted %d, want 1 (the pushed-back attempts count nothing)", s.IOs[0])
		}
		m.Close()
	}
}
