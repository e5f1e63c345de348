package crash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Server shows states as files in a folder: each state a checker looks at
// is a regular file of the device's size (a loop device attaches to it,
// fsck opens it), served from its Overlay. A file's name is new for every
// state, so that no cached page of one state is read as another's.
type Server struct {
	dir string
	srv *fuse.Server

	mu    sync.Mutex
	files map[string]*Overlay
	next  atomic.Uint64
}

// Serve mounts a folder of states on dir (made if missing).
func Serve(dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{dir: dir, files: map[string]*Overlay{}}
	zero := time.Duration(0)
	srv, err := gofs.Mount(dir, &root{s: s}, &gofs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "dmfuse-crash", Name: "dmfuse", DirectMount: true, MaxWrite: 1 << 20},
	})
	if err != nil {
		return nil, fmt.Errorf("serving crash states on %s: %w", dir, err)
	}
	s.srv = srv
	return s, nil
}

// Add shows o as a file and returns its path.
func (s *Server) Add(o *Overlay) string {
	name := fmt.Sprintf("state-%d", s.next.Add(1))
	s.mu.Lock()
	s.files[name] = o
	s.mu.Unlock()
	return filepath.Join(s.dir, name)
}

// Remove takes the file at path away.
func (s *Server) Remove(path string) {
	s.mu.Lock()
	delete(s.files, filepath.Base(path))
	s.mu.Unlock()
}

// Close unmounts the folder.
func (s *Server) Close() error {
	err := s.srv.Unmount()
	if err != nil {
		syscall.Unmount(s.dir, syscall.MNT_DETACH)
	}
	return err
}

type root struct {
	gofs.Inode
	s *Server
}

var (
	_ gofs.NodeLookuper  = (*root)(nil)
	_ gofs.NodeReaddirer = (*root)(nil)
)

func (r *root) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	r.s.mu.Lock()
	o := r.s.files[name]
	r.s.mu.Unlock()
	if o == nil {
		return nil, syscall.ENOENT
	}
	f := &file{o: o}
	f.attr(&out.Attr)
	return r.NewInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

func (r *root) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	r.s.mu.Lock()
	var list []fuse.DirEntry
	for name := range r.s.files {
		list = append(list, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG})
	}
	r.s.mu.Unlock()
	return gofs.NewListDirStream(list), 0
}

// file is one state's device.
type file struct {
	gofs.Inode
	o *Overlay
}

var (
	_ gofs.NodeGetattrer = (*file)(nil)
	_ gofs.NodeSetattrer = (*file)(nil)
	_ gofs.NodeOpener    = (*file)(nil)
	_ gofs.NodeReader    = (*file)(nil)
	_ gofs.NodeWriter    = (*file)(nil)
	_ gofs.NodeFsyncer   = (*file)(nil)
)

func (f *file) attr(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o600
	a.Size = uint64(f.o.Size())
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = pageSize
}

func (f *file) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.attr(&out.Attr)
	return 0
}

// Setattr changes nothing: a state's device keeps its size (an O_TRUNC
// open leaves it whole, as it leaves a block device).
func (f *file) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.attr(&out.Attr)
	return 0
}

func (f *file) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (f *file) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := f.o.ReadAt(dest, off)
	if err != nil && n == 0 && off < f.o.Size() {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *file) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := f.o.WriteAt(data, off)
	if err != nil && n == 0 {
		return 0, syscall.ENOSPC
	}
	return uint32(n), 0
}

func (f *file) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno { return 0 }
