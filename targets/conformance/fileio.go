package conformance

import (
	"context"
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
// at the end of the device and the errno of a failure, and fsync. The file
// is opened with open(2), not os.OpenFile: the Go runtime adds a file that
// os opens to its epoll set, which on a FUSE file sends FUSE_POLL to the
// daemon, and a daemon serving the mount from this process cannot answer
// while a garbage collection stops the world, which waits for the thread
// blocked in epoll_ctl.
type fileIO struct{ fd int }

// openFileIO opens the device file at path for the rest of the test.
func openFileIO(t testing.TB, path string) fileIO {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening the device file: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fileIO{fd}
}

func (f fileIO) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(f.fd, p, off)
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
		n, err := unix.Pwrite(f.fd, p, off)
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
		if err := unix.Fsync(f.fd); err != unix.EINTR {
			return err
		}
	}
}
