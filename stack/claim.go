package stack

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Exclusive claims. The kernel's device-mapper opens every block device a
// live or inactive table uses with one holder for all of dm
// (drivers/md/dm.c: open_table_device, bdev_file_open_by_dev with
// _dm_claim_ptr), so that tables share a device among themselves while a
// mount, or any other exclusive open, of a device under a table fails with
// EBUSY, and a table over a device someone else holds exclusively (a
// mounted file system) fails to load. dmfuse does the same with one
// O_EXCL open per block device and process, counted by the tables'
// handles of the device and closed with the last of them: a reload that
// keeps a device takes a second reference to the same claim and never
// conflicts with itself. Regular files are not claimed.
//
// The claim is also where discards and write-zeroes go: BLKDISCARD and
// BLKZEROOUT drop the device's page cache over the range first, which a
// descriptor without O_EXCL can do only by invalidating, and invalidating
// fails with EBUSY on a page a buffered write left dirty. From the holder's
// descriptor the kernel truncates the range instead, as dm's own bios never
// meet the page cache at all.

// claims are the block devices this process holds exclusively, by number.
// The lock is taken on the control path only (opening and closing
// tables), never by I/O.
var claims = struct {
	sync.Mutex
	m map[uint64]*claim
}{m: map[uint64]*claim{}}

// claim is one exclusive open of a block device and its users.
type claim struct {
	fd       int
	writable bool
	refs     int
}

// claimBlock takes a reference to the exclusive claim of block device rdev,
// of which fd is an open descriptor: the first reference opens the device
// again with O_EXCL (through /proc/self/fd, so that it is the same device
// whatever its path names now), for writing unless the device is read-only.
// It returns the claim's descriptor while it is writable (for discards and
// write-zeroes; valid until the reference is dropped), else -1. A device
// someone else holds exclusively fails with EBUSY.
func claimBlock(fd int, rdev uint64) (int, error) {
	claims.Lock()
	defer claims.Unlock()
	c := claims.m[rdev]
	if c == nil {
		path := fmt.Sprintf("/proc/self/fd/%d", fd)
		cfd, err := unix.Open(path, unix.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
		c = &claim{fd: cfd, writable: true}
		if err == unix.EROFS || err == unix.EACCES || err == unix.EPERM {
			cfd, err = unix.Open(path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
			c = &claim{fd: cfd}
		}
		if err != nil {
			return -1, err
		}
		claims.m[rdev] = c
	}
	c.refs++
	if !c.writable {
		return -1, nil
	}
	return c.fd, nil
}

// releaseBlock drops a reference to the claim of block device rdev; the
// last one closes it.
func releaseBlock(rdev uint64) {
	claims.Lock()
	defer claims.Unlock()
	c := claims.m[rdev]
	if c == nil {
		return
	}
	if c.refs--; c.refs == 0 {
		delete(claims.m, rdev)
		unix.Close(c.fd)
	}
}
