package dmioctl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// Memory is the argument of one ioctl: the caller's buffer, read and written
// at offsets from the pointer the caller passed. An error is a fault
// (EFAULT): the range is not the caller's memory.
type Memory interface {
	ReadAt(p []byte, off int64) error
	WriteAt(p []byte, off int64) error
}

// Caller is who made an ioctl.
type Caller struct {
	// Admin is set when the caller has CAP_SYS_ADMIN, without which the
	// kernel's device-mapper refuses every command (EACCES).
	Admin bool
	// File is the open control node the ioctl came through: what
	// DM_DEV_ARM_POLL arms. nil refuses it.
	File *File
}

// File is one open of the control node, as the kernel's struct dm_file:
// the global event number it was armed at. A poll of it is ready once the
// manager's global event number has moved past that (dm_poll).
type File struct {
	armed atomic.Uint32
}

// NewFile returns a File armed at m's current global event number, as an
// open of the control node is (dm_open).
func NewFile(m *stack.Manager) *File {
	f := &File{}
	f.armed.Store(m.GlobalEvent())
	return f
}

// Ready reports whether a poll of f is ready (EPOLLIN) at global event
// number g.
func (f *File) Ready(g uint32) bool { return int32(g-f.armed.Load()) > 0 }

// Server answers device-mapper's ioctls (drivers/md/dm-ioctl.c) on the
// devices of one Manager. Every method may be called concurrently; a
// DM_DEV_WAIT blocks only its own caller.
type Server struct {
	mgr *stack.Manager
	log func(line string)
}

// NewServer returns a server of m's devices. log receives each line the
// kernel would log with DMERR or DMWARN, with its "device-mapper: ioctl: "
// or "device-mapper: table: " prefix; nil drops them.
func NewServer(m *stack.Manager, log func(line string)) *Server {
	if log == nil {
		log = func(string) {}
	}
	return &Server{mgr: m, log: log}
}

// Manager returns the manager whose devices s serves.
func (s *Server) Manager() *stack.Manager { return s.mgr }

func (s *Server) errf(format string, a ...any) {
	s.log("device-mapper: ioctl: " + fmt.Sprintf(format, a...))
}

// ioctl flags of a command (lookup_ioctl).
const (
	noParams    = 1 // the command takes no data beyond the header
	globalEvent = 2 // a success is a global event (the manager raises it)
)

// command is one entry of the table of commands.
type command struct {
	flags int
	run   func(s *Server, ctx context.Context, c Caller, p param, inputSize uint32) error
}

var commands = [...]command{
	CmdVersion:          {0, nil},
	CmdRemoveAll:        {noParams | globalEvent, (*Server).removeAll},
	CmdListDevices:      {0, (*Server).listDevices},
	CmdDevCreate:        {noParams | globalEvent, (*Server).devCreate},
	CmdDevRemove:        {noParams | globalEvent, (*Server).devRemove},
	CmdDevRename:        {globalEvent, (*Server).devRename},
	CmdDevSuspend:       {noParams, (*Server).devSuspend},
	CmdDevStatus:        {noParams, (*Server).devStatus},
	CmdDevWait:          {0, (*Server).devWait},
	CmdTableLoad:        {0, (*Server).tableLoad},
	CmdTableClear:       {noParams, (*Server).tableClear},
	CmdTableDeps:        {0, (*Server).tableDeps},
	CmdTableStatus:      {0, (*Server).tableStatus},
	CmdListVersions:     {0, (*Server).listVersions},
	CmdTargetMsg:        {0, (*Server).targetMessage},
	CmdDevSetGeometry:   {0, (*Server).devSetGeometry},
	CmdDevArmPoll:       {noParams, (*Server).devArmPoll},
	CmdGetTargetVersion: {0, (*Server).getTargetVersion},
	CmdMpathProbePaths:  {0, nil}, // a block device ioctl
}

// Ioctl runs the device-mapper ioctl number cmd with argument mem, as the
// kernel's ctl_ioctl does: it checks the caller's capability, the command
// and the interface version (writing the kernel's version back in every
// case), copies in the header and, for a command that takes data, the
// data_size bytes of the buffer, runs the command, and on success writes
// back the header and the data the command produced. It returns the errno
// of the ioctl (0 on success). ctx ends a DM_DEV_WAIT early (EINTR).
func (s *Server) Ioctl(ctx context.Context, cmd uint32, mem Memory, c Caller) syscall.Errno {
	if !c.Admin {
		return syscall.EACCES
	}
	if cmd>>8&0xff != Type {
		return syscall.ENOTTY
	}
	nr := cmd & 0xff
	// check_version: the version in, the kernel's out, whatever the result.
	var head [minDataSize]byte
	if mem.ReadAt(head[:12], 0) != nil {
		return syscall.EFAULT
	}
	v := [3]uint32{le.Uint32(head[0:]), le.Uint32(head[4:]), le.Uint32(head[8:])}
	var mine [12]byte
	le.PutUint32(mine[0:], VersionMajor)
	le.PutUint32(mine[4:], VersionMinor)
	le.PutUint32(mine[8:], VersionPatch)
	if mem.WriteAt(mine[:], 0) != nil {
		return syscall.EFAULT
	}
	if v[0] != VersionMajor || v[1] > VersionMinor {
		s.errf("ioctl interface mismatch: kernel(%d.%d.%d), user(%d.%d.%d), cmd(%d)", VersionMajor, VersionMinor, VersionPatch, v[0], v[1], v[2], nr)
		return syscall.EINVAL
	}
	if nr == CmdVersion {
		return 0
	}
	if int(nr) >= len(commands) || commands[nr].run == nil {
		s.errf("dm_ctl_ioctl: unknown command 0x%x", cmd)
		return syscall.ENOTTY
	}
	cm := commands[nr]

	// copy_params.
	if mem.ReadAt(head[12:], 12) != nil {
		return syscall.EFAULT
	}
	copy(head[:12], mine[:])
	size := le.Uint32(head[offDataSize:])
	if size < minDataSize || size > maxDataSize {
		s.errf("Invalid data size in the ioctl structure: %d", size)
		return syscall.EINVAL
	}
	secure := le.Uint32(head[offFlags:])&FlagSecureData != 0
	var b []byte
	if cm.flags&noParams != 0 {
		b = make([]byte, HeaderSize)
		copy(b, head[:])
		le.PutUint32(b[offDataSize:], minDataSize)
	} else {
		b = make([]byte, size)
		copy(b, head[:])
		if mem.ReadAt(b[minDataSize:], minDataSize) != nil {
			return syscall.EFAULT
		}
	}
	if secure {
		// The caller's copy of the secret goes at once; ours after use.
		defer clear(b)
		if mem.WriteAt(make([]byte, size), 0) != nil {
			return syscall.EFAULT
		}
	}
	p := param{b: b}
	inputSize := p.dataSize()
	if err := s.validate(nr, p); err != nil {
		return errnoOf(err)
	}
	p.setDataSize(minDataSize)
	if err := cm.run(s, ctx, c, p, inputSize); err != nil {
		return errnoOf(err)
	}
	if mem.WriteAt(b[:p.dataSize()], 0) != nil {
		return syscall.EFAULT
	}
	return 0
}

// validate is validate_params: the flags a caller may not set are cleared,
// create needs a name, others take a name or a uuid (not both), and the
// strings end within their fields.
func (s *Server) validate(nr uint32, p param) error {
	p.clearFlags(FlagBufferFull | FlagUeventGenerated | FlagSecureData | FlagDataOut)
	if nr == CmdRemoveAll || nr == CmdListDevices || nr == CmdListVersions {
		return nil
	}
	if nr == CmdDevCreate {
		if p.b[offName] == 0 {
			s.errf("name not supplied when creating device")
			return syscall.EINVAL
		}
	} else if p.b[offUUID] != 0 && p.b[offName] != 0 {
		s.errf("only supply one of name or uuid, cmd(%d)", nr)
		return syscall.EINVAL
	}
	p.b[offName+NameLen-1] = 0
	p.b[offUUID+UUIDLen-1] = 0
	return nil
}

// errnoOf returns the errno err carries, EINVAL if none.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EINVAL
}

// find is __find_device_hash_cell: the device the request names by uuid,
// name or number (exactly one of them), with its name and uuid written into
// p and DM_INACTIVE_PRESENT_FLAG set as it has an inactive table; nil (ENXIO
// for the caller) when there is none.
func (s *Server) find(p param) *stack.Device {
	var d *stack.Device
	uuid, name, dev := p.uuid(), p.name(), p.dev()
	switch {
	case uuid != "":
		if name != "" || dev != 0 {
			s.errf("Invalid ioctl structure: uuid %s, name %s, dev %x", uuid, name, dev)
			return nil
		}
		d = s.mgr.LookupUUID(uuid)
	case name != "":
		if dev != 0 {
			s.errf("Invalid ioctl structure: name %s, dev %x", name, dev)
			return nil
		}
		d = s.mgr.Lookup(name)
	case dev != 0:
		maj, min := DecodeDev(dev)
		if maj == s.mgr.Major() {
			d = s.mgr.LookupMinor(min)
		}
	}
	if d == nil {
		return nil
	}
	p.setName(d.Name())
	p.setUUID(d.UUID())
	if d.Inactive() != nil {
		p.orFlags(FlagInactivePresent)
	} else {
		p.clearFlags(FlagInactivePresent)
	}
	return d
}

// status is __dev_status: d's state into the header.
func (s *Server) status(d *stack.Device, p param) {
	p.clearFlags(FlagSuspend | FlagReadOnly | FlagActivePresent | FlagInternalSuspend)
	in := d.Info(false)
	if in.Suspended {
		p.orFlags(FlagSuspend)
	}
	if in.DeferredRemove {
		p.orFlags(FlagDeferredRemove)
	}
	p.setDev(EncodeDev(d.Major(), d.Minor()))
	// DM_SKIP_BDGET_FLAG is libdevmapper's "noopencount": the caller does
	// not read the count (the kernel fills it anyway), so the scan of every
	// process for the users of the exported block device is left out.
	if p.has(FlagSkipBdget) {
		p.setU32(offOpenCount, uint32(s.mgr.FileOpenCount(d)))
	} else {
		p.setU32(offOpenCount, uint32(s.mgr.OpenCount(d)))
	}
	p.setU32(offEventNr, d.EventNr())
	p.setU32(offTargetCount, 0)
	inactive := p.has(FlagQueryInactive)
	d.WithTables(func(live, in *stack.Table) {
		if live != nil {
			if !inactive {
				if d.ReadOnly() {
					p.orFlags(FlagReadOnly)
				}
				p.setU32(offTargetCount, uint32(live.NumTargets()))
			}
			p.orFlags(FlagActivePresent)
		}
		if inactive && in != nil {
			if in.ReadOnly() {
				p.orFlags(FlagReadOnly)
			}
			p.setU32(offTargetCount, uint32(in.NumTargets()))
		}
	})
}

// resultBuffer is get_result_buffer: data_start set to the first 8-byte
// boundary after the header, and the room from there to the end of the
// caller's buffer.
func resultBuffer(p param, inputSize uint32) (start int, room int) {
	start = align8(HeaderSize)
	p.setU32(offDataStart, uint32(start))
	if uint32(start) < inputSize {
		room = int(inputSize) - start
	}
	return start, room
}

// checkName is check_name, with dmfuse's own rules for names (ValidName:
// its devices are files on its mount, and names in tables may not look like
// numbers or paths).
func (s *Server) checkName(name string) error {
	if strings.Contains(name, "/") {
		s.errf("device name cannot contain '/'")
		return syscall.EINVAL
	}
	if name == "control" || name == "." || name == ".." {
		s.errf(`device name cannot be "control", ".", or ".."`)
		return syscall.EINVAL
	}
	if err := stack.ValidName(name); err != nil {
		s.errf("%v", err)
		return syscall.EINVAL
	}
	return nil
}
