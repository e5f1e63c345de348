package stack

import (
	"context"
	"syscall"
)

// Zero reads zeros and swallows writes and discards.
var Zero = &TargetType{Name: "zero", Version: [3]int{1, 2, 0}, New: newZero}

type zero struct{}

var _ Discarder = zero{}

// newZero constructs a zero target. It takes no arguments.
func newZero(_ *Ctor, args []string) (Target, error) {
	if len(args) != 0 {
		return nil, Errorf("No arguments required")
	}
	return zero{}, nil
}

func (zero) ReadAt(_ context.Context, p []byte, _ int64) (int, error) {
	clear(p)
	return len(p), nil
}

func (zero) WriteAt(_ context.Context, p []byte, _ int64) (int, error) { return len(p), nil }

// Discard succeeds and drops the range.
func (zero) Discard(context.Context, int64, int64) error { return nil }

// WriteZeroes fails with EIO as in dm-zero, which takes only reads, writes and
// discards.
func (zero) WriteZeroes(context.Context, int64, int64) error { return syscall.EIO }

func (zero) Status(StatusType) string { return "" }
func (zero) Close() error             { return nil }
