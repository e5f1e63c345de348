package dmioctl

import (
	"bytes"
	"context"
	"errors"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/dmarg"
	"github.com/dmfuse/dmfuse/stack"
)

// Each command below is its namesake in drivers/md/dm-ioctl.c, in its
// order of checks and with its errnos and log lines.

func (s *Server) removeAll(_ context.Context, _ Caller, p param, _ uint32) error {
	left := s.mgr.RemoveAll(stack.Flags{Deferred: p.has(FlagDeferredRemove)})
	if len(left) > 0 {
		s.log("device-mapper: ioctl: remove_all left " + itoa(len(left)) + " open device(s)")
	}
	p.setDataSize(0)
	return nil
}

func (s *Server) listDevices(_ context.Context, _ Caller, p param, inputSize uint32) error {
	pfxName, pfxUUID := p.name(), p.uuid()
	withUUID := p.has(FlagUUID)
	var devs []*stack.Device
	needed := 0
	for _, d := range s.mgr.Devices() {
		if !hasPrefix(d.Name(), pfxName) || !hasPrefix(d.UUID(), pfxUUID) {
			continue
		}
		devs = append(devs, d)
		needed += align8(nameListHeader+len(d.Name())+1) + align8(8)
		if withUUID && d.UUID() != "" {
			needed += align8(len(d.UUID()) + 1)
		}
	}
	start, room := resultBuffer(p, inputSize)
	if room < needed || room < 8 {
		p.orFlags(FlagBufferFull)
		return nil
	}
	p.setDataSize(uint32(start + needed))
	le.PutUint64(p.b[start:], 0) // no devices: a zero dev flags no data
	out := p.b[start : start+needed]
	at, prev := 0, -1
	for _, d := range devs {
		if prev >= 0 {
			le.PutUint32(out[prev+8:], uint32(at-prev))
		}
		le.PutUint64(out[at:], EncodeDev(d.Major(), d.Minor()))
		le.PutUint32(out[at+8:], 0)
		n := copy(out[at+nameListHeader:], d.Name())
		out[at+nameListHeader+n] = 0
		ev := align8(at + nameListHeader + n + 1)
		le.PutUint32(out[ev:], d.EventNr())
		flags := uint32(0)
		next := align8(ev + 8)
		if withUUID {
			if u := d.UUID(); u != "" {
				flags |= NameListHasUUID
				n := copy(out[next:], u)
				out[next+n] = 0
				next = align8(next + n + 1)
			} else {
				flags |= NameListDoesntHaveUUID
			}
		}
		le.PutUint32(out[ev+4:], flags)
		prev, at = at, next
	}
	return nil
}

func hasPrefix(s, pfx string) bool { return len(pfx) <= len(s) && s[:len(pfx)] == pfx }

func (s *Server) devCreate(_ context.Context, _ Caller, p param, _ uint32) error {
	name := p.name()
	if err := s.checkName(name); err != nil {
		return err
	}
	minor := -1
	if p.has(FlagPersistentDev) {
		_, m := DecodeDev(p.dev())
		minor = int(m)
	}
	uuid := p.uuid()
	if err := stack.ValidUUID(uuid); err != nil {
		s.errf("%v", err)
		return syscall.EINVAL
	}
	d, err := s.mgr.Create(stack.CreateOptions{Name: name, UUID: uuid, Minor: minor, NoTable: true})
	if err != nil {
		return err
	}
	p.clearFlags(FlagInactivePresent)
	s.status(d, p)
	return nil
}

func (s *Server) devRemove(_ context.Context, _ Caller, p param, _ uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	deferred := p.has(FlagDeferredRemove)
	if err := s.mgr.Remove(d.Name(), stack.Flags{Deferred: deferred}); err != nil {
		return err
	}
	if deferred && !s.gone(d) {
		return nil // flagged: it goes at its last close
	}
	p.clearFlags(FlagDeferredRemove)
	return nil
}

// gone reports whether d has left the manager.
func (s *Server) gone(d *stack.Device) bool { return s.mgr.Lookup(d.Name()) != d }

func (s *Server) devRename(_ context.Context, _ Caller, p param, inputSize uint32) error {
	uuid := p.has(FlagUUID)
	start := int(p.dataStart())
	end := int(inputSize)
	max := NameLen - 1
	if uuid {
		max = UUIDLen - 1
	}
	newName, ok := stringAt(p.b, start, end)
	if start < minDataSize || !ok || newName == "" || len(newName) > max {
		s.errf("Invalid new mapped device name or uuid string supplied.")
		return syscall.EINVAL
	}
	if !uuid {
		if err := s.checkName(newName); err != nil {
			return err
		}
	}
	name := p.name()
	kind := "name"
	if uuid {
		kind = "uuid"
	}
	if uuid && s.mgr.LookupUUID(newName) != nil || !uuid && s.mgr.Lookup(newName) != nil {
		s.errf("Unable to change %s on mapped device %s to one that already exists: %s", kind, name, newName)
		return syscall.EBUSY
	}
	d := s.mgr.Lookup(name)
	if d == nil {
		pfx := ""
		if uuid {
			pfx = "uuid "
		}
		s.errf("Unable to rename non-existent device, %s to %s%s", name, pfx, newName)
		return syscall.ENXIO
	}
	if uuid {
		if d.UUID() != "" {
			s.errf("Unable to change uuid of mapped device %s to %s because uuid is already set to %s", name, newName, d.UUID())
			return syscall.EINVAL
		}
		if err := s.mgr.SetUUID(name, newName); err != nil {
			return err
		}
	} else if err := s.mgr.Rename(name, newName); err != nil {
		return err
	}
	s.status(d, p)
	return nil
}

// stringAt returns the NUL-terminated string at b[start:], which must end
// before end (invalid_str).
func stringAt(b []byte, start, end int) (string, bool) {
	if start < 0 || start >= end || end > len(b) {
		return "", false
	}
	i := bytes.IndexByte(b[start:end], 0)
	if i < 0 {
		return "", false
	}
	return string(b[start : start+i]), true
}

func (s *Server) devSuspend(_ context.Context, _ Caller, p param, _ uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	f := stack.Flags{NoFlush: p.has(FlagNoFlush), NoLockFS: p.has(FlagSkipLockFS)}
	if p.has(FlagSuspend) {
		if !d.Suspended() {
			if err := s.mgr.Suspend(d.Name(), f); err != nil {
				return err
			}
		}
		s.status(d, p)
		return nil
	}
	p.clearFlags(FlagInactivePresent)
	if err := s.mgr.Resume(d.Name(), f); err != nil {
		return err
	}
	s.status(d, p)
	return nil
}

func (s *Server) devStatus(_ context.Context, _ Caller, p param, _ uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	s.status(d, p)
	return nil
}

func (s *Server) devWait(ctx context.Context, _ Caller, p param, inputSize uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	if _, err := d.WaitEvent(ctx, p.eventNr()); err != nil {
		return syscall.EINTR
	}
	s.status(d, p)
	s.retrieveStatus(d, p, inputSize)
	return nil
}

func (s *Server) devArmPoll(_ context.Context, c Caller, _ param, _ uint32) error {
	if c.File == nil {
		return syscall.EINVAL
	}
	c.File.armed.Store(s.mgr.GlobalEvent())
	return nil
}

// retrieveStatus is retrieve_status of the live table (the inactive one
// with DM_QUERY_INACTIVE_TABLE_FLAG): a dm_target_spec per target, each
// followed by its status text (TABLE with DM_STATUS_TABLE_FLAG, else INFO;
// with DM_NOFLUSH_FLAG a target that would commit first does not), next
// counting from the first spec.
func (s *Server) retrieveStatus(d *stack.Device, p param, inputSize uint32) {
	st := stack.StatusInfo
	switch {
	case p.has(FlagStatusTable):
		st = stack.StatusTable
	case p.has(FlagIMAMeasurement):
		st = -1
	case p.has(FlagNoFlush):
		st = stack.StatusInfoNoFlush
	}
	d.WithTables(func(live, inactive *stack.Table) {
		t := live
		if p.has(FlagQueryInactive) {
			t = inactive
		}
		if t == nil {
			return
		}
		var lines []stack.TargetLine
		if st >= 0 {
			lines = t.Lines(st)
		} else {
			// DM_IMA_MEASUREMENT_FLAG: dmfuse's targets have no IMA
			// measurement, as a kernel target whose status has no
			// STATUSTYPE_IMA case prints nothing.
			lines = t.Lines(stack.StatusTable)
			for i := range lines {
				lines[i].Params = ""
			}
		}
		start, room := resultBuffer(p, inputSize)
		out := p.b[start : start+room]
		at, used := 0, 0
		for _, l := range lines {
			if room-at <= specSize {
				p.orFlags(FlagBufferFull)
				break
			}
			spec := out[at : at+specSize]
			le.PutUint64(spec[specOffStart:], uint64(l.Start))
			le.PutUint64(spec[specOffLength:], uint64(l.Len))
			le.PutUint32(spec[specOffStatus:], 0)
			putCString(spec[specOffType:specOffType+MaxTypeName], l.Type)
			at += specSize
			remaining := room - at
			if len(l.Params)+1 >= remaining {
				// The target's text does not fit: it would be cut to
				// the room left, which fills it (l == remaining).
				if remaining > 0 {
					n := copy(out[at:at+remaining-1], l.Params)
					out[at+n] = 0
				}
				p.orFlags(FlagBufferFull)
				break
			}
			n := copy(out[at:], l.Params)
			out[at+n] = 0
			at += n + 1
			used = start + at
			at = align8(at)
			le.PutUint32(spec[specOffNext:], uint32(at))
		}
		if used > 0 {
			p.setDataSize(uint32(used))
		}
		p.setU32(offTargetCount, uint32(len(lines)))
	})
}

func (s *Server) tableLoad(_ context.Context, _ Caller, p param, inputSize uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	lines, err := s.populate(p, inputSize)
	if err != nil {
		return err
	}
	if err := s.mgr.LoadLines(d, lines, p.has(FlagReadOnly)); err != nil {
		s.tableError(d, err)
		if errors.Is(err, syscall.ENXIO) && s.gone(d) {
			s.errf("device has been removed from the dev hash table.")
		}
		return err
	}
	p.orFlags(FlagInactivePresent)
	s.status(d, p)
	return nil
}

// populate is populate_table: the target specs of the buffer, each found
// from the one before by its next (the first by data_start), aligned, inside
// the buffer and not overlapping what came before, with its parameters
// NUL-terminated.
func (s *Server) populate(p param, inputSize uint32) ([]stack.Line, error) {
	count := p.targetCount()
	if count == 0 {
		s.errf("populate_table: no targets specified")
		return nil, syscall.EINVAL
	}
	end := int(inputSize)
	spec := 0 // the buffer's start stands for the "spec" before the first
	next := int(p.dataStart())
	minSize := HeaderSize
	var lines []stack.Line
	for i := uint32(0); i < count; i++ {
		if next < minSize {
			what := "'struct dm_ioctl'"
			if i > 0 {
				what = "previous target"
			}
			s.errf("populate_table: next target spec (offset %d) overlaps %s", next, what)
			return nil, syscall.EINVAL
		}
		remaining := end - spec
		if remaining-specSize <= next {
			s.log("device-mapper: ioctl: Target spec extends beyond end of parameters")
			s.errf("unable to find target")
			return nil, syscall.EINVAL
		}
		if next%8 != 0 {
			s.errf("Next dm_target_spec (offset %d) is not 8-byte aligned", next)
			s.errf("unable to find target")
			return nil, syscall.EINVAL
		}
		spec += next
		params := spec + specSize
		nul := bytes.IndexByte(p.b[params:end], 0)
		if nul < 0 {
			s.errf("populate_table: target parameters not NUL-terminated")
			return nil, syscall.EINVAL
		}
		minSize = params + nul + 1 - spec
		b := p.b[spec:]
		lines = append(lines, stack.Line{
			N:      int(i) + 1,
			Start:  le.Uint64(b[specOffStart:]),
			Len:    le.Uint64(b[specOffLength:]),
			Type:   cstring(b[specOffType : specOffType+MaxTypeName]),
			Params: string(p.b[params : params+nul]),
		})
		next = int(le.Uint32(b[specOffNext:]))
	}
	return lines, nil
}

// tableError logs a table that did not build as dm_table_add_target and
// table_load do.
func (s *Server) tableError(d *stack.Device, err error) {
	var te *stack.TableError
	if errors.As(err, &te) && te.Target != "" {
		reason := te.Err.Error()
		var ae *stack.ArgError
		if errors.As(te.Err, &ae) {
			reason = ae.Reason
		}
		line := "device-mapper: table: " + d.DevNo() + ": " + te.Target + ": " + reason
		if reason != "unknown target type" {
			// dm_table_add_target's own check has no errno; a
			// constructor's failure is printed with one.
			line += " (" + errnoName(errnoOf(err)) + ")"
		}
		s.log(line)
		s.errf("error adding target to table")
		return
	}
	var de *stack.DeviceError
	if errors.As(err, &de) {
		err = de.Err
	}
	s.log("device-mapper: table: " + d.DevNo() + ": " + err.Error())
}

func (s *Server) tableClear(_ context.Context, _ Caller, p param, _ uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	if err := s.mgr.Clear(d.Name()); err != nil {
		return err
	}
	p.clearFlags(FlagInactivePresent)
	s.status(d, p)
	return nil
}

func (s *Server) tableDeps(_ context.Context, _ Caller, p param, inputSize uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	s.status(d, p)
	inactive := p.has(FlagQueryInactive)
	if inactive && d.Inactive() == nil || !inactive && d.Live() == nil {
		return nil
	}
	// The devices in the kernel's order. A regular file, which the kernel's
	// tables cannot name, has no number: it is left out.
	var devs []uint64
	for _, dep := range s.mgr.Deps(d, inactive) {
		switch {
		case dep.Mapped != nil:
			devs = append(devs, EncodeDev(dep.Mapped.Major(), dep.Mapped.Minor()))
		case dep.Block:
			devs = append(devs, EncodeDev(dep.Major, dep.Minor))
		}
	}
	start, room := resultBuffer(p, inputSize)
	needed := depsHeaderSize + 8*len(devs)
	if room < needed {
		p.orFlags(FlagBufferFull)
		return nil
	}
	out := p.b[start:]
	le.PutUint32(out, uint32(len(devs)))
	le.PutUint32(out[4:], 0)
	for i, v := range devs {
		le.PutUint64(out[depsHeaderSize+8*i:], v)
	}
	p.setDataSize(uint32(start + needed))
	return nil
}

func (s *Server) tableStatus(_ context.Context, _ Caller, p param, inputSize uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	s.status(d, p)
	s.retrieveStatus(d, p, inputSize)
	return nil
}

func (s *Server) listVersions(_ context.Context, _ Caller, p param, inputSize uint32) error {
	return s.versions(p, inputSize, s.mgr.Registry().Types())
}

func (s *Server) getTargetVersion(_ context.Context, _ Caller, p param, inputSize uint32) error {
	typ, ok := s.mgr.Registry().Lookup(p.name())
	if !ok {
		return syscall.EINVAL
	}
	return s.versions(p, inputSize, []*stack.TargetType{typ})
}

// versions is __list_versions: a dm_target_versions per type.
func (s *Server) versions(p param, inputSize uint32, types []*stack.TargetType) error {
	needed := 0
	for _, t := range types {
		needed += versionsHeader + len(t.Name) + 1 + 7
	}
	start, room := resultBuffer(p, inputSize)
	if room < needed {
		p.orFlags(FlagBufferFull)
		return nil
	}
	p.setDataSize(uint32(start + needed))
	out := p.b[start : start+needed]
	at, prev := 0, -1
	for _, t := range types {
		if prev >= 0 {
			le.PutUint32(out[prev:], uint32(at-prev))
		}
		le.PutUint32(out[at:], 0)
		for i, v := range t.Version {
			le.PutUint32(out[at+4+4*i:], uint32(v))
		}
		n := copy(out[at+versionsHeader:], t.Name)
		out[at+versionsHeader+n] = 0
		prev, at = at, align8(at+versionsHeader+n+1)
	}
	return nil
}

func (s *Server) targetMessage(ctx context.Context, _ Caller, p param, inputSize uint32) error {
	// The message lies where the caller's data_start says; the result goes
	// at the kernel's own data_start (get_result_buffer).
	dataStart := int(p.dataStart())
	_, room := resultBuffer(p, inputSize)
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	msg, ok := stringAt(p.b, dataStart+msgHeaderSize, int(inputSize))
	if dataStart < minDataSize || !ok {
		s.errf("Invalid target message parameters.")
		return syscall.EINVAL
	}
	sector := le.Uint64(p.b[dataStart:])
	args := stack.SplitArgs(msg)
	if len(args) == 0 {
		s.errf("Empty message received.")
		return syscall.EINVAL
	}
	out, err := s.mgr.Message(ctx, d.Name(), sector, args)
	if err != nil {
		s.messageError(args, err)
		return err
	}
	s.status(d, p)
	if out != "" {
		p.orFlags(FlagDataOut)
		if len(out)+1 > room {
			p.orFlags(FlagBufferFull)
		} else {
			at := align8(HeaderSize)
			n := copy(p.b[at:], out)
			p.b[at+n] = 0
			p.setDataSize(uint32(at + n + 1))
		}
	}
	return nil
}

// messageError logs a refused message as target_message and the targets
// do.
func (s *Server) messageError(args []string, err error) {
	switch {
	case errors.Is(err, stack.ErrNoMessages):
		s.errf("Target type does not support messages")
	case len(args[0]) > 0 && args[0][0] == '@':
		var ae *stack.ArgError
		if errors.As(err, &ae) && ae.Reason != "" {
			s.log("device-mapper: ioctl: " + ae.Reason)
		}
	}
}

func (s *Server) devSetGeometry(_ context.Context, _ Caller, p param, inputSize uint32) error {
	d := s.find(p)
	if d == nil {
		return syscall.ENXIO
	}
	geo, ok := stringAt(p.b, int(p.dataStart()), int(inputSize))
	if int(p.dataStart()) < minDataSize || !ok {
		s.errf("Invalid geometry supplied.")
		return syscall.EINVAL
	}
	var v [4]uint64
	sc := dmarg.NewScanner(geo)
	for i := range v {
		if i > 0 && !sc.Literal(' ') {
			s.errf("Unable to interpret geometry settings.")
			return syscall.EINVAL
		}
		n, ok := sc.Uint64()
		if !ok {
			s.errf("Unable to interpret geometry settings.")
			return syscall.EINVAL
		}
		v[i] = n
	}
	if !sc.Done() {
		s.errf("Unable to interpret geometry settings.")
		return syscall.EINVAL
	}
	if v[0] > 65535 || v[1] > 255 || v[2] > 255 {
		s.errf("Geometry exceeds range limits.")
		return syscall.EINVAL
	}
	// dm_set_geometry: the start must lie within the geometry's sectors.
	if v[3] > v[0]*v[1]*v[2] {
		s.log("device-mapper: Start sector is beyond the geometry limits.")
		return syscall.EINVAL
	}
	p.setDataSize(0)
	return nil
}

func itoa(n int) string {
	b := make([]byte, 0, 12)
	return string(appendInt(b, n))
}

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// errnoName is the kernel's %pe of -e: "-EINVAL".
func errnoName(e syscall.Errno) string {
	if n, ok := errnoNames[e]; ok {
		return "-" + n
	}
	return "-" + itoa(int(e))
}

var errnoNames = map[syscall.Errno]string{
	syscall.EPERM: "EPERM", syscall.ENOENT: "ENOENT", syscall.EIO: "EIO", syscall.ENXIO: "ENXIO",
	syscall.ENOMEM: "ENOMEM", syscall.EACCES: "EACCES", syscall.EBUSY: "EBUSY", syscall.EEXIST: "EEXIST",
	syscall.ENODEV: "ENODEV", syscall.EINVAL: "EINVAL", syscall.ENOSPC: "ENOSPC", syscall.EROFS: "EROFS",
	syscall.ERANGE: "ERANGE", syscall.ENODATA: "ENODATA", syscall.EOPNOTSUPP: "EOPNOTSUPP",
}
