package dmexec

import (
	"bytes"

	"golang.org/x/sys/unix"
)

// mem is the memory of a trapped call's caller from address base on, read
// and written with process_vm_readv and process_vm_writev (the caller is
// stopped in the call, so what it holds there does not change under us).
// Every write first checks that the call is still the caller's
// (SECCOMP_IOCTL_NOTIF_ID_VALID), so that nothing is written into a process
// that took over a dead caller's pid.
type mem struct {
	c    *call
	base uint64
}

// ReadAt reads len(p) bytes at base+off.
func (m mem) ReadAt(p []byte, off int64) error {
	for done := 0; done < len(p); {
		n, err := unix.ProcessVMReadv(m.c.pid, []unix.Iovec{{Base: &p[done], Len: uint64(len(p) - done)}},
			[]unix.RemoteIovec{{Base: uintptr(m.base) + uintptr(off) + uintptr(done), Len: len(p) - done}}, 0)
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.EFAULT
		}
		done += n
	}
	return nil
}

// WriteAt writes p at base+off.
func (m mem) WriteAt(p []byte, off int64) error {
	if !m.c.valid() {
		return unix.ESRCH
	}
	for done := 0; done < len(p); {
		n, err := unix.ProcessVMWritev(m.c.pid, []unix.Iovec{{Base: &p[done], Len: uint64(len(p) - done)}},
			[]unix.RemoteIovec{{Base: uintptr(m.base) + uintptr(off) + uintptr(done), Len: len(p) - done}}, 0)
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.EFAULT
		}
		done += n
	}
	return nil
}

// cstring reads the NUL-terminated string at addr in the caller's memory,
// of at most max bytes (ENAMETOOLONG past that). It reads up to the end of
// each page at a time, so that a string near the end of the caller's
// memory reads without touching the page after it.
func (c *call) cstring(addr uint64, max int) (string, error) {
	if addr == 0 {
		return "", unix.EFAULT
	}
	const page = 4096
	var out []byte
	for len(out) <= max {
		n := page - int(addr%page)
		buf := make([]byte, n)
		k, err := unix.ProcessVMReadv(c.pid, []unix.Iovec{{Base: &buf[0], Len: uint64(n)}},
			[]unix.RemoteIovec{{Base: uintptr(addr), Len: n}}, 0)
		if err != nil {
			return "", err
		}
		if k == 0 {
			return "", unix.EFAULT
		}
		if i := bytes.IndexByte(buf[:k], 0); i >= 0 {
			out = append(out, buf[:i]...)
			if len(out) > max {
				break
			}
			return string(out), nil
		}
		out = append(out, buf[:k]...)
		addr += uint64(k)
	}
	return "", unix.ENAMETOOLONG
}
