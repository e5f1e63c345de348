// Package fs presents the mapped devices of a stack.Manager as a FUSE file
// system: one regular file per device with a live table, and a stats/ folder
// with the kernel's diskstats, stat and inflight formats.
//
//	MOUNTPOINT/
//	  NAME                 one regular file per device; size = table length x 512
//	  stats/diskstats      one line per device, /proc/diskstats format
//	  stats/NAME/stat      /sys/block/NAME/stat format
//	  stats/NAME/inflight  /sys/block/NAME/inflight format
//	  stats/NAME/events    the event log of a target that keeps one (fault)
//
// The package is a thin adapter: it decodes a request, calls the device and
// turns the error into an errno once. Device files are opened with
// FOPEN_DIRECT_IO (the page cache would hide injected errors and delays) and
// FOPEN_PARALLEL_DIRECT_WRITES (without it the kernel serialises direct
// writes per inode); the mount negotiates CAP_ASYNC_DIO so that libaio,
// io_uring and loop devices keep their queue depth.
//
// # Memory
//
// A request holds one buffer as large as the largest request the kernel may
// send, from the moment it is read until it is answered: the kernel wants
// room for the largest WRITE in every read(2) of /dev/fuse, so go-fuse reads
// each request into a MaxWrite-sized buffer, and a READ's reply is as large
// as the read. The memory held for requests is therefore the number in
// flight times MaxWrite, and Mount bounds both from Options.MemoryLimit
// (PlanMemory; `dmfuse mount --memory-limit`, else GOMEMLIMIT, else 64 MiB):
// half of the limit goes to request buffers; MaxWrite is 256 KiB, smaller
// (down to 64 KiB) if fewer than 64 such requests fit, larger (up to 1 MiB)
// if more than 256 do; MaxBackground (the kernel's cap on asynchronous
// requests) is as many as fit, at most 256; go-fuse's
// MaxInflightRequestBytes holds synchronous writers to the same bound.
// Requests beyond it wait in the kernel: I/O slows, it does not fail. The
// 64 MiB default gives 256 KiB requests, 117 in flight (on 2 CPUs) and at
// most 32 MiB of request buffers; larger I/O is split into 256 KiB
// requests. The io_uring transport's registered entries (one queue per CPU,
// URingDepth entries of MaxWrite bytes) are sized from the same half (see
// MemoryPlan). Once the devices have been idle for Options.ReleaseAfter, the
// server returns the buffers go-fuse pooled to the operating system.
package fs

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/dmfuse/dmfuse/fs/uring"
	"github.com/dmfuse/dmfuse/stack"
)

// Options tune the mount.
type Options struct {
	// AllowOther lets users other than the mounting one use the files.
	AllowOther bool
	// Debug logs every FUSE request.
	Debug bool
	// MaxBackground caps the kernel's in-flight asynchronous requests; it
	// bounds the queue depth a device can be driven at (0: what
	// PlanMemory makes of MemoryLimit, 256 when memory allows).
	MaxBackground int
	// MemoryLimit is the memory the daemon is meant to stay under, in
	// bytes: half of it bounds the request buffers (see PlanMemory and
	// MemoryPlan). 0 means DefaultMemoryLimit, a negative value no
	// limit (1 MiB requests, 256 in flight). Mount does not set the Go
	// runtime's own limit; the caller does (debug.SetMemoryLimit).
	MemoryLimit int64
	// ReleaseAfter is how long the devices must have been idle before the
	// server returns its request buffers to the operating system (0:
	// never; the Go runtime then keeps them for minutes).
	ReleaseAfter time.Duration

	// Transport is how requests reach the daemon: TransportAuto (the
	// default, also for ""), TransportURing or TransportDev. See
	// transport.go.
	Transport string
	// EnableURing switches the fuse module's enable_uring parameter on
	// before mounting (root only).
	EnableURing bool
	// URingDepth is the number of io_uring entries per queue (0: default).
	URingDepth int
	// Poll is how each io_uring queue's thread waits for its next
	// request: 0 polls adaptively (up to uring.DefaultPollWindow when the
	// queue runs dry while the daemon's requests come in quick succession
	// and the CPU is not contended), PollOff never polls, a positive value
	// polls up to that long every time the CPU is not contended.
	Poll time.Duration
	// Interruptible lets a signal end I/O that the devices hold (a
	// suspended device, a delay, multipath queueing without a path) with
	// EINTR, on either transport: the kernel sends FUSE_INTERRUPT for a
	// request whose caller has a signal pending. Without it (the default)
	// held I/O waits through signals, as on a dm device. I/O that has
	// reached the backing store is never cut short.
	Interruptible bool
	// Logf receives the transport's log lines (nil: standard error).
	Logf func(format string, args ...any)
}

// PollOff as Options.Poll: io_uring queues never spin.
const PollOff = uring.PollOff

// Inode numbers of the fixed nodes; device nodes use 4*dev.Ino() + k.
const (
	inoStats     = 2
	inoDiskstats = 3
)

// ttl is how long the kernel may cache entries and attributes; changes of a
// device's size or name are pushed to the kernel explicitly.
const ttl = time.Second

// CacheTimeout is how long the kernel may cache the entries and attributes
// of device files (the entry and attribute timeouts Mount sets).
const CacheTimeout = ttl

// DeviceOpenFlags are the FUSE open reply flags of device files: no page
// cache (it would hide injected errors and delays), and direct writes in
// parallel (without FOPEN_PARALLEL_DIRECT_WRITES the kernel serialises them
// per inode).
const DeviceOpenFlags = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PARALLEL_DIRECT_WRITES

// MountOptions returns the go-fuse mount options Mount uses for o. They are
// exported so that a benchmark baseline can mount with exactly the same ones.
// MaxWrite, MaxBackground and MaxInflightRequestBytes come from
// PlanMemory(o).
func MountOptions(o Options) fuse.MountOptions {
	p := PlanMemory(o)
	mo := fuse.MountOptions{
		AllowOther:              o.AllowOther,
		FsName:                  "dmfuse",
		Name:                    "dmfuse",
		Debug:                   o.Debug,
		MaxBackground:           p.MaxBackground,
		MaxWrite:                p.MaxWrite,
		MaxInflightRequestBytes: p.InflightBytes,
		DisableXAttrs:           true,
		// Device reads are answered from memory, never from a file
		// descriptor: splicing buys nothing, and a 1 MiB read does not
		// fit a default-sized pipe.
		DisableSplice:     true,
		ExtraCapabilities: fuse.CAP_ASYNC_DIO | fuse.CAP_ATOMIC_O_TRUNC,
	}
	if os.Geteuid() == 0 {
		mo.DirectMountStrict = true
	} else {
		mo.DirectMount = true
	}
	return mo
}

// Mount mounts the devices of m on dir and returns the running server. The
// caller waits with server.Wait and unmounts with server.Unmount.
func Mount(dir string, m *stack.Manager, o Options) (*Server, error) {
	r := &root{mgr: m, interruptible: o.Interruptible}
	t := ttl
	opts := &gofs.Options{
		EntryTimeout: &t,
		AttrTimeout:  &t,
		MountOptions: MountOptions(o),
	}
	m.Subscribe(stack.Listener{OnChange: r.changed, OnRemove: r.forget})
	plan := PlanMemory(o)
	if o.URingDepth <= 0 {
		o.URingDepth = plan.URingDepth
	}
	s, err := mountTransport(dir, r, opts, o)
	if err != nil {
		return nil, err
	}
	if s.ring != nil {
		r.ring.Store(s.ring)
	}
	s.plan = plan
	if o.ReleaseAfter > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		rel := newReleaser(m, o.ReleaseAfter, &s.releases)
		r.rel.Store(rel)
		go rel.run(ctx)
		go func() { s.Wait(); cancel() }()
	}
	return s, nil
}

// root is the mount's top folder.
type root struct {
	gofs.Inode
	mgr  *stack.Manager
	ring atomic.Pointer[uring.Server] // the io_uring transport, once it serves
	rel  atomic.Pointer[releaser]     // gives memory back after I/O (Options.ReleaseAfter)

	interruptible bool // Options.Interruptible
}

var (
	_ gofs.NodeLookuper  = (*root)(nil)
	_ gofs.NodeReaddirer = (*root)(nil)
	_ gofs.NodeGetattrer = (*root)(nil)
)

func (r *root) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	return 0
}

// visible returns the device named name if it has a live table.
func (r *root) visible(name string) *stack.Device {
	d := r.mgr.Lookup(name)
	if d == nil || d.Live() == nil {
		return nil
	}
	return d
}

func (r *root) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if name == "stats" {
		out.Mode = syscall.S_IFDIR | 0o755
		return r.NewInode(ctx, &statsDir{mgr: r.mgr}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: inoStats}), 0
	}
	d := r.visible(name)
	if d == nil {
		return nil, syscall.ENOENT
	}
	n := &devNode{dev: d, root: r}
	n.fill(&out.Attr)
	return r.NewInode(ctx, n, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: 4 * d.Ino()}), 0
}

// requested tells the releaser, if any, that a device request came.
func (r *root) requested() {
	if rel := r.rel.Load(); rel != nil {
		rel.request()
	}
}

func (r *root) Readdir(context.Context) (gofs.DirStream, syscall.Errno) {
	ents := []fuse.DirEntry{{Name: "stats", Mode: syscall.S_IFDIR, Ino: inoStats}}
	for _, d := range r.mgr.Devices() {
		if d.Live() != nil {
			ents = append(ents, fuse.DirEntry{Name: d.Name(), Mode: syscall.S_IFREG, Ino: 4 * d.Ino()})
		}
	}
	return gofs.NewListDirStream(ents), 0
}

// forget drops the kernel's cached entries of a removed device.
func (r *root) forget(d *stack.Device) {
	name := d.Name()
	r.NotifyEntry(name)
	if s := r.GetChild("stats"); s != nil {
		s.NotifyEntry(name)
	}
}

// changed pushes a device's new size (a new live table) to the kernel.
func (r *root) changed(d *stack.Device) {
	if c := r.GetChild(d.Name()); c != nil {
		c.NotifyContent(0, 0)
	}
	r.NotifyEntry(d.Name())
}

// devNode is the file of one mapped device.
type devNode struct {
	gofs.Inode
	dev  *stack.Device
	root *root
}

var (
	_ gofs.NodeOpener    = (*devNode)(nil)
	_ gofs.NodeReader    = (*devNode)(nil)
	_ gofs.NodeWriter    = (*devNode)(nil)
	_ gofs.NodeFsyncer   = (*devNode)(nil)
	_ gofs.NodeFlusher   = (*devNode)(nil)
	_ gofs.NodeReleaser  = (*devNode)(nil)
	_ gofs.NodeAllocater = (*devNode)(nil)
	_ gofs.NodeGetattrer = (*devNode)(nil)
	_ gofs.NodeSetattrer = (*devNode)(nil)
)

var startTime = time.Now()

func (n *devNode) fill(a *fuse.Attr) {
	size := n.dev.Size()
	a.Mode = syscall.S_IFREG | 0o660
	if n.dev.ReadOnly() {
		a.Mode = syscall.S_IFREG | 0o440
	}
	a.Size = uint64(size)
	a.Blocks = uint64(size+511) / 512
	a.Blksize = 4096
	a.Nlink = 1
	a.SetTimes(&startTime, &startTime, &startTime)
}

func (n *devNode) Getattr(_ context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	return 0
}

// Setattr refuses size changes: the size is fixed by the live table. Other
// attribute changes are accepted and ignored.
func (n *devNode) Setattr(_ context.Context, _ gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != n.dev.Size() {
		return syscall.EPERM
	}
	n.fill(&out.Attr)
	return 0
}

// handle marks an open of a device file, counted in the device's open count.
type handle struct{}

func (n *devNode) Open(_ context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY && n.dev.ReadOnly() {
		return nil, 0, syscall.EROFS
	}
	if n.dev.Live() == nil {
		return nil, 0, syscall.ENXIO
	}
	n.dev.AddOpen(1)
	return &handle{}, DeviceOpenFlags, 0
}

func (n *devNode) Release(_ context.Context, f gofs.FileHandle) syscall.Errno {
	if _, ok := f.(*handle); ok {
		n.dev.AddOpen(-1)
	}
	return 0
}

// Read reads into go-fuse's request buffer and answers with it: the data
// reaches the kernel with one writev and no copy in user space.
func (n *devNode) Read(ctx context.Context, _ gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	k, err := n.dev.ReadAt(n.ioContext(ctx), dest, off)
	if err != nil {
		return nil, errno(err)
	}
	r := readResults.Get().(*readResult)
	r.data = dest[:k]
	return r, 0
}

// readResult is fuse.ReadResultData without its allocation per read: go-fuse
// calls Done once it has written the reply (or dropped it), and Done returns
// the result to a pool.
type readResult struct{ data []byte }

var readResults = sync.Pool{New: func() any { return new(readResult) }}

var _ fuse.ReadResult = (*readResult)(nil)

// Bytes returns the data read, which lives in the request buffer.
func (r *readResult) Bytes([]byte) ([]byte, fuse.Status) { return r.data, fuse.OK }

// Size is the number of bytes read.
func (r *readResult) Size() int { return len(r.data) }

// Readv copies the data into dst, for transports that ask for it.
func (r *readResult) Readv(dst [][]byte) (int, fuse.Status) {
	n, src := 0, r.data
	for _, d := range dst {
		if len(src) == 0 {
			break
		}
		k := copy(d, src)
		n, src = n+k, src[k:]
	}
	return n, fuse.OK
}

// Done returns r to the pool.
func (r *readResult) Done() {
	r.data = nil
	readResults.Put(r)
}

// Write writes to the device; a write that rawFS marked (O_DSYNC in the
// request) goes down with the FUA mark, so that it is on stable media before
// it is acknowledged. A write fails as a whole with the error of any piece,
// as a bio completes with one status (drivers/md/dm.c: dm_io_dec_pending
// keeps the error of a failed clone for the whole bio), even when pieces
// before it were written: a short count without an error would tell the
// kernel that part of the request succeeded, and FUSE turns a short direct
// write into EIO (fs/fuse/file.c: fuse_get_res_by_io), so an ENOSPC of a
// thin pool, for one, would reach the loop device above as EIO. Only a
// write clipped at the end of the device is short, without an error.
func (n *devNode) Write(ctx context.Context, _ gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	k, err := n.dev.WriteAt(n.ioContext(ctx), data, off)
	if err != nil {
		return 0, errno(err)
	}
	return uint32(k), 0
}

// Fsync is an empty flush that reaches every underlying device.
func (n *devNode) Fsync(ctx context.Context, _ gofs.FileHandle, _ uint32) syscall.Errno {
	return errno(n.dev.Flush(n.ioContext(ctx)))
}

// ioCtx is the context of device I/O unless Options.Interruptible is set.
// It is never cancelled: like I/O on a dm device, I/O that a suspend, a
// delay or queue_if_no_path holds is not ended by a signal to the process
// that issued it. (The kernel sends FUSE an INTERRUPT for any signal the
// caller handles, including the Go runtime's preemption signals, and the
// EINTR a cancelled request returns reaches the caller even when its
// handler has SA_RESTART, which programs that do not retry see as an
// error.) A fatal signal does not end such a request either: the kernel
// waits for the daemon's answer, as the kernel waits for a dm device's
// held bio, and the process exits once the I/O completes.
var ioCtx = context.Background()

// fuaCtx is ioCtx with the FUA mark (stack.WithFUA).
var fuaCtx = stack.WithFUA(ioCtx)

// ioContext returns the context of the device I/O of the request whose
// go-fuse context is ctx: ioCtx, or fuaCtx for a write rawFS marked. On the
// io_uring transport it is the ring entry's copy of one of them, which also
// carries the request's hints.Waiter (the io_uring transport marks durable
// writes itself) and, with Options.Interruptible, ends when the request is
// interrupted. On /dev/fuse with Options.Interruptible it is go-fuse's
// context, which ends when the request is interrupted, except for writes
// rawFS marked durable (their cancel channel stands for the mark). Every
// device request passes here, so it also wakes a parked releaser.
func (n *devNode) ioContext(ctx context.Context) context.Context {
	n.root.requested()
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return ioCtx
	}
	if fc.Cancel == fuaCancel {
		return fuaCtx
	}
	if rs := n.root.ring.Load(); rs != nil {
		if c := rs.Context(fc.Cancel); c != nil {
			return c
		}
	}
	if n.root.interruptible {
		return fc
	}
	return ioCtx
}

// fuaCancel stands, in the context go-fuse's bridge hands to devNode.Write,
// for the request's cancel channel when rawFS found O_DSYNC in the request.
// The bridge passes a WRITE's offset, data and cancel channel on but drops
// fuse_write_in.flags, and the kernel sends no FSYNC after an O_DSYNC write
// to a FOPEN_DIRECT_IO file (fs/fuse/file.c: fuse_direct_write_iter): the
// flag is the only sign that the write must be durable. Nothing closes
// fuaCancel, so such a write on /dev/fuse is not interrupted even under
// Options.Interruptible.
var fuaCancel <-chan struct{} = make(chan struct{})

// rawFS is go-fuse's bridge with WRITE requests looked at first: those whose
// fuse_write_in.flags hold O_DSYNC (the kernel sets it for files opened with
// O_DSYNC or O_SYNC and for pwritev2 with RWF_DSYNC or RWF_SYNC:
// fs/fuse/file.c: fuse_write_flags) are marked for devNode.Write with
// fuaCancel. Both transports serve through it.
type rawFS struct{ fuse.RawFileSystem }

func (r rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	return r.RawFileSystem.Write(markFUA(cancel, in), in, data)
}

func (r rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	return r.RawFileSystem.Writev(markFUA(cancel, in), in, data)
}

// markFUA returns fuaCancel for a write that must be durable, else cancel.
func markFUA(cancel <-chan struct{}, in *fuse.WriteIn) <-chan struct{} {
	if in.Flags&syscall.O_DSYNC != 0 {
		return fuaCancel
	}
	return cancel
}

// errno turns a device error into the errno the caller sees: the Errno it
// carries, EINTR for I/O that an interrupt ended (Options.Interruptible),
// else EIO.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR
	}
	return syscall.EIO
}

// Flush is the FLUSH of close(2): not I/O.
func (n *devNode) Flush(context.Context, gofs.FileHandle) syscall.Errno { return 0 }

const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

// Allocate maps PUNCH_HOLE|KEEP_SIZE to a discard and ZERO_RANGE to
// write-zeroes; a plain allocation inside the device succeeds, since the
// device is fully provisioned.
func (n *devNode) Allocate(ctx context.Context, _ gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	switch mode {
	case fallocPunchHole | fallocKeepSize:
		return errno(n.dev.Discard(n.ioContext(ctx), int64(off), int64(size)))
	case fallocZeroRange, fallocZeroRange | fallocKeepSize:
		return errno(n.dev.WriteZeroes(n.ioContext(ctx), int64(off), int64(size)))
	case 0, fallocKeepSize:
		if int64(off+size) > n.dev.Size() && mode == 0 {
			return syscall.EPERM
		}
		return 0
	}
	return syscall.EOPNOTSUPP
}
