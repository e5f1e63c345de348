package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/stack"
)

// RequestTimeout is how long the daemon waits for a client to send its whole
// request before it drops the connection.
const RequestTimeout = 30 * time.Second

// Bounds of the control socket. A connection beyond MaxConns (open at once)
// or beyond Rate per second (after a burst of as many) is answered at once
// with EAGAIN and closed; Call retries such a refusal for a while. Each
// connection is served on its own goroutine with its own deadline, so a
// client that sends nothing, sends half a request or never reads its answer
// holds only its own connection, never another client or the I/O path.
const (
	// MaxConns is how many connections the server holds open at once.
	MaxConns = 64
	// Rate is how many connections per second the server accepts, after a
	// burst of as many.
	Rate = 5000
)

// Server answers control requests for the devices of a stack.Manager.
type Server struct {
	mgr    *stack.Manager
	ctx    context.Context
	cancel context.CancelFunc
	// waits ends the requests that wait for device events (wait); Close
	// ends it first, since such requests may never end by themselves.
	waits     context.Context
	stopWaits context.CancelFunc
	// uid is the user, besides root, whose clients may send commands: the
	// daemon's effective uid.
	uid uint32
	// stop stops the daemon (OnStop).
	stop func(force bool) error
	// supervise takes over a `dmfuse exec` listener (OnSupervise).
	supervise func(pid, fd int) error

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	// draining is set once a stop succeeded: the listener is closed.
	draining bool
	wg       sync.WaitGroup
	// tokens and last are the rate limiter's bucket (Rate per second, up
	// to Rate) and the time it was last filled.
	tokens float64
	last   time.Time
}

// NewServer returns a server for the devices of m. Requests run under ctx,
// which should live as long as the daemon; Close cancels what is left of it.
func NewServer(ctx context.Context, m *stack.Manager) *Server {
	ctx, cancel := context.WithCancel(ctx)
	waits, stopWaits := context.WithCancel(ctx)
	return &Server{mgr: m, ctx: ctx, cancel: cancel, waits: waits, stopWaits: stopWaits, conns: map[net.Conn]struct{}{},
		uid: uint32(os.Geteuid()), tokens: Rate, last: time.Now()}
}

// OnStop makes the request stop call f, the daemon's way to stop, with the
// request's force; set it before Serve. f returns nil once the daemon is
// sure to exit, and then the server stops accepting connections (the
// requests accepted already are answered); an error is the answer of the
// stop request, and the server goes on. Without f, stop fails.
func (s *Server) OnStop(f func(force bool) error) { s.stop = f }

// OnSupervise sets what takes over the seccomp listener that descriptor fd
// of the client's process pid is (the supervise operation of `dmfuse
// exec`); without it the operation is refused.
func (s *Server) OnSupervise(f func(pid, fd int) error) { s.supervise = f }

// peerPIDKey keys the client's pid (SO_PEERCRED) in the context of a
// supervise request.
type peerPIDKey struct{}

// StopAccepting closes the listener, which removes the socket file, and
// lets Serve return; connections already accepted are served. A daemon
// calls it once it is sure to exit.
func (s *Server) StopAccepting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	if s.ln != nil {
		s.ln.Close()
	}
}

// refusal says why a new connection is not served ("" if it is), with the
// errno of the answer. Peer credentials come from the kernel (SO_PEERCRED):
// only root and the daemon's own user may send commands, whatever the mode
// of the socket file. Called with s.mu held.
func (s *Server) refusal(c net.Conn) (reason, errno string) {
	if uc, ok := c.(*net.UnixConn); ok {
		uid, err := peerUID(uc)
		if err != nil {
			return fmt.Sprintf("control socket: cannot read the client's credentials: %v", err), "EPERM"
		}
		if uid != 0 && uid != s.uid {
			if s.uid == 0 {
				return fmt.Sprintf("control socket: permission denied: uid %d may not send commands (only root may)", uid), "EPERM"
			}
			return fmt.Sprintf("control socket: permission denied: uid %d may not send commands (only root and uid %d may)", uid, s.uid), "EPERM"
		}
	}
	if len(s.conns) >= MaxConns {
		return fmt.Sprintf("control socket: too many connections (%d open); try again", len(s.conns)), "EAGAIN"
	}
	now := time.Now()
	s.tokens = min(Rate, s.tokens+now.Sub(s.last).Seconds()*Rate)
	s.last = now
	if s.tokens < 1 {
		return fmt.Sprintf("control socket: more than %d requests per second; try again", Rate), "EAGAIN"
	}
	s.tokens--
	return "", ""
}

// peerUID returns the uid of the process at the other end of c.
func peerUID(c *net.UnixConn) (uint32, error) {
	cred, err := peerCred(c)
	if err != nil {
		return 0, err
	}
	return cred.Uid, nil
}

// peerCred returns the credentials of the process at the other end of c.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, serr
}

// refuse answers a connection that is not served and closes it. The answer
// is short and the connection new, so the write does not wait; the deadline
// only guards against the impossible.
func refuse(c net.Conn, reason, errno string) {
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	writeResponse(c, &Response{Error: reason, Errno: errno})
	c.Close()
}

// Serve accepts connections on ln until Close, one goroutine per connection.
// It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("control server closed")
	}
	s.ln = ln
	s.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed || s.draining
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
				errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EINTR) {
				// Out of descriptors or memory for a moment (a flood of
				// clients, say): wait and accept again rather than stop
				// serving for good.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("control socket: accept: %w", err)
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		if reason, errno := s.refusal(c); reason != "" {
			s.mu.Unlock()
			refuse(c, reason, errno)
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// Close stops accepting, closes the listener (which removes the socket file)
// and waits for the requests being handled to finish.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	}
	for c := range s.conns {
		// Unblock connections still waiting for their request; a request
		// being executed finishes first.
		c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	s.stopWaits()
	s.wg.Wait()
	s.cancel()
	return err
}

func (s *Server) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	c.SetReadDeadline(time.Now().Add(RequestTimeout))
	req, err := ReadRequest(c)
	if err != nil {
		var ne net.Error
		if errors.Is(err, ErrIncompleteRequest) || errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
			return // the client went away mid-request: nothing to do
		}
		writeResponse(c, &Response{Error: err.Error(), Errno: "EINVAL"})
		return
	}
	ctx := s.ctx
	if req.Op == OpSupervise {
		if uc, ok := c.(*net.UnixConn); ok {
			if cred, err := peerCred(uc); err == nil {
				ctx = context.WithValue(ctx, peerPIDKey{}, cred.Pid)
			}
		}
	}
	if req.Op == OpWait {
		var cancel context.CancelFunc
		ctx, cancel = s.waitContext(c)
		defer cancel()
	}
	resp := s.Handle(ctx, req)
	c.SetWriteDeadline(time.Now().Add(RequestTimeout))
	writeResponse(c, resp)
}

func writeResponse(c net.Conn, r *Response) {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(&Response{Error: err.Error(), Errno: "EINVAL"})
	}
	c.Write(append(b, '\n'))
}

// Handle validates one request (Request.Validate), runs it and returns its
// response; a request that is not valid gets an EINVAL response and changes
// nothing.
func (s *Server) Handle(ctx context.Context, r *Request) *Response {
	if err := r.Validate(); err != nil {
		return &Response{Error: err.Error(), Errno: "EINVAL"}
	}
	out, err := ops[r.Op].run(s, ctx, r)
	if err != nil {
		return &Response{Output: out, Error: err.Error(), Errno: errnoName(err)}
	}
	return &Response{Output: out}
}

// errnoName names the errno an error carries (EINVAL if none).
func errnoName(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
		return fmt.Sprintf("errno %d", int(e))
	}
	return "EINVAL"
}

// each formats one device (name given) or every device with "NAME: "
// prefixes (name empty), as dmsetup does.
func (s *Server) each(name string, f func(d *stack.Device, prefix string) string) (string, error) {
	if name != "" {
		d := s.mgr.Lookup(name)
		if d == nil {
			return "", stack.NoSuchDevice(name)
		}
		return f(d, ""), nil
	}
	devs := s.mgr.Devices()
	if len(devs) == 0 {
		return "No devices found\n", nil
	}
	var b strings.Builder
	for _, d := range devs {
		b.WriteString(f(d, d.Name()+": "))
	}
	return b.String(), nil
}
