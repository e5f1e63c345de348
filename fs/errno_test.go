package fs

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stack"
)

// TestErrnoInjected: an error a fault target made up reaches the caller as
// EIO, wrapped or not; other errors keep their errno; I/O an interrupt
// ended is EINTR.
func TestErrnoInjected(t *testing.T) {
	inj := &stack.InjectedError{Target: "dust", Op: ioop.Read}
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{inj, syscall.EIO},
		{fmt.Errorf("piece 3: %w", inj), syscall.EIO},
		{syscall.EOPNOTSUPP, syscall.EOPNOTSUPP},
		{fmt.Errorf("no errno"), syscall.EIO},
		{fmt.Errorf("gate: %w", context.Canceled), syscall.EINTR},
		{fmt.Errorf("delay: %w: %w", syscall.EINTR, context.Canceled), syscall.EINTR},
	} {
		if got := errno(c.err); got != c.want {
			t.Errorf("errno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestWriteFailsWhole: a write whose later piece fails fails as a whole
// with that piece's errno, as a bio completes with one status, and never
// answers a short count (which FUSE turns into EIO for a direct write);
// a write clipped at the end of the device is short without an error.
func TestWriteFailsWhole(t *testing.T) {
	reg, err := stack.NewRegistry(stack.Zero, stack.Error)
	if err != nil {
		t.Fatal(err)
	}
	mgr := stack.NewManager(stack.ManagerOptions{Registry: reg})
	defer mgr.Close()
	d, err := mgr.Create(stack.CreateOptions{Name: "d", Minor: -1, Table: "0 8 zero\n8 8 error\n"})
	if err != nil {
		t.Fatal(err)
	}
	n := &devNode{dev: d, root: &root{}}
	k, e := n.Write(context.Background(), nil, make([]byte, 8192), 0)
	if k != 0 || e != syscall.EIO {
		t.Errorf("write across zero and error: %d, %v; want 0, EIO", k, e)
	}
	z, err := mgr.Create(stack.CreateOptions{Name: "z", Minor: -1, Table: "0 8 zero\n"})
	if err != nil {
		t.Fatal(err)
	}
	n = &devNode{dev: z, root: &root{}}
	if k, e := n.Write(context.Background(), nil, make([]byte, 8192), 0); k != 4096 || e != 0 {
		t.Errorf("write past the end: %d, %v; want 4096, 0", k, e)
	}
}
