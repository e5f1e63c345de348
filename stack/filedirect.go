package stack

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/internal/ioop"
)

// A write of a block device that a transport issues through its ring
// (FileIO) goes to the device with direct I/O where its offset and length
// are aligned for it, as device-mapper's own writes go to the disk: a
// buffered write through the ring is handed to a worker thread, and a
// pwrite into the block device's page cache is throttled by its writeback
// down to the disk's speed plus a copy. On a loop device, 4k randwrite
// 2x32 through the ring with direct I/O served 4.3x the pwrite path, and a
// pwrite with O_DIRECT, which holds a thread until the disk answers, 0.13x
// the ring (docs/benchmarks.md, Backing kinds). Reads keep the buffered
// descriptor through the ring: cached, they are copies (1.9-2.2x the direct
// reads in the same run), and uncached ones complete without a worker too.
// The kernel keeps the two descriptors coherent: a direct write writes
// back and then drops the cached pages of its range.
//
// The ring's buffers are aligned to the page; one that is not makes the
// write fail with EINVAL, and FileIO.End does it again with WriteAt.

// openDirect opens the block device of d again for writing with O_DIRECT
// and records its offset alignment; d.dfd stays -1 if the device takes no
// direct I/O.
func (d *fileDev) openDirect() {
	var st unix.Statx_t
	if unix.Statx(d.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st) != nil ||
		st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 || st.Dio_mem_align == 0 || st.Dio_mem_align > 4096 {
		return
	}
	// The open file, whatever its path names now.
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", d.fd), unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	d.dfd, d.dioOff = fd, int64(st.Dio_offset_align)
}

// ringFD returns the descriptor on which io_uring does a read (k ioop.Read)
// or write of n bytes at off of d without a worker thread, or -1 if there
// is none: for writes the direct one where the write is aligned for it,
// for reads the buffered one of a file whose system reads without blocking
// (asyncRead).
func (d *fileDev) ringFD(k ioop.Op, off int64, n int) int {
	switch {
	case k == ioop.Read && d.asyncRead:
		return d.fd
	case k == ioop.Write && d.dfd >= 0 && off%d.dioOff == 0 && int64(n)%d.dioOff == 0:
		return d.dfd
	}
	return -1
}
