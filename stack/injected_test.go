package stack

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// TestInjectedErrors: what error, flakey and dust make up is EIO, as the
// kernel's DM_MAPIO_KILL and bio_io_error end a bio with BLK_STS_IOERR
// (drivers/md/dm-target.c: io_err_map; dm-flakey.c: flakey_map;
// dm-dust.c: __dust_map_read, __dust_map_write), and also ErrInjected; an
// error of the device below is EIO only.
func TestInjectedErrors(t *testing.T) {
	ctx := context.Background()
	devs := testDevs()
	buf := make([]byte, SectorSize)
	flakey := testDevice(t, "0 64 flakey 8:16 0 0 1", devs, nil)
	du := testDevice(t, "0 64 dust 8:16 0 512", devs, nil)
	dt, _, _ := du.Live().TargetAt(0)
	dustMsg(dt.(*dust), "enable")
	dustMsg(dt.(*dust), "addbadblock 0 1")
	errDev := testDevice(t, "0 64 error", devs, nil)
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"error read", func() error { _, err := errDev.ReadAt(ctx, buf, 0); return err }(), "error: injected read error: input/output error"},
		{"error write", func() error { _, err := errDev.WriteAt(ctx, buf, 0); return err }(), "error: injected write error: input/output error"},
		{"error discard", errDev.Discard(ctx, 0, 512), "error: injected discard error: input/output error"},
		{"flakey read", func() error { _, err := flakey.ReadAt(ctx, buf, 0); return err }(), "flakey: injected read error: input/output error"},
		{"flakey flush", flakey.Flush(ctx), "flakey: injected flush error: input/output error"},
		{"dust read", func() error { _, err := du.ReadAt(ctx, buf, 0); return err }(), "dust: injected read error: input/output error"},
		{"dust flush", du.Flush(ctx), "dust: injected flush error: input/output error"},
	} {
		var ie *InjectedError
		if !errors.Is(c.err, ErrInjected) || !errors.Is(c.err, syscall.EIO) || !errors.As(c.err, &ie) || c.err.Error() != c.want {
			t.Errorf("%s: %v, want %q (ErrInjected, EIO)", c.name, c.err, c.want)
		}
		var e syscall.Errno
		if !errors.As(c.err, &e) || e != syscall.EIO {
			t.Errorf("%s: errno %v, want EIO", c.name, e)
		}
	}
	// A real I/O error below a target is not injected: MemDevice fails a
	// range past its end with a plain EIO.
	short := map[string]*MemDevice{"8:16": NewMemDevice("8:16", 0)}
	lin := testDevice(t, "0 64 linear 8:16 0", short, nil)
	if _, err := lin.ReadAt(ctx, buf, 0); !errors.Is(err, syscall.EIO) || errors.Is(err, ErrInjected) {
		t.Errorf("device error through linear: %v, want EIO and not ErrInjected", err)
	}
}

// TestInjectedErrorsAllocateNothing: failing an I/O hands back a
// preallocated error.
func TestInjectedErrorsAllocateNothing(t *testing.T) {
	ctx := context.Background()
	buf := make([]byte, SectorSize)
	dev := NewMemDevice("8:16", 2048*SectorSize)
	f := flakeyDown(t, dev, "")
	d := newTestDust(t, dev, 64, "8:16 0 512", nil)
	dustMsg(d, "enable")
	dustMsg(d, "addbadblock 0")
	for name, op := range map[string]func(){
		"error read":   func() { errorTarget{}.ReadAt(ctx, buf, 0) },
		"flakey read":  func() { f.ReadAt(ctx, buf, 0) },
		"flakey flush": func() { f.Flush(ctx) },
		"dust read":    func() { d.ReadAt(ctx, buf, 0) },
	} {
		if n := testing.AllocsPerRun(100, op); n != 0 {
			t.Errorf("%s: %v allocations per failed I/O", name, n)
		}
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[ioop.Op]string{ioop.Read: "read", ioop.Write: "write", ioop.Flush: "flush", ioop.Discard: "discard", ioop.Zeroes: "zeroes", ioop.NumOps: "I/O"} {
		if got := op.String(); got != want {
			t.Errorf("%d: %q, want %q", op, got, want)
		}
	}
}
