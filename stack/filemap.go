package stack

import (
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// maxMapped bounds the size of a backing file that is mapped: larger
// files keep pread and pwrite, so that the daemon's address space holds no
// more than this per file.
const maxMapped = 64 << 30

// mapFile maps a regular file in memory (tmpfs, ramfs) of size bytes,
// shared, so that reads and writes of the device are copies from and into
// the page cache without a system call each (a pread or pwrite costs 2.5-3
// us on a VM, a 4 KiB copy 0.5-0.8). It returns nil when the file is not
// worth or not fit for mapping; the caller keeps the system calls then.
func mapFile(fd int, size int64, readOnly bool) []byte {
	if size <= 0 || size > maxMapped || size%SectorSize != 0 {
		return nil
	}
	prot := unix.PROT_READ | unix.PROT_WRITE
	if readOnly {
		prot = unix.PROT_READ
	}
	m, err := unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	return m
}

// mapped returns bytes [off, off+n) of d's mapping, nil when d is not
// mapped or its mapping does not hold them.
func (d *fileDev) mapped(off int64, n int) []byte {
	if d.mm == nil || off < 0 || off+int64(n) > int64(len(d.mm)) {
		return nil
	}
	return d.mm[off : off+int64(n)]
}

// copyMapped copies src to dst where one of them is in a file's mapping.
// A page past the file's end (the file shrank under the table) faults with
// SIGBUS: the copy then stops, and copyMapped reports false so that the
// caller does the I/O with a system call, which says what the file holds
// now (reads past its end read as zeros, writes extend it), as before the
// mapping.
func copyMapped(dst, src []byte) (ok bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}()
	copy(dst, src)
	return true
}
