package stack

import (
	"context"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// FileRead is a read of a device that maps, whole, onto one range of one
// backing file through a linear target, so that a transport can issue it
// on the file itself, asynchronously (an io_uring READ submitted with the
// replies), instead of calling ReadAt with a system call per request.
// Device.FileRead starts it: it is inside the device's suspend gate and
// counted in the device's statistics from then on; End ends both. FD and
// Off say where the bytes are.
//
// Only reads, and only of files that io_uring reads without handing the
// read to a worker thread (block devices, files on ext4, xfs and btrfs),
// go this way: io_uring hands every read of a tmpfs file, and every
// buffered write on ext4, to a worker thread, which costs more than the
// pread or pwrite it replaces (docs/benchmarks.md, Direct reads).
type FileRead struct {
	// FD is the backing file's descriptor and Off the offset in it of the
	// I/O's first byte; both stay valid until End.
	FD  int
	Off int64

	d     *Device
	dev   *fileDev
	shard int
	k     ioop.Op
	n     int64
	start int64
	rr    stats.RegionRef
}

var fileReads = sync.Pool{New: func() any { return new(FileRead) }}

// FileRead starts a read (k ioop.Read) of n bytes at off as a FileRead, if
// the live table maps all of them onto one backing file that io_uring
// reads without a worker thread, through a linear target; otherwise (a
// write, another target, a request crossing the end or a target's I/O
// size limit, dm-stats done by the target), or while the device is
// suspended, it returns nil and the caller uses ReadAt or WriteAt, which
// also wait where the device says so.
func (d *Device) FileRead(k ioop.Op, off int64, n int) *FileRead {
	if k != ioop.Read || n <= 0 || off < 0 {
		return nil
	}
	g, ok := d.gate.tryEnter()
	if !ok {
		return nil
	}
	t := d.live.Load()
	end := off + int64(n)
	if t == nil || end > t.size {
		d.gate.exit(g)
		return nil
	}
	s := &t.segs[t.find(off)]
	rel := off - s.start
	l, ok := s.target.(*linear)
	if !ok || end > s.end || s.atMap || s.maxIO > 0 && rel/s.maxIO != (rel+int64(n)-1)/s.maxIO {
		d.gate.exit(g)
		return nil
	}
	f, ok := l.Dev.(*fileDev)
	if !ok || !f.asyncRead {
		d.gate.exit(g)
		return nil
	}
	io := fileReads.Get().(*FileRead)
	*io = FileRead{FD: f.fd, Off: l.Off + rel, d: d, dev: f, shard: g, k: k, n: int64(n)}
	io.start = d.disk.Now()
	io.rr = d.disk.StartAt(k, io.start, off, io.n)
	return io
}

// End ends io with res, the result of its read on the file (bytes read, or
// a negative errno), p being the buffer it read into: a short read is
// finished here with the file's ReadAt (past the end of a file that shrank
// it reads zeros, as ReadAt does). It returns what ReadAt would have, and
// io may not be used again.
func (io *FileRead) End(ctx context.Context, p []byte, res int) (int, error) {
	n, err := res, error(nil)
	switch {
	case res < 0:
		n, err = 0, syscall.Errno(-res)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			n, err = io.rest(ctx, p, 0)
		}
	case int64(res) < io.n:
		n, err = io.rest(ctx, p, res)
	}
	if err == nil && int64(n) != io.n {
		err = syscall.EIO
	}
	d := io.d
	d.disk.DoneAt(io.k, uint64((io.n+SectorSize-1)/SectorSize), io.start, io.rr)
	d.gate.exit(io.shard)
	*io = FileRead{}
	fileReads.Put(io)
	return n, err
}

// rest reads the bytes of io from done on with the file's ReadAt.
func (io *FileRead) rest(ctx context.Context, p []byte, done int) (int, error) {
	k, err := io.dev.ReadAt(ctx, p[done:io.n], io.Off+int64(done))
	return done + k, err
}
