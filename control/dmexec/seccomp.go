package dmexec

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's seccomp user-notification structures (uapi/linux/seccomp.h);
// golang.org/x/sys has the constants but not these types.
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

type seccompNotifAddfd struct {
	ID         uint64
	Flags      uint32
	Srcfd      uint32
	Newfd      uint32
	NewfdFlags uint32
}

// SECCOMP_IOCTL_NOTIF_ID_VALID and _ADDFD (_IOW('!', 2, __u64) and
// _IOW('!', 3, struct seccomp_notif_addfd)).
const (
	ioctlNotifIDValid = 0x40082102
	ioctlNotifAddfd   = 0x40182103
)

// BPF opcodes (linux/filter.h).
const (
	bpfLdWAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfAndK   = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// offsets in struct seccomp_data
const (
	offNr   = 0
	offArch = 4
	offArg  = 16 // args[i] at 16 + 8i; the low 32 bits first on little-endian
)

// program returns the filter: on x86_64, open, openat and openat2; ioctl
// whose request is of type 0xfd (device-mapper's); fstat, and newfstatat
// and statx with AT_EMPTY_PATH (a stat of an open descriptor); and mount go
// to the supervisor; everything else runs. Other architectures' calls (a
// 32-bit program) run untouched.
func program() []unix.SockFilter {
	var p []unix.SockFilter
	stmt := func(code uint16, k uint32) { p = append(p, unix.SockFilter{Code: code, K: k}) }
	jump := func(code uint16, k uint32, jt, jf uint8) {
		p = append(p, unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf})
	}
	type cond struct {
		nr  uint32
		arg int    // -1: the call itself
		and uint32 // with arg: the bits that must be set (jset) ...
		eq  uint32 // ... or, with and, the value the masked arg must equal
	}
	conds := []cond{
		{nr: unix.SYS_OPEN, arg: -1}, {nr: unix.SYS_OPENAT, arg: -1}, {nr: unix.SYS_OPENAT2, arg: -1},
		{nr: unix.SYS_IOCTL, arg: 1, and: 0xff00, eq: 0xfd00},
		{nr: unix.SYS_FSTAT, arg: -1},
		{nr: unix.SYS_NEWFSTATAT, arg: 3, and: unix.AT_EMPTY_PATH},
		{nr: unix.SYS_STATX, arg: 2, and: unix.AT_EMPTY_PATH},
		{nr: unix.SYS_MOUNT, arg: -1},
	}
	stmt(bpfLdWAbs, offArch)
	// Not x86_64: allow.
	jump(bpfJeqK, unix.AUDIT_ARCH_X86_64, 1, 0)
	stmt(bpfRetK, unix.SECCOMP_RET_ALLOW)
	for _, c := range conds {
		stmt(bpfLdWAbs, offNr)
		if c.arg < 0 {
			// nr == c.nr: notify; else next condition.
			jump(bpfJeqK, c.nr, 0, 1)
			stmt(bpfRetK, unix.SECCOMP_RET_USER_NOTIF)
			continue
		}
		if c.eq != 0 {
			jump(bpfJeqK, c.nr, 0, 4)
			stmt(bpfLdWAbs, uint32(offArg+8*c.arg))
			stmt(bpfAndK, c.and)
			jump(bpfJeqK, c.eq, 0, 1)
			stmt(bpfRetK, unix.SECCOMP_RET_USER_NOTIF)
			continue
		}
		jump(bpfJeqK, c.nr, 0, 3)
		stmt(bpfLdWAbs, uint32(offArg+8*c.arg))
		jump(bpfJsetK, c.and, 0, 1)
		stmt(bpfRetK, unix.SECCOMP_RET_USER_NOTIF)
	}
	stmt(bpfRetK, unix.SECCOMP_RET_ALLOW)
	return p
}

// installFilter installs the filter on the calling thread, which the caller
// has locked and which execs next, and returns the listener's descriptor.
// Root installs it without no_new_privs; anyone else needs it set.
// WAIT_KILLABLE_RECV keeps a call the supervisor has taken from being
// interrupted and issued again by a signal (a DM ioctl that creates or
// removes would run twice); only a fatal signal ends it.
func installFilter() (int, error) {
	if unix.Geteuid() != 0 {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return -1, fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)
		}
	}
	prog := program()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV)
	fd, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}
