package stack

import (
	"context"
	"sync"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/ioop"
	"github.com/dmfuse/dmfuse/stats"
)

// FileIO is a read or write of a device that maps, whole, onto one range
// of one backing file through a linear target, so that a transport can
// issue it on the file itself, asynchronously (an io_uring READ or WRITE
// submitted with the replies), instead of calling ReadAt or WriteAt with a
// system call per request. Device.FileIO starts it: it is inside the
// device's suspend gate and counted in the device's statistics from then
// on; End ends both. FD and Off say where the bytes are.
//
// Only I/O that io_uring completes without handing it to a worker thread
// goes this way: reads of block devices and of files on ext4, xfs and
// btrfs, and writes of block devices with direct I/O (filedirect.go).
// io_uring hands every read of a tmpfs file, and every buffered write on
// ext4, to a worker thread, which costs more than the pread or pwrite it
// replaces (docs/benchmarks.md, Direct reads).
type FileIO struct {
	// FD is the backing file's descriptor and Off the offset in it of the
	// I/O's first byte; both stay valid until End. FD may be opened with
	// O_DIRECT: the buffer of the I/O must then be aligned to the page,
	// as the ring transport's payload buffers are (a misaligned one fails
	// with EINVAL, and End does the I/O again with a system call).
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

var fileIOs = sync.Pool{New: func() any { return new(FileIO) }}

// FileIO starts a read or write (k ioop.Read or ioop.Write) of n bytes at
// off as a FileIO, if the live table maps all of them onto one backing
// file through a linear target, and io_uring does that I/O on that file
// without a worker thread; otherwise (another target, a request crossing
// the end or a target's I/O size limit, dm-stats done by the target, a
// read-only table, a write that is not aligned for direct I/O), or while
// the device is suspended, it returns nil and the caller uses ReadAt or
// WriteAt, which also wait where the device says so.
func (d *Device) FileIO(k ioop.Op, off int64, n int) *FileIO {
	if k != ioop.Read && k != ioop.Write || n <= 0 || off < 0 {
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
	fd := -1
	if ok {
		fd = f.ringFD(k, l.Off+rel, n)
	}
	if fd < 0 || k == ioop.Write && t.readOnly {
		d.gate.exit(g)
		return nil
	}
	io := fileIOs.Get().(*FileIO)
	*io = FileIO{FD: fd, Off: l.Off + rel, d: d, dev: f, shard: g, k: k, n: int64(n)}
	io.start = d.disk.Now()
	io.rr = d.disk.StartAt(k, io.start, off, io.n)
	return io
}

// End ends io with res, the result of its read or write on the file
// (bytes, or a negative errno), p being the buffer it read into or wrote:
// a short one, or one the file refused with EAGAIN, EINTR or (direct I/O
// with a misaligned buffer) EINVAL, is finished here with the file's
// ReadAt or WriteAt (past the end of a file that shrank a read reads
// zeros, as ReadAt does). It returns what ReadAt or WriteAt would have,
// and io may not be used again.
func (io *FileIO) End(ctx context.Context, p []byte, res int) (int, error) {
	n, err := res, error(nil)
	switch {
	case res < 0:
		n, err = 0, syscall.Errno(-res)
		if err == syscall.EINTR || err == syscall.EAGAIN || err == syscall.EINVAL && io.FD != io.dev.fd {
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
	*io = FileIO{}
	fileIOs.Put(io)
	return n, err
}

// rest reads or writes the bytes of io from done on with the file's
// ReadAt or WriteAt.
func (io *FileIO) rest(ctx context.Context, p []byte, done int) (int, error) {
	rw := io.dev.ReadAt
	if io.k == ioop.Write {
		rw = io.dev.WriteAt
	}
	k, err := rw(ctx, p[done:io.n], io.Off+int64(done))
	return done + k, err
}
