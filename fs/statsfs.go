package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stats"
)

// statsDir is MOUNTPOINT/stats: diskstats and one folder per device.
type statsDir struct {
	gofs.Inode
	mgr *stack.Manager
}

var (
	_ gofs.NodeLookuper  = (*statsDir)(nil)
	_ gofs.NodeReaddirer = (*statsDir)(nil)
	_ gofs.NodeGetattrer = (*statsDir)(nil)
)

// dirAttr fills the attributes of a synthetic folder.
func dirAttr(out *fuse.AttrOut, mode uint32) {
	out.Mode = syscall.S_IFDIR | mode
	out.Nlink = 2
	out.SetTimes(&startTime, &startTime, &startTime)
}

func (s *statsDir) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	dirAttr(out, 0o755)
	return 0
}

func (s *statsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if name == "diskstats" {
		out.Mode = syscall.S_IFREG | 0o444
		return s.NewInode(ctx, &textFile{render: s.diskstats}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: inoDiskstats}), 0
	}
	d := s.mgr.Lookup(name)
	if d == nil || d.Live() == nil {
		return nil, syscall.ENOENT
	}
	out.Mode = syscall.S_IFDIR | 0o555
	return s.NewInode(ctx, &devStatsDir{dev: d}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: 4*d.Ino() + 1}), 0
}

func (s *statsDir) Readdir(context.Context) (gofs.DirStream, syscall.Errno) {
	ents := []fuse.DirEntry{{Name: "diskstats", Mode: syscall.S_IFREG, Ino: inoDiskstats}}
	for _, d := range s.mgr.Devices() {
		if d.Live() != nil {
			ents = append(ents, fuse.DirEntry{Name: d.Name(), Mode: syscall.S_IFDIR, Ino: 4*d.Ino() + 1})
		}
	}
	return gofs.NewListDirStream(ents), 0
}

// diskstats renders one line per device with a live table, sorted by name.
func (s *statsDir) diskstats(b []byte) []byte {
	for _, d := range s.mgr.Devices() {
		if d.Live() == nil {
			continue
		}
		snap := d.Disk().Snapshot()
		b = stats.AppendDiskstats(b, d.Major(), d.Minor(), d.Name(), &snap)
	}
	return b
}

// devStatsDir is MOUNTPOINT/stats/NAME.
type devStatsDir struct {
	gofs.Inode
	dev *stack.Device
}

var (
	_ gofs.NodeLookuper  = (*devStatsDir)(nil)
	_ gofs.NodeReaddirer = (*devStatsDir)(nil)
	_ gofs.NodeGetattrer = (*devStatsDir)(nil)
)

func (s *devStatsDir) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	dirAttr(out, 0o555)
	return 0
}

func (s *devStatsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var render func([]byte) []byte
	var ino uint64
	switch name {
	case "stat":
		render, ino = func(b []byte) []byte {
			snap := s.dev.Disk().Snapshot()
			return stats.AppendStat(b, &snap)
		}, 4*s.dev.Ino()+2
	case "inflight":
		render, ino = func(b []byte) []byte {
			snap := s.dev.Disk().Snapshot()
			return stats.AppendInflight(b, &snap)
		}, 4*s.dev.Ino()+3
	case "events":
		if !hasEvents(s.dev.Live()) {
			return nil, syscall.ENOENT
		}
		render, ino = func(b []byte) []byte { return appendEvents(b, s.dev.Live()) }, inoEvents(s.dev)
	default:
		return nil, syscall.ENOENT
	}
	out.Mode = syscall.S_IFREG | 0o444
	return s.NewInode(ctx, &textFile{render: render}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: ino}), 0
}

func (s *devStatsDir) Readdir(context.Context) (gofs.DirStream, syscall.Errno) {
	ents := []fuse.DirEntry{
		{Name: "inflight", Mode: syscall.S_IFREG, Ino: 4*s.dev.Ino() + 3},
		{Name: "stat", Mode: syscall.S_IFREG, Ino: 4*s.dev.Ino() + 2},
	}
	if hasEvents(s.dev.Live()) {
		ents = append([]fuse.DirEntry{{Name: "events", Mode: syscall.S_IFREG, Ino: inoEvents(s.dev)}}, ents...)
	}
	return gofs.NewListDirStream(ents), 0
}

// inoEvents is the inode of MOUNTPOINT/stats/NAME/events, above the four a
// device's other files take.
func inoEvents(d *stack.Device) uint64 { return 1<<62 | d.Ino() }

// hasEvents tells whether a target of t keeps an event log.
func hasEvents(t *stack.Table) bool {
	found := false
	if t != nil {
		t.Targets(func(_, _ int64, _ *stack.TargetType, tg stack.Target) {
			_, ok := tg.(stack.EventLogger)
			found = found || ok
		})
	}
	return found
}

// appendEvents appends the event logs of t's targets, in table order (the
// table read when the file is opened: a reload shows the new targets' logs).
func appendEvents(b []byte, t *stack.Table) []byte {
	if t != nil {
		t.Targets(func(_, _ int64, _ *stack.TargetType, tg stack.Target) {
			if l, ok := tg.(stack.EventLogger); ok {
				b = l.AppendEvents(b)
			}
		})
	}
	return b
}

// textFile is a synthetic file whose content is rendered at open: every open
// sees one consistent snapshot, and reads at any offset come from it. Its
// st_size is 0, so it is opened with FOPEN_DIRECT_IO.
type textFile struct {
	gofs.Inode
	render func([]byte) []byte
}

var (
	_ gofs.NodeOpener    = (*textFile)(nil)
	_ gofs.NodeReader    = (*textFile)(nil)
	_ gofs.NodeGetattrer = (*textFile)(nil)
)

type snapshot struct{ data []byte }

func (t *textFile) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	out.SetTimes(&startTime, &startTime, &startTime)
	return 0
}

func (t *textFile) Open(_ context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	return &snapshot{data: t.render(nil)}, fuse.FOPEN_DIRECT_IO, 0
}

func (t *textFile) Read(_ context.Context, f gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	s, ok := f.(*snapshot)
	if !ok {
		return nil, syscall.EBADF
	}
	if off >= int64(len(s.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(s.data[off:min(int64(len(s.data)), off+int64(len(dest)))]), 0
}
