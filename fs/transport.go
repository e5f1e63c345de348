package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/fs/uring"
)

// Transports: how FUSE requests reach the daemon.
const (
	// TransportAuto uses io_uring when the kernel offers it, else /dev/fuse.
	TransportAuto = "auto"
	// TransportURing requires FUSE over io_uring and fails without it.
	TransportURing = "uring"
	// TransportDev reads and writes /dev/fuse (go-fuse's own loop).
	TransportDev = "dev"
)

// Server is a mounted dmfuse file system. It embeds the go-fuse server
// (which answers FUSE_INIT and writes notifications; on /dev/fuse it serves
// every request) and, on the io_uring transport, the ring server, which
// then also reads /dev/fuse for FORGET and INTERRUPT (uring.Server.ServeDev).
type Server struct {
	*fuse.Server

	dir       string
	byFD      bool // mounted by dmfuse through /dev/fd/N: go-fuse cannot unmount it
	ring      *uring.Server
	transport string

	plan     MemoryPlan
	releases atomic.Uint64

	mu        sync.Mutex
	unmounted bool
}

// Transport names the transport in use: TransportURing or TransportDev.
func (s *Server) Transport() string { return s.transport }

// Unmount unmounts the file system and waits until serving has ended. It
// fails (and changes nothing) while the mount is busy, for example while a
// loop device is attached to a device file.
func (s *Server) Unmount() error {
	if !s.byFD {
		return s.Server.Unmount()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unmounted {
		return nil
	}
	var err error
	delay := time.Duration(0)
	for try := 0; try < 5; try++ {
		// The kernel may not have processed the last close(2) yet.
		if err = unix.Unmount(s.dir, 0); err == nil || errors.Is(err, unix.EINVAL) {
			err = nil
			break
		}
		delay = 2*delay + 5*time.Millisecond
		time.Sleep(delay)
	}
	if err != nil {
		return err
	}
	s.unmounted = true
	s.Wait()
	return nil
}

// Procs returns how many Ps the transport wants on top of one per CPU (see
// uring.Server.Procs); /dev/fuse wants none.
func (s *Server) Procs() int {
	if s.ring == nil {
		return 0
	}
	return s.ring.Procs()
}

// Wait returns when the file system is unmounted and every transport has
// stopped.
func (s *Server) Wait() {
	s.Server.Wait()
	if s.ring != nil {
		s.ring.Wait()
	}
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
		return
	}
	fmt.Fprintf(os.Stderr, "dmfuse: "+format+"\n", args...)
}

// mountTransport mounts root on dir with the transport o asks for.
func mountTransport(dir string, root gofs.InodeEmbedder, opts *gofs.Options, o Options) (*Server, error) {
	t := o.Transport
	if t == "" {
		t = TransportAuto
	}
	if t != TransportAuto && t != TransportURing && t != TransportDev {
		return nil, fmt.Errorf("unknown transport %q (want auto, uring or dev)", t)
	}
	if t == TransportDev {
		srv, err := mountDev(dir, root, opts)
		if err != nil {
			return nil, err
		}
		o.logf("transport /dev/fuse (chosen)")
		return &Server{Server: srv, dir: dir, transport: TransportDev}, nil
	}
	rs, why := newRings(o, opts.MountOptions.MaxWrite)
	if why != nil {
		if t == TransportURing {
			return nil, fmt.Errorf("io_uring transport: %w", why)
		}
		srv, err := mountDev(dir, root, opts)
		if err != nil {
			return nil, err
		}
		o.logf("transport /dev/fuse: io_uring is not available: %v", why)
		return &Server{Server: srv, dir: dir, transport: TransportDev}, nil
	}
	s, err := mountURing(dir, root, opts, o, rs)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// mountDev mounts root on dir served from /dev/fuse, as go-fuse's fs.Mount
// does, through rawFS.
func mountDev(dir string, root gofs.InodeEmbedder, opts *gofs.Options) (*fuse.Server, error) {
	srv, err := fuse.NewServer(rawFS{gofs.NewNodeFS(root, opts)}, dir, &opts.MountOptions)
	if err != nil {
		return nil, err
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		// As in fs.Mount: the serve loop ends by itself when the mount
		// failed.
		return nil, err
	}
	return srv, nil
}

// newRings creates the rings before the mount, so that a failure still
// leaves the choice of /dev/fuse: once FUSE_INIT has negotiated io_uring,
// the kernel holds every request until the rings are registered.
func newRings(o Options, maxWrite int) (*uring.Server, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("not root (the mount goes through fusermount, which keeps the /dev/fuse descriptor to itself)")
	}
	if o.EnableURing {
		if err := uring.Enable(); err != nil {
			return nil, fmt.Errorf("switching on %s: %w", uring.ModuleParam, err)
		}
	}
	if err := uring.Available(); err != nil {
		if !o.EnableURing {
			err = fmt.Errorf("%w (--enable-uring switches it on)", err)
		}
		return nil, err
	}
	payload := maxWrite
	if v, err := strconv.Atoi(os.Getenv("DMFUSE_URING_PAYLOAD")); err == nil {
		// Only for tests: a buffer smaller than the kernel wants makes
		// registration fail, which exercises the fallback.
		payload = v
	}
	var setup uint32
	if v, err := strconv.ParseUint(os.Getenv("DMFUSE_URING_SETUP"), 0, 32); err == nil {
		// Only for experiments: extra IORING_SETUP_* flags.
		setup = uint32(v)
	}
	pinMode := uring.PinQueueCPU
	switch os.Getenv("DMFUSE_URING_PIN") {
	case "none":
		pinMode = uring.PinNone
	case "other":
		pinMode = uring.PinOtherCPU
	}
	offload, _ := strconv.Atoi(os.Getenv("DMFUSE_URING_OFFLOAD")) // 0: the default, -1: never
	batch, _ := strconv.Atoi(os.Getenv("DMFUSE_URING_BATCH"))
	// Only for tests: a watchdog slower than a stalled test machine, so
	// that a test sees the hand-off a waiting request asks for.
	takeover, _ := time.ParseDuration(os.Getenv("DMFUSE_URING_WATCHDOG"))
	return uring.New(uring.Config{
		Interruptible: o.Interruptible,
		SubmitBatch:   batch,
		TakeoverAfter: takeover,
		Pin:           pinMode,
		OffloadBytes:  offload,
		SetupFlags:    setup,
		Depth:         o.URingDepth,
		PayloadSize:   payload,
		Poll:          o.Poll,
		IOContext:     ioCtx,
		FUAContext:    fuaCtx,
		Logf:          o.logf,
	})
}

// mountURing mounts with a /dev/fuse descriptor of its own, lets go-fuse
// answer FUSE_INIT on it (asking for FUSE_OVER_IO_URING), then registers the
// rings on the same connection and reads /dev/fuse with ServeDev; if the
// rings cannot serve, go-fuse's loop serves /dev/fuse.
func mountURing(dir string, top gofs.InodeEmbedder, opts *gofs.Options, o Options, rs *uring.Server) (*Server, error) {
	mo := opts.MountOptions
	mo.DirectMount, mo.DirectMountStrict = false, false
	mo.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
	fd, err := mountFD(dir, &mo)
	if err != nil {
		rs.Close()
		return nil, err
	}
	nopts := *opts
	nopts.MountOptions = mo
	nodes := gofs.NewNodeFS(top, &nopts)
	raw := rawFS{nodes}
	// NewServer answers FUSE_INIT before it returns. Nothing else reaches
	// /dev/fuse before a loop reads it.
	srv, err := fuse.NewServer(raw, fmt.Sprintf("/dev/fd/%d", fd), &mo)
	if err != nil {
		rs.Close()
		unix.Unmount(dir, unix.MNT_DETACH)
		return nil, err
	}
	if err := srv.WaitMount(); err != nil {
		rs.Close()
		unix.Unmount(dir, unix.MNT_DETACH)
		go srv.Serve() // finds the connection ended and closes the descriptor
		return nil, err
	}
	s := &Server{Server: srv, dir: dir, byFD: true, transport: TransportDev}
	if srv.KernelSettings().Flags64()&fuse.CAP_OVER_IO_URING == 0 {
		rs.Close()
		go srv.Serve()
		o.logf("transport /dev/fuse: the kernel did not offer io_uring in FUSE_INIT")
		return s, nil
	}
	// The rings mark durable writes themselves (Server.Context), without
	// rawFS, which would hide the request's cancel channel.
	var served fuse.RawFileSystem = nodes
	if r, ok := top.(*root); ok {
		served = newRingFS(nodes, r)
	}
	if err := rs.Start(fd, served); err != nil {
		// A refused registration makes the kernel fall back to /dev/fuse.
		go srv.Serve()
		o.logf("transport /dev/fuse: io_uring registration failed, falling back: %v", err)
		return s, nil
	}
	// /dev/fuse now carries only FORGET and INTERRUPT: ServeDev reads it
	// instead of go-fuse's loop, which would lose the interrupts of ring
	// requests. Once the connection ends, go-fuse's loop finds it ended,
	// closes the descriptor and calls OnUnmount.
	go func() {
		if err := rs.ServeDev(fd); err != nil {
			o.logf("io_uring: %v", err)
		}
		srv.Serve()
	}()
	s.ring, s.transport = rs, TransportURing
	depth := o.URingDepth
	if depth <= 0 {
		depth = uring.DefaultDepth
	}
	poll := "adaptive"
	switch {
	case o.Poll < 0:
		poll = "off"
	case o.Poll > 0:
		poll = o.Poll.String()
	}
	o.logf("transport io_uring: %d queues x %d entries, poll %s", uring.Queues(), depth, poll)
	return s, nil
}

// mountFD mounts a FUSE file system on dir as go-fuse's direct mount does,
// but keeps the /dev/fuse descriptor for the caller.
func mountFD(dir string, mo *fuse.MountOptions) (int, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return -1, err
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	o := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}
	if mo.AllowOther {
		o = append(o, "allow_other")
	}
	if err := unix.Mount(mo.FsName, dir, "fuse."+mo.Name, unix.MS_NOSUID|unix.MS_NODEV, strings.Join(o, ",")); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
