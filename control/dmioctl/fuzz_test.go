package dmioctl

import (
	"context"
	"testing"
)

// FuzzIoctl runs every command on arbitrary buffers over a manager with
// devices: no input may panic, and nothing is read or written outside the
// caller's buffer (its Memory refuses that with EFAULT, which must then be
// what the ioctl returns, not a crash).
func FuzzIoctl(f *testing.F) {
	for _, r := range []req{
		{name: "a"},
		load("a", spec{0, 8, "linear", "8:16 0"}, spec{8, 8, "zero", ""}),
		{name: "a", payload: append(make([]byte, msgHeaderSize), "@stats_list\x00"...)},
		{name: "a", payload: []byte("b\x00")},
		{name: "a", payload: []byte("1 2 3 0\x00")},
		{flags: FlagUUID},
	} {
		r.size = 1024
		for _, nr := range []byte{CmdDevCreate, CmdTableLoad, CmdTargetMsg, CmdDevRename, CmdDevSetGeometry, CmdListDevices, CmdTableStatus} {
			f.Add(nr, []byte(r.bytes()))
		}
	}
	f.Fuzz(func(t *testing.T, nr byte, data []byte) {
		e := newEnv(t)
		e.must(CmdDevCreate, req{name: "x"})
		e.must(CmdTableLoad, load("x", spec{0, 8, "zero", ""}))
		e.must(CmdDevSuspend, req{name: "x"})
		b := buf(data)
		if uint32(nr)%32 == CmdDevWait {
			return // blocks until an event by design
		}
		e.srv.Ioctl(context.Background(), Ioctl(uint32(nr)%32), b, Caller{Admin: true, File: NewFile(e.mgr)})
	})
}
