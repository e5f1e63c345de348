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

// claims are the block devices this process holds exclusively, by number.
// The lock is taken on the control path only (opening and closing
// tables), never by I/O.
var claims = struct {
	sync.Mutex
	m map[uint64]*claim
}{m: map[uint64]*claim{}}

// claim is one exclusive open of a block device and its users.
type claim struct {
	fd   int
	refs int
}

// claimBlock takes a reference to the exclusive claim of block device rdev,
// of which fd is an open descriptor: the first reference opens the device
// again with O_EXCL (through /proc/self/fd, so that it is the same device
// whatever its path names now). A device someone else holds exclusively
// fails with EBUSY.
func claimBlock(fd int, rdev uint64) error {
	claims.Lock()
	defer claims.Unlock()
	if c := claims.m[rdev]; c != nil {
		c.refs++
		return nil
	}
	cfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	claims.m[rdev] = &claim{fd: cfd, refs: 1}
	return nil
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
