package fs

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stats"
)

// TestErrnoInjected: an error a fault target made up reaches the caller as
// EIO, wrapped or not; other errors keep their errno; I/O an interrupt
// ended is EINTR.
func TestErrnoInjected(t *testing.T) {
	inj := &stack.InjectedError{Target: "dust", Op: stats.Read}
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
