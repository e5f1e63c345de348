package delay

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dmfuse/dmfuse/internal/clock"
	"golang.org/x/sys/unix"
)

// SpinWindow is how long before a deadline the real clock stops sleeping in
// ppoll and spins on the monotonic clock instead: a ppoll with a timer slack
// of 1 ns may still wake up late, on a virtual machine by tens of
// microseconds, and the spin covers that (BenchmarkAccuracy).
const SpinWindow = 60 * time.Microsecond

// EarlyWake is how early the real clock releases a request before its
// deadline (Lead): waking a parked goroutine on another CPU takes time
// (BenchmarkWakeup); released this much earlier, the request's goroutine is
// usually running by its deadline and spins the rest of the way on the
// monotonic clock, so the release is exact.
const EarlyWake = 100 * time.Microsecond

// MaxSleep caps one ppoll in the last NapWindow before the spin. Long sleeps
// let a vCPU idle deeply and end late by far more than short ones; short
// naps keep each wake-up short enough for SpinWindow to absorb it
// (BenchmarkAccuracy).
const MaxSleep = 100 * time.Microsecond

// NapWindow is how long before the spin the real clock sleeps in naps of
// MaxSleep. Further from it, one ppoll sleeps until NapWindow before the
// spin: a long wait costs a few wake-ups instead of one per MaxSleep, which a
// busy machine pays for in context switches, while the vCPU is awake again
// and napping well before the deadline. Only a long sleep that ends more than
// NapWindow late makes a release late.
const NapWindow = 300 * time.Microsecond

// Linger is how long the real clock keeps polling for new requests in short
// naps after the queue empties, before it sleeps without a deadline. A
// request that arrives meanwhile (the next one of a queue-depth-1 stream comes
// one FUSE round trip later) is seen within microseconds instead of a full
// thread wake-up, which matters for delays below 0.1 ms. The naps leave the
// CPU to other threads.
const Linger = 200 * time.Microsecond

// LingerBelow is the delay below which a released request makes the real
// clock linger (Linger) when nothing else is queued. The next request of a
// longer delay is released at least LingerBelow - EarlyWake - SpinWindow
// after it arrives, more than waking the scheduler's thread takes, while the
// naps of a linger, each a timer interrupt, compete for the CPUs with the
// released request's spin, its reply and the application: a linger after
// every release costs IOPS at 1 ms (BenchmarkQD1CPU).
const LingerBelow = 500 * time.Microsecond

// nap is the timeout of one ppoll while lingering or yielding.
const nap = time.Microsecond

// RealClock is the monotonic clock of the process. Wait sleeps in ppoll(2) on
// an eventfd with a nanosecond timeout until SpinWindow before the deadline,
// then spins; Wake writes the eventfd. Its Wait should run on a thread whose
// timer slack is 1 ns (the scheduler goroutine sets it).
type RealClock struct {
	fd      int
	pending atomic.Bool    // a Wake is in the eventfd and not yet consumed
	fds     [1]unix.PollFd // used by the waiting goroutine only
	ts      unix.Timespec  // Sleep's timeout, the waiting goroutine's
}

// NewRealClock returns a real clock with its own eventfd.
func NewRealClock() (*RealClock, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("delay: eventfd: %w", err)
	}
	c := &RealClock{fd: fd}
	c.fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	return c, nil
}

// Close closes the clock's eventfd. Nothing may use the clock after.
func (c *RealClock) Close() error { return unix.Close(c.fd) }

// Nanotime implements Clock: clock.Now.
func (c *RealClock) Nanotime() int64 { return clock.Now() }

// Wake implements Clock. Only the first Wake after a Wait writes the eventfd.
func (c *RealClock) Wake() {
	if c.pending.CompareAndSwap(false, true) {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(c.fd, one[:])
	}
}

// Lead implements Clock: EarlyWake.
func (c *RealClock) Lead() int64 { return int64(EarlyWake) }

// Yield implements Clock: one short ppoll that gives the CPU away.
func (c *RealClock) Yield() {
	ts := unix.NsecToTimespec(int64(nap))
	_, _ = unix.Ppoll(c.fds[:], &ts, nil) // a readable eventfd is left for Wait
}

// Wait implements Clock.
func (c *RealClock) Wait(deadline int64) {
	if deadline == Forever {
		end := c.Nanotime() + int64(Linger)
		ts := unix.NsecToTimespec(int64(nap))
		for c.Nanotime() < end {
			if n, _ := unix.Ppoll(c.fds[:], &ts, nil); n > 0 {
				c.consume()
				return
			}
		}
		for {
			n, err := unix.Ppoll(c.fds[:], nil, nil)
			if n > 0 || (err != nil && err != unix.EINTR) {
				c.consume()
				return
			}
		}
	}
	spin := int64(SpinWindow)
	for {
		rem := deadline - c.Nanotime()
		if rem <= spin {
			break
		}
		ts := unix.NsecToTimespec(napFor(rem - spin))
		n, err := unix.Ppoll(c.fds[:], &ts, nil)
		if n > 0 {
			c.consume()
			return
		}
		if err != nil && err != unix.EINTR {
			break
		}
	}
	for c.Nanotime() < deadline {
		if c.pending.Load() {
			return // the next Wait finds the eventfd readable and consumes it
		}
	}
}

// Sleep implements Sleeper: one ppoll until the deadline (timer slack 1 ns;
// none for Forever), ended early by Wake, with no spin and no linger.
func (c *RealClock) Sleep(deadline int64) {
	for {
		timeout := &c.ts
		if deadline == Forever {
			timeout = nil
		} else {
			rem := deadline - c.Nanotime()
			if rem <= 0 {
				return
			}
			c.ts = unix.NsecToTimespec(rem)
		}
		n, err := unix.Ppoll(c.fds[:], timeout, nil)
		if n > 0 {
			c.consume()
			return
		}
		if err != nil && err != unix.EINTR {
			return
		}
	}
}

// napFor returns how long to sleep in one ppoll when the spin starts rem
// nanoseconds from now: up to NapWindow before it in one sleep, then in
// naps of at most MaxSleep.
func napFor(rem int64) int64 {
	if rem > int64(NapWindow) {
		return rem - int64(NapWindow)
	}
	return min(rem, int64(MaxSleep))
}

// consume drains the eventfd, then clears pending. In this order a Wake that
// races with it is either drained or writes again; the scheduler rechecks its
// state after every Wait, so neither is lost.
func (c *RealClock) consume() {
	var b [8]byte
	_, _ = unix.Read(c.fd, b[:])
	c.pending.Store(false)
}

// setTimerSlack sets the calling thread's timer slack to 1 ns, so that its
// ppoll timeouts are not rounded up by the default 50 us.
func setTimerSlack() {
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
}
