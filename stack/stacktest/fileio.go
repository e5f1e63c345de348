package stacktest

import (
	"context"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// deviceIO is the I/O the suite does to the device under test.
type deviceIO interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
}

// fileIO does the suite's I/O through a device file, with the system calls
// a user of the file makes: pread and pwrite, which return a short count
// at the end of the device and the errno of a failure, and fsync.
type fileIO struct{ f *os.File }

// openFileIO opens the device file at path for the rest of the test.
func openFileIO(t testing.TB, path string) fileIO {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("opening the device file: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return fileIO{f}
}

func (f fileIO) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(int(f.f.Fd()), p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

func (f fileIO) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pwrite(int(f.f.Fd()), p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

func (f fileIO) Flush(context.Context) error {
	for {
		if err := unix.Fsync(int(f.f.Fd())); err != unix.EINTR {
			return err
		}
	}
}
