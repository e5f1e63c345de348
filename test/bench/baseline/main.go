// Command baseline is the FUSE floor that dmfuse is measured against: the
// smallest go-fuse server that serves one file, FILE inside MOUNTPOINT, with
// pread and pwrite on a backing file, mounted and opened with exactly the
// options of dmfuse's device files (mount options, open flags, cache
// timeouts). It unmounts on SIGINT or SIGTERM.
//
//	baseline BACKING MOUNTPOINT
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	dmfs "github.com/dmfuse/dmfuse/fs"
)

type root struct {
	gofs.Inode
	fd   int
	size int64
}

type file struct {
	gofs.Inode
	r *root
}

func (r *root) OnAdd(ctx context.Context) {
	f := r.NewPersistentInode(ctx, &file{r: r}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
	r.AddChild("file", f, false)
}

func (f *file) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size, out.Nlink = syscall.S_IFREG|0o660, uint64(f.r.size), 1
	return 0
}

func (f *file) Open(context.Context, uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, dmfs.DeviceOpenFlags, 0
}

func (f *file) Read(_ context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := syscall.Pread(f.r.fd, dest, off)
	if err != nil {
		return nil, gofs.ToErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *file) Write(_ context.Context, _ gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := syscall.Pwrite(f.r.fd, data, off)
	if err != nil {
		return 0, gofs.ToErrno(err)
	}
	return uint32(n), 0
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: baseline BACKING MOUNTPOINT")
		os.Exit(2)
	}
	fd, err := syscall.Open(os.Args[1], syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err == nil {
		var st syscall.Stat_t
		if err = syscall.Fstat(fd, &st); err == nil {
			mo := dmfs.MountOptions(dmfs.Options{})
			mo.FsName, mo.Name = "baseline", "baseline"
			var srv *fuse.Server
			t := dmfs.CacheTimeout
			srv, err = gofs.Mount(os.Args[2], &root{fd: fd, size: st.Size},
				&gofs.Options{MountOptions: mo, EntryTimeout: &t, AttrTimeout: &t})
			if err == nil {
				sigs := make(chan os.Signal, 1)
				signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
				go func() { <-sigs; srv.Unmount() }()
				srv.Wait()
				return
			}
		}
	}
	fmt.Fprintln(os.Stderr, "baseline:", err)
	os.Exit(1)
}
