package dmexec

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control/dmioctl"
)

// ioctl answers a device-mapper ioctl (type 0xfd) on descriptor fd: on a
// control node the supervisor handed out, the interface answers it; on any
// other file (a multipath device's DM_MPATH_PROBE_PATHS) it runs as made.
func (c *call) ioctl(fd int32, cmd uint32, arg uint64) {
	var st unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", c.pid, fd), &st) != nil {
		c.proceed()
		return
	}
	c.s.mu.Lock()
	ctl := c.s.mu.controls[st.Ino]
	c.s.mu.Unlock()
	if ctl == nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		c.proceed()
		return
	}
	cr, err := c.creds()
	if err != nil {
		c.respond(0, unix.ESRCH)
		return
	}
	ctx := c.s.ctx
	if cmd&0xff == dmioctl.CmdDevWait {
		// A wait ends when the caller has a signal to handle (dmeventd
		// wakes its threads so), or goes away.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go c.watch(ctx, cancel)
	}
	errno := c.s.dm.Ioctl(ctx, cmd, mem{c: c, base: arg}, dmioctl.Caller{Admin: cr.capable(unix.CAP_SYS_ADMIN), File: ctl.file})
	if cmd&0xff == dmioctl.CmdDevArmPoll && errno == 0 {
		c.drain(fd, ctl)
	}
	c.respond(0, errno)
}

// drain empties the caller's control pipe after DM_DEV_ARM_POLL: it reads
// ready again at the next global event.
func (c *call) drain(fd int32, ctl *control) {
	r, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", c.pid, fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == nil {
		var b [64]byte
		for {
			if n, err := unix.Read(r, b[:]); n <= 0 || err != nil {
				break
			}
		}
		unix.Close(r)
	}
	c.s.mu.Lock()
	ctl.signaled = false
	c.s.mu.Unlock()
}

// watch cancels a waiting ioctl when its caller has a signal pending that
// it neither blocks nor ignores, or when the call is no longer valid.
func (c *call) watch(ctx context.Context, cancel context.CancelFunc) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !c.valid() || c.signalPending() {
			cancel()
			return
		}
	}
}

// signalPending reports a pending signal the caller's thread would handle.
func (c *call) signalPending() bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.pid))
	if err != nil {
		return true
	}
	defer f.Close()
	var pnd, shd, blk, cgt uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		switch k {
		case "SigPnd":
			pnd = n
		case "ShdPnd":
			shd = n
		case "SigBlk":
			blk = n
		case "SigCgt":
			cgt = n
		}
	}
	return (pnd|shd)&^blk&cgt != 0
}

// signalPolls makes the control pipes readable at each global event, for
// the controls armed before it, until the supervisor's context ends.
func (s *Supervisor) signalPolls() {
	defer s.wg.Done()
	g := s.mgr.GlobalEvent()
	for s.ctx.Err() == nil {
		g = s.mgr.WaitGlobal(s.ctx, g)
		s.mu.Lock()
		for ino, ctl := range s.mu.controls {
			if ctl.signaled || !ctl.file.Ready(g) {
				continue
			}
			if _, err := ctl.w.Write([]byte{1}); err != nil && !isAgain(err) {
				// The caller closed its end.
				ctl.w.Close()
				delete(s.mu.controls, ino)
				continue
			}
			ctl.signaled = true
		}
		s.mu.Unlock()
	}
}

func isAgain(err error) bool {
	pe, ok := err.(*os.PathError)
	return ok && pe.Err == unix.EAGAIN
}
