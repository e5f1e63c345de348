package stacktest_test

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestOpenerMatchesManager: for a device argument that names nothing, the
// Opener fails with the same *stack.ArgError (reason and errno) as the
// manager's own lookup, for each form of argument.
func TestOpenerMatchesManager(t *testing.T) {
	reg, err := stack.NewRegistry(stack.Linear)
	if err != nil {
		t.Fatal(err)
	}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg})
	t.Cleanup(func() { m.Close() })
	dir := t.TempDir()
	open := stacktest.Opener{"mem": stacktest.NewMemDevice("mem", 1<<20)}
	for _, arg := range []string{"nosuch", "253:77", "4095:99", "./missing.img", dir + "/missing.img", "99999999999:1"} {
		_, err := m.Create(stack.CreateOptions{Name: "x", Minor: -1, Table: "0 8 linear " + stack.EscapeArg(arg) + " 0", Dir: dir})
		var real *stack.ArgError
		if !errors.As(err, &real) {
			t.Fatalf("%s: manager error %v is no *stack.ArgError", arg, err)
		}
		_, err = open.Open(arg)
		var got *stack.ArgError
		if !errors.As(err, &got) {
			t.Fatalf("%s: Opener error %v is no *stack.ArgError", arg, err)
		}
		if got.Reason != real.Reason || !errors.Is(got, syscall.EINVAL) || !errors.Is(real, syscall.EINVAL) {
			t.Errorf("%s: Opener fails with %q (%v), the manager with %q (%v)", arg, got.Reason, got.Unwrap(), real.Reason, real.Unwrap())
		}
	}
	if d, err := open.Open("mem"); err != nil || d != open["mem"] {
		t.Errorf(`Open("mem") = %v, %v`, d, err)
	}
}

// TestMemDevice: I/O inside the device works, I/O reaching past either end
// fails with EIO and changes nothing, discard and write-zeroes zero their
// range, and each flush is counted.
func TestMemDevice(t *testing.T) {
	ctx := context.Background()
	d := stacktest.NewMemDevice("m", 4096)
	if d.Name() != "m" || d.Size() != 4096 {
		t.Fatalf("name %q size %d", d.Name(), d.Size())
	}
	p := bytes.Repeat([]byte{7}, 1024)
	if n, err := d.WriteAt(ctx, p, 3072); n != 1024 || err != nil {
		t.Fatalf("write at the end: %d, %v", n, err)
	}
	for _, off := range []int64{3073, 4096, -1} {
		if n, err := d.WriteAt(ctx, p, off); n != 0 || !errors.Is(err, syscall.EIO) {
			t.Errorf("write at %d: %d, %v; want 0, EIO", off, n, err)
		}
		if n, err := d.ReadAt(ctx, make([]byte, 1024), off); n != 0 || !errors.Is(err, syscall.EIO) {
			t.Errorf("read at %d: %d, %v; want 0, EIO", off, n, err)
		}
	}
	got := make([]byte, 1024)
	if n, err := d.ReadAt(ctx, got, 3072); n != 1024 || err != nil || !bytes.Equal(got, p) {
		t.Errorf("read back: %d, %v, equal %v", n, err, bytes.Equal(got, p))
	}
	if !bytes.Equal(d.Bytes()[3072:], p) || !bytes.Equal(d.Bytes()[:3072], make([]byte, 3072)) {
		t.Errorf("Bytes does not show exactly the write")
	}
	if c := d.Contents(); !bytes.Equal(c, d.Bytes()) || &c[0] == &d.Bytes()[0] {
		t.Errorf("Contents is not a copy of the contents")
	}
	if err := d.Discard(ctx, 3072, 512); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteZeroes(ctx, 3584, 256); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.Bytes()[3072:3840], make([]byte, 768)) || d.Bytes()[3840] != 7 {
		t.Errorf("discard and write-zeroes did not zero exactly their ranges")
	}
	if err := d.WriteZeroes(ctx, 4000, 200); !errors.Is(err, syscall.EIO) {
		t.Errorf("write-zeroes past the end: %v, want EIO", err)
	}
	for i := range 3 {
		if d.Flushes() != i {
			t.Fatalf("Flushes() = %d after %d flushes", d.Flushes(), i)
		}
		if err := d.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
