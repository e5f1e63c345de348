package stack

import "context"

// Zero reads zeros and swallows writes and discards.
var Zero = &TargetType{Name: "zero", Version: [3]int{1, 2, 0}, New: newZero}

type zero struct{}

var (
	_ Discarder    = zero{}
	_ DiscardOwner = zero{}
)

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

// Discard succeeds and drops the range (drivers/md/dm-zero.c: zero_ctr sets
// num_discard_bios and discards_supported). zero takes no write-zeroes, so
// ZERO_RANGE reaches it as writes of zeros, which it swallows.
func (zero) Discard(context.Context, int64, int64) error { return nil }

// OwnsDiscards marks that zero drops discards itself.
func (zero) OwnsDiscards() {}

func (zero) Status(StatusType) string { return "" }
func (zero) Close() error             { return nil }
