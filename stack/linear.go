package stack

import "context"

// Linear maps a segment onto a contiguous range of another device.
var Linear = &TargetType{Name: "linear", Version: [3]int{1, 5, 0}, New: newLinear}

// linear is the linear target: a Remap that also passes write-zeroes down
// (drivers/md/dm-linear.c: linear_ctr sets num_write_zeroes_bios).
type linear struct{ Remap }

var (
	_ Flusher    = (*linear)(nil)
	_ Discarder  = (*linear)(nil)
	_ ZeroWriter = (*linear)(nil)
)

// newLinear constructs a linear target.
//
//	<dev> <offset>
//
// dev is a device argument (a mapped device's name, MAJOR:MINOR or a file's
// path), offset is in sectors.
func newLinear(c *Ctor, args []string) (Target, error) {
	if len(args) != 2 {
		return nil, Errorf("Invalid argument count")
	}
	r, err := OpenArea(c, args[0], args[1], "Invalid device sector", c.Len)
	if err != nil {
		return nil, err
	}
	return &linear{r}, nil
}

// WriteZeroes passes write-zeroes down.
func (l *linear) WriteZeroes(ctx context.Context, off, n int64) error {
	return l.Dev.WriteZeroes(ctx, l.Off+off, n)
}
