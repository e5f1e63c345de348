package fs

import (
	"sync"

	"github.com/dmfuse/dmfuse/internal/ioop"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dmfuse/dmfuse/fs/uring"
	"github.com/dmfuse/dmfuse/stack"
)

// ringFS is the file system the io_uring transport serves: go-fuse's
// bridge, and the uring.Direct capability, through which a READ of a device
// that maps whole onto a backing file through a linear target
// (stack.Device.FileRead says which) is issued on the file by the queue's own
// ring, with no system call of its own. The kernel names a device file by the node id
// go-fuse gave it, which go-fuse does not tell its nodes: ringFS learns it
// from the LOOKUP replies of device files (node ids are never reused) and
// forgets it with the node. A device file the kernel knows from a
// READDIRPLUS alone, never looked up, takes the usual path.
type ringFS struct {
	fuse.RawFileSystem
	root  *root
	nodes sync.Map // node id -> *devNode
}

var _ uring.Direct = (*ringFS)(nil)

func newRingFS(raw fuse.RawFileSystem, r *root) *ringFS {
	return &ringFS{RawFileSystem: raw, root: r}
}

// Lookup is go-fuse's, noting the node id of a device file.
func (f *ringFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := f.RawFileSystem.Lookup(cancel, h, name, out)
	if st.Ok() && h.NodeId == fuse.FUSE_ROOT_ID {
		if ch := f.root.GetChild(name); ch != nil && ch.StableAttr().Ino == out.Ino {
			if n, ok := ch.Operations().(*devNode); ok {
				f.nodes.Store(out.NodeId, n)
			}
		}
	}
	return st
}

// Forget is go-fuse's; the node id is not used again.
func (f *ringFS) Forget(nodeID, nlookup uint64) {
	f.nodes.Delete(nodeID)
	f.RawFileSystem.Forget(nodeID, nlookup)
}

// MapDirect implements uring.Direct.
func (f *ringFS) MapDirect(nodeID uint64, write bool, off int64, n int, io *uring.DirectIO) bool {
	v, ok := f.nodes.Load(nodeID)
	if !ok {
		return false
	}
	dn := v.(*devNode)
	k := ioop.Read
	if write {
		k = ioop.Write
	}
	d := dn.dev.FileRead(k, off, n)
	if d == nil {
		return false
	}
	f.root.requested()
	io.FD, io.Off, io.Tag = int32(d.FD), d.Off, d
	return true
}

// EndDirect implements uring.Direct.
func (f *ringFS) EndDirect(io *uring.DirectIO, p []byte, res int32) int32 {
	n, err := io.Tag.(*stack.FileRead).End(ioCtx, p, int(res))
	if err != nil {
		return -int32(errno(err))
	}
	return int32(n)
}
