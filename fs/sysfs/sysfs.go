// Package sysfs serves the part of sysfs that the programs `dmfuse exec`
// runs look at to find device-mapper devices, with the daemon's devices in
// it as the kernel's dm-mod would put them:
//
//	dev/block/   every entry of the host's /sys/dev/block (the same links),
//	             and MAJOR:MINOR -> .../devices/virtual/block/dm-MINOR for
//	             each device
//	block/       every entry of the host's /sys/block, and dm-MINOR -> the
//	             same folder
//	devices/virtual/block/dm-MINOR/
//	             dev, size, ro, removable, uevent, dm/{name,uuid,suspended,
//	             use_blk_mq}, holders/ and slaves/ (the devices stacked on it
//	             and under it), queue/ (its limits)
//
// `dmfuse exec` binds dev/block and block over /sys's in the command's
// mount namespace; the links of the host's entries are relative, so they
// still lead into the host's /sys/devices. libdevmapper reads dm/name and
// holders (dm_device_get_name, dm_device_has_holders), lvm dm/uuid and
// holders, cryptsetup the kernel name of a number (the link's last
// element) and dm/uuid. Nothing is cached: every lookup reads the devices
// afresh.
package sysfs

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dmfuse/dmfuse/stack"
)

// entry is one name in a folder of the tree: a folder (children), a link
// (target) or a file (content), writable if it has store.
type entry struct {
	children func() map[string]entry
	target   string
	content  func() string
	// store takes what is written to the file, as one write(2).
	store func(string) syscall.Errno
}

func dir(f func() map[string]entry) entry { return entry{children: f} }
func link(t string) entry                 { return entry{target: t} }
func file(f func() string) entry          { return entry{content: f} }

// Server is a mounted view.
type Server struct {
	srv *fuse.Server
	mnt string
}

// Mount serves the view of m's devices on mnt (a folder) until Unmount.
func Mount(mnt string, m *stack.Manager) (*Server, error) {
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	v := &view{mgr: m, mnt: mnt}
	root := newNode("", dir(v.root))
	zero := time.Duration(0)
	srv, err := gofs.Mount(mnt, root, &gofs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "dmfuse-sys", Name: "dmfuse", AllowOther: true, DirectMount: true},
	})
	if err != nil {
		return nil, err
	}
	return &Server{srv: srv, mnt: mnt}, nil
}

// Unmount unmounts the view and waits for its server to end. Mount
// namespaces that still see the view (a command of dmfuse exec's that is
// still exiting) keep its connection alive: after a second it is aborted
// through the fuse control file system, and where that is not mounted (or
// the abort does not end it either) Unmount stops waiting after two more
// seconds and says so. The daemon exits next, and its exit closes the
// connection's /dev/fuse descriptor, which ends the connection.
func (s *Server) Unmount() error {
	var st syscall.Stat_t
	syscall.Stat(s.mnt, &st)
	// go-fuse's Unmount itself waits for the connection to end.
	var err error
	done := make(chan struct{})
	go func() {
		if err = s.srv.Unmount(); err != nil {
			syscall.Unmount(s.mnt, syscall.MNT_DETACH)
		}
		s.srv.Wait()
		close(done)
	}()
	select {
	case <-done:
		return err
	case <-time.After(time.Second):
	}
	// The connection's number is the mount's device minor.
	os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", st.Dev&0xff|(st.Dev>>12)&0xfff00), []byte("1"), 0)
	select {
	case <-done:
		return err
	case <-time.After(2 * time.Second):
		return fmt.Errorf("the sysfs view at %s is still mounted in a mount namespace; its connection ends when this process exits", s.mnt)
	}
}

// view builds the tree from the manager's devices.
type view struct {
	mgr *stack.Manager
	mnt string
}

func (v *view) root() map[string]entry {
	return map[string]entry{
		"dev":     dir(func() map[string]entry { return map[string]entry{"block": dir(v.devBlock)} }),
		"block":   dir(v.block),
		"devices": dir(func() map[string]entry { return map[string]entry{"virtual": dir(v.virtual)} }),
	}
}

func (v *view) virtual() map[string]entry {
	return map[string]entry{"block": dir(v.virtualBlock)}
}

// dmDir is the absolute path of device d's folder, where the links lead.
func (v *view) dmDir(d *stack.Device) string {
	return filepath.Join(v.mnt, "devices/virtual/block", kname(d))
}

func kname(d *stack.Device) string { return fmt.Sprintf("dm-%d", d.Minor()) }

// host returns the links of a folder of the host's sysfs.
func host(dir string) map[string]entry {
	out := map[string]entry{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out[e.Name()] = link(t)
		}
	}
	return out
}

func (v *view) devBlock() map[string]entry {
	out := host("/sys/dev/block")
	for _, d := range v.mgr.Devices() {
		out[d.DevNo()] = link(v.dmDir(d))
	}
	return out
}

func (v *view) block() map[string]entry {
	out := host("/sys/block")
	for _, d := range v.mgr.Devices() {
		out[kname(d)] = link(v.dmDir(d))
	}
	return out
}

func (v *view) virtualBlock() map[string]entry {
	out := map[string]entry{}
	for _, d := range v.mgr.Devices() {
		out[kname(d)] = dir(func() map[string]entry { return v.device(d) })
	}
	return out
}

func text(s string) entry { return file(func() string { return s + "\n" }) }

// device is the folder of d.
func (v *view) device(d *stack.Device) map[string]entry {
	in := d.Info(false)
	ro, suspended := "0", "0"
	if in.ReadOnly {
		ro = "1"
	}
	if in.Suspended {
		suspended = "1"
	}
	// The loop device a device is exported as has 512-byte blocks.
	discardGran, discardMax := "0", "0"
	if t := d.Live(); t != nil && t.Limits().Discard {
		discardGran, discardMax = "512", "4294966784"
	}
	out := map[string]entry{
		"dev":       text(d.DevNo()),
		"size":      text(fmt.Sprint(in.Sectors)),
		"ro":        text(ro),
		"removable": text("0"),
		"range":     text("1"),
		"uevent":    text(fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=%s\nDEVTYPE=disk", d.Major(), d.Minor(), kname(d))),
		"dm": dir(func() map[string]entry {
			return map[string]entry{
				"name":       text(d.Name()),
				"uuid":       text(d.UUID()),
				"suspended":  text(suspended),
				"use_blk_mq": text("0"),
			}
		}),
		// libdevmapper reads and sets the read-ahead here.
		"bdi":     dir(func() map[string]entry { return map[string]entry{"read_ahead_kb": readAheadKB(d)} }),
		"holders": dir(func() map[string]entry { return v.holders(d) }),
		"slaves":  dir(func() map[string]entry { return v.slaves(d) }),
		"queue": dir(func() map[string]entry {
			return map[string]entry{
				"logical_block_size":  text("512"),
				"physical_block_size": text("512"),
				"hw_sector_size":      text("512"),
				"minimum_io_size":     text("512"),
				"optimal_io_size":     text("0"),
				"rotational":          text("0"),
				"read_ahead_kb":       readAheadKB(d),
				"max_sectors_kb":      text("1280"),
				"discard_granularity": text(discardGran),
				"discard_max_bytes":   text(discardMax),
			}
		}),
	}
	return out
}

// readAheadKB is the read-ahead file of d, in KiB, as
// block/blk-sysfs.c's queue_ra_store takes it: a decimal number, rounded
// down to whole pages.
func readAheadKB(d *stack.Device) entry {
	return entry{
		content: func() string { return fmt.Sprintf("%d\n", d.ReadAhead()/2) },
		store: func(s string) syscall.Errno {
			kb, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
			if err != nil || kb > math.MaxUint32/2 {
				return syscall.EINVAL
			}
			d.SetReadAhead(uint32(kb*2), false)
			return 0
		},
	}
}

// holders are the devices whose tables use d.
func (v *view) holders(d *stack.Device) map[string]entry {
	out := map[string]entry{}
	for _, o := range v.mgr.Devices() {
		for _, dep := range v.mgr.Deps(o, false) {
			if dep.Mapped == d {
				out[kname(o)] = link(v.dmDir(o))
			}
		}
	}
	return out
}

// slaves are the devices d's table uses: other devices of the daemon, and
// block devices, as links into the host's sysfs.
func (v *view) slaves(d *stack.Device) map[string]entry {
	out := map[string]entry{}
	for _, dep := range v.mgr.Deps(d, false) {
		switch {
		case dep.Mapped != nil:
			out[kname(dep.Mapped)] = link(v.dmDir(dep.Mapped))
		case dep.Block:
			if t, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/dev/block/%d:%d", dep.Major, dep.Minor)); err == nil {
				out[filepath.Base(t)] = link(t)
			}
		}
	}
	return out
}

// node is one inode of the tree.
type node struct {
	gofs.Inode
	path string
	// e is what the name stands for, as the last lookup found it: the
	// kernel keeps an inode while the name stays (the same path, the same
	// inode number), and a device removed and created again under the same
	// minor must not be answered from the old one's entry.
	e atomic.Pointer[entry]
}

func newNode(path string, e entry) *node {
	n := &node{path: path}
	n.e.Store(&e)
	return n
}

var (
	_ gofs.NodeLookuper   = (*node)(nil)
	_ gofs.NodeReaddirer  = (*node)(nil)
	_ gofs.NodeGetattrer  = (*node)(nil)
	_ gofs.NodeReadlinker = (*node)(nil)
	_ gofs.NodeOpener     = (*node)(nil)
	_ gofs.NodeReader     = (*node)(nil)
	_ gofs.NodeWriter     = (*node)(nil)
	_ gofs.NodeSetattrer  = (*node)(nil)
)

func (e entry) mode() uint32 {
	switch {
	case e.children != nil:
		return syscall.S_IFDIR | 0o755
	case e.target != "":
		return syscall.S_IFLNK | 0o777
	case e.store != nil:
		return syscall.S_IFREG | 0o644
	}
	return syscall.S_IFREG | 0o444
}

func ino(path string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(path))
	return h.Sum64() | 1<<63
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ne := n.e.Load()
	if ne.children == nil {
		return nil, syscall.ENOTDIR
	}
	e, ok := ne.children()[name]
	if !ok {
		return nil, syscall.ENOENT
	}
	p := n.path + "/" + name
	fill(&out.Attr, e)
	// The kernel's inode for the path, if it still has one, is the node
	// that answers for the name from now on: it takes the new entry.
	if old := n.GetChild(name); old != nil {
		if on, ok := old.Operations().(*node); ok && on.path == p {
			on.e.Store(&e)
		}
	}
	return n.NewInode(ctx, newNode(p, e), gofs.StableAttr{Mode: e.mode() & syscall.S_IFMT, Ino: ino(p)}), 0
}

func (n *node) Readdir(context.Context) (gofs.DirStream, syscall.Errno) {
	ne := n.e.Load()
	if ne.children == nil {
		return nil, syscall.ENOTDIR
	}
	kids := ne.children()
	names := make([]string, 0, len(kids))
	for name := range kids {
		names = append(names, name)
	}
	sort.Strings(names)
	ents := make([]fuse.DirEntry, len(names))
	for i, name := range names {
		ents[i] = fuse.DirEntry{Name: name, Mode: kids[name].mode() & syscall.S_IFMT, Ino: ino(n.path + "/" + name)}
	}
	return gofs.NewListDirStream(ents), 0
}

func fill(a *fuse.Attr, e entry) {
	a.Mode = e.mode()
	a.Nlink = 1
	if e.children != nil {
		a.Nlink = 2
	}
	switch {
	case e.target != "":
		a.Size = uint64(len(e.target))
	case e.content != nil:
		a.Size = 4096 // as sysfs: the length shows only when read
	}
}

func (n *node) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fill(&out.Attr, *n.e.Load())
	return 0
}

func (n *node) Readlink(context.Context) ([]byte, syscall.Errno) {
	e := n.e.Load()
	if e.target == "" {
		return nil, syscall.EINVAL
	}
	return []byte(e.target), 0
}

func (n *node) Open(_ context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	e := n.e.Load()
	if e.content == nil {
		return nil, 0, syscall.EISDIR
	}
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && e.store == nil {
		return nil, 0, syscall.EACCES
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

// Write stores what a write(2) at the start of a writable file carries.
func (n *node) Write(_ context.Context, _ gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	store := n.e.Load().store
	if store == nil {
		return 0, syscall.EACCES
	}
	if off != 0 {
		return 0, syscall.EINVAL
	}
	if e := store(string(data)); e != 0 {
		return 0, e
	}
	return uint32(len(data)), 0
}

// Setattr takes the truncation of an open with O_TRUNC (as sysfs ignores
// it) and refuses everything else.
func (n *node) Setattr(_ context.Context, _ gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	e := n.e.Load()
	if in.Valid&^(fuse.FATTR_SIZE|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) != 0 || e.store == nil {
		return syscall.EPERM
	}
	fill(&out.Attr, *e)
	return 0
}

func (n *node) Read(_ context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	s := n.e.Load().content()
	if off >= int64(len(s)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData([]byte(s[off:min(int64(len(s)), off+int64(len(dest)))])), 0
}
