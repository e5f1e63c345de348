package uring

import (
	"sync/atomic"
	"time"
)

// watchdog is the safety net for requests that wait without saying so
// (hints.Waiting): it hands a queue to another thread when the leader's
// inline request has run for longer than after, so that the queue's other
// requests keep flowing. It ticks every after while a request runs, and
// parks after watchdogIdleTicks ticks with none, so an idle daemon burns no
// CPU; a leader that starts a request while it is parked wakes it (busy).
type watchdog struct {
	s      *Server
	after  int64 // ns
	parked atomic.Bool
	wakeCh chan struct{}
	stop   chan struct{}
}

// watchdogIdleTicks is how many idle ticks the watchdog waits before parking.
const watchdogIdleTicks = 100

func newWatchdog(s *Server, after int64) *watchdog {
	return &watchdog{s: s, after: after, wakeCh: make(chan struct{}, 1), stop: make(chan struct{})}
}

// check takes over every queue whose inline request started more than
// after ago by the server's clock, and reports whether any queue was
// running an inline request.
func (w *watchdog) check() bool {
	now := w.s.clock.Nanotime()
	busy := false
	for _, q := range w.s.queues {
		seq := q.cur.Load()
		if seq == 0 {
			continue
		}
		busy = true
		start := q.curStart.Load()
		// The leader stores the start before the sequence number and
		// clears the number before it stores the next start: if the
		// number is still seq, start is seq's.
		if q.cur.Load() != seq || now-start <= w.after {
			continue
		}
		if q.giveUp(seq) {
			q.takenOver.Add(1)
		}
	}
	return busy
}

// run ticks until close.
func (w *watchdog) run() {
	t := time.NewTicker(time.Duration(w.after))
	defer t.Stop()
	idle := 0
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		if w.check() {
			idle = 0
			continue
		}
		if idle++; idle < watchdogIdleTicks {
			continue
		}
		// Park. A leader stores its request's sequence number before it
		// checks parked, and this stores parked before it checks the
		// queues again, so one of the two sees the other.
		w.parked.Store(true)
		busy := false
		for _, q := range w.s.queues {
			busy = busy || q.cur.Load() != 0
		}
		if !busy {
			select {
			case <-w.stop:
				return
			case <-w.wakeCh:
			}
		}
		w.parked.Store(false)
		idle = 0
	}
}

// busy wakes a parked watchdog; the leader calls it after storing the
// sequence number of an inline request.
func (w *watchdog) busy() {
	if w.parked.Load() {
		select {
		case w.wakeCh <- struct{}{}:
		default:
		}
	}
}

// close stops run.
func (w *watchdog) close() { close(w.stop) }
