package uring

import (
	"sync"

	"golang.org/x/sys/unix"
)

// loadavg reads the number of runnable threads of the machine, the first
// number of the fourth field of /proc/loadavg ("0.52 0.58 0.59 3/251 1234"):
// the kernel's nr_running(), every CPU's running and queued threads at the
// moment of the read, the reader included.
type loadavg struct {
	mu  sync.Mutex
	fd  int
	buf [128]byte
}

// openLoadavg opens /proc/loadavg, or returns nil if it cannot.
func openLoadavg() *loadavg {
	fd, err := unix.Open("/proc/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return &loadavg{fd: fd}
}

// runnable returns the number of runnable threads, and false if it cannot
// be read.
func (l *loadavg) runnable() (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := unix.Pread(l.fd, l.buf[:], 0)
	if err != nil || n <= 0 {
		return 0, false
	}
	return parseRunnable(l.buf[:n])
}

// close closes the file.
func (l *loadavg) close() { unix.Close(l.fd) }

// parseRunnable returns the number before the '/' of the fourth field of a
// /proc/loadavg line.
func parseRunnable(b []byte) (int, bool) {
	field := 0
	for i := 0; i < len(b); i++ {
		if b[i] == ' ' {
			field++
			continue
		}
		if field < 3 {
			continue
		}
		n, digits := 0, 0
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			n = 10*n + int(b[i]-'0')
			digits++
		}
		return n, digits > 0 && i < len(b) && b[i] == '/'
	}
	return 0, false
}
