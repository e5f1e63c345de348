package control

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
)

// op is one control operation: the request fields it takes and the handler
// that runs it.
type op struct {
	// fields lists the optional fields the operation accepts and whether it
	// needs a device name ("name": required, "name?": optional).
	fields string
	// run carries out a valid request and returns what it prints.
	run func(s *Server, ctx context.Context, r *Request) (string, error)
}

// ops is the control plane: every operation a request may name, each with
// one handler that calls one stack.Manager method. Request.Validate admits
// only these operations, with only their fields.
var ops = map[string]op{
	OpCreate: {"name uuid table dir notable readonly minor readahead", func(s *Server, _ context.Context, r *Request) (string, error) {
		minor := -1
		if r.Minor != nil {
			minor = int(*r.Minor)
		}
		d, err := s.mgr.Create(stack.CreateOptions{Name: r.Name, UUID: r.UUID, Minor: minor, ReadOnly: r.ReadOnly,
			Table: r.Table, NoTable: r.NoTable, Dir: r.Dir})
		if err == nil {
			r.setReadAhead(d)
		}
		return "", err
	}},
	OpLoad: {"name table dir", func(s *Server, _ context.Context, r *Request) (string, error) {
		return "", s.mgr.Load(r.Name, r.Table, r.Dir)
	}},
	OpClear: {"name", func(s *Server, _ context.Context, r *Request) (string, error) {
		return "", s.mgr.Clear(r.Name)
	}},
	OpSuspend: {"name noflush nolockfs", func(s *Server, _ context.Context, r *Request) (string, error) {
		return "", s.mgr.Suspend(r.Name, r.flags())
	}},
	OpResume: {"name noflush nolockfs readahead", func(s *Server, _ context.Context, r *Request) (string, error) {
		if err := s.mgr.Resume(r.Name, r.flags()); err != nil {
			return "", err
		}
		if d := s.mgr.Lookup(r.Name); d != nil {
			r.setReadAhead(d)
		}
		return "", nil
	}},
	OpRemove: {"name force deferred", func(s *Server, _ context.Context, r *Request) (string, error) {
		return "", s.mgr.Remove(r.Name, r.flags())
	}},
	OpRemoveAll: {"deferred", func(s *Server, _ context.Context, r *Request) (string, error) {
		s.mgr.RemoveAll(r.flags())
		return "", nil
	}},
	OpRename: {"name new_name uuid", func(s *Server, _ context.Context, r *Request) (string, error) {
		if r.UUID != "" {
			return "", s.mgr.SetUUID(r.Name, r.UUID)
		}
		return "", s.mgr.Rename(r.Name, r.NewName)
	}},
	OpMessage: {"name sector args", func(s *Server, ctx context.Context, r *Request) (string, error) {
		out, err := s.mgr.Message(ctx, r.Name, r.Sector, stack.SplitArgs(strings.Join(r.Args, " ")))
		if err != nil || out == "" || strings.HasSuffix(out, "\n") {
			return out, err
		}
		return out + "\n", nil
	}},
	OpWait: {"name event_nr", func(s *Server, ctx context.Context, r *Request) (string, error) {
		_, err := s.mgr.WaitEvent(ctx, r.Name, r.EventNr)
		return "", err
	}},
	OpTable:  {"name? inactive concise target", (*Server).runTable},
	OpStatus: {"name? inactive target noflush", (*Server).runTable},
	OpInfo:   {"name? inactive", (*Server).runInfo},
	OpList: {"", func(s *Server, _ context.Context, _ *Request) (string, error) {
		return formatList(s.mgr, s.mgr.Devices()), nil
	}},
	OpTargets: {"", (*Server).runTargets},
	OpDeps:    {"name? inactive format", (*Server).runDeps},
	OpStop: {"force", func(s *Server, _ context.Context, r *Request) (string, error) {
		if s.stop == nil {
			return "", errors.New("this daemon does not stop on request")
		}
		if err := s.stop(r.Force); err != nil {
			return "", err
		}
		s.StopAccepting()
		return "", nil
	}},
	OpSupervise: {"fd", func(s *Server, ctx context.Context, r *Request) (string, error) {
		pid, ok := ctx.Value(peerPIDKey{}).(int32)
		if s.supervise == nil || !ok {
			return "", &stack.ArgError{Reason: "this daemon does not serve dmfuse exec (only the system instance does)", Errno: syscall.EOPNOTSUPP}
		}
		return "", s.supervise(int(pid), int(*r.FD))
	}},
	OpAbout: {"", func(s *Server, _ context.Context, _ *Request) (string, error) {
		b, err := json.Marshal(About{Major: s.mgr.Major()})
		return string(b) + "\n", err
	}},
	OpReport: {"name? inactive", func(s *Server, _ context.Context, r *Request) (string, error) {
		devs, err := s.runReport(r)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(devs)
		return string(b) + "\n", err
	}},
}

// flags are the request's stack.Flags.
func (r *Request) flags() stack.Flags {
	return stack.Flags{NoFlush: r.NoFlush, NoLockFS: r.NoLockFS, Force: r.Force, Deferred: r.Deferred}
}

// runTable answers table and status: every line, the lines of one target
// type (--target), or with --concise one line of every device.
func (s *Server) runTable(_ context.Context, r *Request) (string, error) {
	if r.Concise {
		devs := s.mgr.Devices()
		if r.Name != "" {
			d := s.mgr.Lookup(r.Name)
			if d == nil {
				return "", stack.NoSuchDevice(r.Name)
			}
			devs = []*stack.Device{d}
		} else if len(devs) == 0 {
			return "No devices found\n", nil
		}
		return formatConcise(devs, r.Target), nil
	}
	st := stack.StatusTable
	if r.Op == OpStatus {
		st = stack.StatusInfo
		if r.NoFlush {
			st = stack.StatusInfoNoFlush
		}
	}
	if r.Target != "" {
		return s.each(r.Name, func(d *stack.Device, prefix string) string {
			return formatTargetLines(d, st, r.Inactive, r.Target, prefix)
		})
	}
	return s.each(r.Name, func(d *stack.Device, prefix string) string {
		return formatTable(d, st, r.Inactive, prefix)
	})
}

// runInfo answers info.
func (s *Server) runInfo(_ context.Context, r *Request) (string, error) {
	return s.each(r.Name, func(d *stack.Device, _ string) string {
		in := d.Info(r.Inactive)
		in.OpenCount = s.mgr.OpenCount(d)
		maj, min := s.mgr.DevNo(d)
		return formatInfo(in, maj, min)
	})
}

// runTargets answers targets: each type and its version.
func (s *Server) runTargets(context.Context, *Request) (string, error) {
	var b strings.Builder
	for _, t := range s.mgr.Registry().Types() {
		b.WriteString(t.FormatVersion())
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// runDeps answers deps.
func (s *Server) runDeps(_ context.Context, r *Request) (string, error) {
	reps, err := s.runReport(&Request{Name: r.Name, Inactive: r.Inactive})
	if err != nil {
		return "", err
	}
	if len(reps) == 0 {
		return "No devices found\n", nil
	}
	var b strings.Builder
	for _, rep := range reps {
		prefix := ""
		if r.Name == "" {
			prefix = rep.Name + ": "
		}
		b.WriteString(formatDeps(rep, r.Format, prefix))
	}
	return b.String(), nil
}
