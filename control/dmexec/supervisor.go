package dmexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control/dmioctl"
	"github.com/dmfuse/dmfuse/stack"
)

// Supervisor serves the trapped system calls of the programs `dmfuse exec`
// runs, for the devices of one Manager: it is the daemon's half of the
// interface. It must never run under a filter of its own making.
type Supervisor struct {
	ctx  context.Context
	mgr  *stack.Manager
	dm   *dmioctl.Server
	logf func(format string, a ...any)
	// nodes is a folder of block nodes of the daemon's own, one per
	// exported device (named by the device's number), each of the loop
	// device the device is exported as: an open of a device node is
	// answered with a descriptor of one of them, which fstat then knows by
	// its inode.
	nodes string

	mu struct {
		sync.Mutex
		// byIno maps the inodes of the nodes to the device number they
		// stand for.
		byIno map[uint64]devNo
		// controls are the open control nodes, by the inode of the pipe
		// handed out for each.
		controls map[uint64]*control
		// namespaces are the mount namespaces of the commands served, by
		// their /proc/PID/ns/mnt link, with the count of listeners.
		namespaces map[string]int
	}
	wg sync.WaitGroup
}

type devNo struct{ major, minor uint32 }

// control is one open of the control node: a pipe whose read end the
// program holds (readable while a poll of the control node would be) and
// whose write end the supervisor keeps.
type control struct {
	file     *dmioctl.File
	w        *os.File
	signaled bool
}

// NewSupervisor returns a supervisor of m's devices answering DM ioctls with
// dm, keeping its nodes in the folder dir (created if missing). logf
// receives what it reports.
func NewSupervisor(ctx context.Context, m *stack.Manager, dm *dmioctl.Server, dir string, logf func(string, ...any)) (*Supervisor, error) {
	// Nodes a daemon before this one made are not in this one's map.
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Supervisor{ctx: ctx, mgr: m, dm: dm, nodes: dir, logf: logf}
	s.mu.byIno = map[uint64]devNo{}
	s.mu.controls = map[uint64]*control{}
	s.mu.namespaces = map[string]int{}
	s.wg.Add(1)
	go s.signalPolls()
	return s, nil
}

// Wait waits for every listener and the poll signaller to end (after the
// context ends).
func (s *Supervisor) Wait() { s.wg.Wait() }

// Supervise takes over the listener of a filter installed by process pid
// (its descriptor fd there) and serves it in the background until every
// process under the filter is gone or the supervisor's context ends.
func (s *Supervisor) Supervise(pid, fd int) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	lfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	unix.Close(pidfd)
	if err != nil {
		return fmt.Errorf("pidfd_getfd %d/%d: %w", pid, fd, err)
	}
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	s.mu.Lock()
	s.mu.namespaces[ns]++
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		s.serve(lfd)
		s.mu.Lock()
		if s.mu.namespaces[ns]--; s.mu.namespaces[ns] <= 0 {
			delete(s.mu.namespaces, ns)
		}
		s.mu.Unlock()
	}()
	return nil
}

// Terminate ends the processes still running in the mount namespaces of
// the commands served (what a command left running, such as dmeventd, or a
// shell still open): without the supervisor every call of theirs that the
// filter traps would fail with ENOSYS. They get SIGTERM, and SIGKILL if
// still there after grace. It returns their pids.
func (s *Supervisor) Terminate(grace time.Duration) []int {
	s.mu.Lock()
	nss := make(map[string]bool, len(s.mu.namespaces))
	for ns := range s.mu.namespaces {
		nss[ns] = true
	}
	s.mu.Unlock()
	if len(nss) == 0 {
		return nil
	}
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && nss[ns] {
			pids = append(pids, pid)
			unix.Kill(pid, unix.SIGTERM)
		}
	}
	deadline := time.Now().Add(grace)
	for _, pid := range pids {
		for unix.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		unix.Kill(pid, unix.SIGKILL)
	}
	return pids
}

// serve answers the notifications of one listener.
func (s *Supervisor) serve(fd int) {
	defer s.wg.Done()
	defer unix.Close(fd)
	var handlers sync.WaitGroup
	defer handlers.Wait()
	for s.ctx.Err() == nil {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 1000); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.logf("exec: poll of a listener: %v", err)
			return
		}
		if pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
			return // every process under the filter has gone
		}
		if pfd[0].Revents&unix.POLLIN == 0 {
			continue
		}
		n := new(seccompNotif)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(n))); errno != 0 {
			if errno == unix.ENOENT || errno == unix.EINTR {
				continue // the caller went away before we took it
			}
			s.logf("exec: SECCOMP_IOCTL_NOTIF_RECV: %v", errno)
			return
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			s.handle(fd, n)
		}()
	}
}

// call is one trapped system call being answered.
type call struct {
	s   *Supervisor
	fd  int // the listener
	n   *seccompNotif
	pid int
}

// valid reports whether the call's caller still waits for its answer (so
// that what was read from its memory was its own, and its pid not reused).
func (c *call) valid() bool {
	id := c.n.ID
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), ioctlNotifIDValid, uintptr(unsafe.Pointer(&id)))
	return errno == 0
}

// respond answers the call with val or -errno.
func (c *call) respond(val int64, errno unix.Errno) {
	r := seccompNotifResp{ID: c.n.ID, Val: val, Error: -int32(errno)}
	unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r)))
}

// proceed lets the call run as the caller made it.
func (c *call) proceed() {
	r := seccompNotifResp{ID: c.n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r)))
}

// installFD puts file descriptor fd into the caller's table and answers the
// call with its number there (an open that returns it).
//
// The two steps are two ioctls on purpose. With SECCOMP_ADDFD_FLAG_SEND the
// kernel marks the call answered before it waits for the caller to take the
// descriptor, and that wait ends at any signal to this thread (the Go
// runtime preempts with SIGURG): the descriptor is then taken back, the
// restarted ioctl fails with EINPROGRESS, and the caller's open returns 0,
// its standard input, as if it were the new descriptor. A plain ADDFD that a
// signal interrupts either completed (and returns the number) or is
// withdrawn and restarts whole.
func (c *call) installFD(fd int, cloexec bool) {
	a := seccompNotifAddfd{ID: c.n.ID, Srcfd: uint32(fd)}
	if cloexec {
		a.NewfdFlags = unix.O_CLOEXEC
	}
	newfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), ioctlNotifAddfd, uintptr(unsafe.Pointer(&a)))
	switch errno {
	case 0:
		c.respond(int64(newfd), 0)
	case unix.ENOENT:
		// The caller went away.
	default:
		c.respond(0, errno)
	}
}

// handle answers one trapped call.
func (s *Supervisor) handle(fd int, n *seccompNotif) {
	c := &call{s: s, fd: fd, n: n, pid: int(n.Pid)}
	a := n.Data.Args
	switch n.Data.Nr {
	case unix.SYS_OPEN:
		c.open(unix.AT_FDCWD, a[0], a[1], false)
	case unix.SYS_OPENAT:
		c.open(int32(a[0]), a[1], a[2], false)
	case unix.SYS_OPENAT2:
		c.open(int32(a[0]), a[1], a[2], true)
	case unix.SYS_IOCTL:
		c.ioctl(int32(a[0]), uint32(a[1]), a[2])
	case unix.SYS_FSTAT:
		c.fstat(int32(a[0]), a[1])
	case unix.SYS_NEWFSTATAT:
		c.fstatat(int32(a[0]), a[1], a[2])
	case unix.SYS_STATX:
		c.statx(int32(a[0]), a[1], uint32(a[3]), a[4])
	case unix.SYS_MOUNT:
		c.mount(a[0], a[1], a[2], a[3], a[4])
	default:
		c.proceed()
	}
}

// nodeFor returns the path of the daemon's node for device d, exported as
// the block device major:minor, made or replaced as needed.
func (s *Supervisor) nodeFor(d *stack.Device, major, minor uint32) (string, error) {
	p := filepath.Join(s.nodes, d.DevNo())
	want := unix.Mkdev(major, minor)
	var st unix.Stat_t
	if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == want {
		return p, nil
	}
	tmp := p + ".new"
	os.Remove(tmp)
	if err := unix.Mknod(tmp, unix.S_IFBLK|0o600, int(want)); err != nil {
		return "", err
	}
	if err := unix.Stat(tmp, &st); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", err
	}
	s.mu.Lock()
	s.mu.byIno[st.Ino] = devNo{d.Major(), d.Minor()}
	s.mu.Unlock()
	return p, nil
}
