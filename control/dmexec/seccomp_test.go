package dmexec

import (
	"testing"

	"golang.org/x/sys/unix"
)

// run interprets the filter's classic BPF (the opcodes program uses) on one
// seccomp_data and returns the action.
func run(t *testing.T, prog []unix.SockFilter, arch, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	word := func(off uint32) uint32 {
		switch {
		case off == offNr:
			return nr
		case off == offArch:
			return arch
		case off >= offArg && off < offArg+48 && (off-offArg)%4 == 0:
			a := args[(off-offArg)/8]
			if (off-offArg)%8 == 4 {
				return uint32(a >> 32)
			}
			return uint32(a)
		}
		t.Fatalf("load at offset %d", off)
		return 0
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case bpfLdWAbs:
			acc = word(in.K)
		case bpfAndK:
			acc &= in.K
		case bpfJeqK, bpfJsetK:
			taken := acc == in.K
			if in.Code == bpfJsetK {
				taken = acc&in.K != 0
			}
			if taken {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case bpfRetK:
			return in.K
		default:
			t.Fatalf("opcode %#x at %d", in.Code, pc)
		}
	}
	t.Fatal("ran off the end of the filter")
	return 0
}

// TestFilter: the calls that can name a dm node, a DM ioctl, a stat of a
// descriptor and mount go to the supervisor; the same calls in forms that
// cannot concern it, every other call and every call of another
// architecture run untouched.
func TestFilter(t *testing.T) {
	prog := program()
	if len(prog) > unix.BPF_MAXINSNS {
		t.Fatalf("%d instructions", len(prog))
	}
	const x86 = unix.AUDIT_ARCH_X86_64
	notify, allow := uint32(unix.SECCOMP_RET_USER_NOTIF), uint32(unix.SECCOMP_RET_ALLOW)
	for _, tc := range []struct {
		name string
		arch uint32
		nr   uint32
		args [6]uint64
		want uint32
	}{
		{"open", x86, unix.SYS_OPEN, [6]uint64{}, notify},
		{"openat", x86, unix.SYS_OPENAT, [6]uint64{}, notify},
		{"openat2", x86, unix.SYS_OPENAT2, [6]uint64{}, notify},
		{"DM_VERSION", x86, unix.SYS_IOCTL, [6]uint64{3, 0xc138fd00}, notify},
		{"DM_DEV_CREATE", x86, unix.SYS_IOCTL, [6]uint64{3, 0xc138fd03}, notify},
		{"a DM request with high bits in the 64-bit argument", x86, unix.SYS_IOCTL, [6]uint64{3, 0xffffffff_c138fd09}, notify},
		{"BLKGETSIZE64", x86, unix.SYS_IOCTL, [6]uint64{3, unix.BLKGETSIZE64}, allow},
		{"TCGETS", x86, unix.SYS_IOCTL, [6]uint64{0, unix.TCGETS}, allow},
		{"fstat", x86, unix.SYS_FSTAT, [6]uint64{3}, notify},
		{"newfstatat AT_EMPTY_PATH", x86, unix.SYS_NEWFSTATAT, [6]uint64{3, 0, 0, unix.AT_EMPTY_PATH}, notify},
		{"newfstatat of a path", x86, unix.SYS_NEWFSTATAT, [6]uint64{0xffffff9c, 0, 0, unix.AT_SYMLINK_NOFOLLOW}, allow},
		{"statx AT_EMPTY_PATH", x86, unix.SYS_STATX, [6]uint64{3, 0, unix.AT_EMPTY_PATH | unix.AT_STATX_SYNC_AS_STAT}, notify},
		{"statx of a path", x86, unix.SYS_STATX, [6]uint64{3, 0, 0, unix.STATX_BASIC_STATS}, allow},
		{"mount", x86, unix.SYS_MOUNT, [6]uint64{}, notify},
		{"read", x86, unix.SYS_READ, [6]uint64{3}, allow},
		{"umount2", x86, unix.SYS_UMOUNT2, [6]uint64{}, allow},
		{"i386 open (5)", unix.AUDIT_ARCH_I386, 5, [6]uint64{}, allow},
		{"i386 ioctl (54) of DM", unix.AUDIT_ARCH_I386, 54, [6]uint64{3, 0xc138fd00}, allow},
	} {
		if got := run(t, prog, tc.arch, tc.nr, tc.args); got != tc.want {
			t.Errorf("%s: action %#x, want %#x", tc.name, got, tc.want)
		}
	}
}
