package uring

import "sync/atomic"

// offloader runs large requests (Config.OffloadBytes) off the queues'
// threads, on goroutines that outlive them. A goroutine of its own per
// request grew its stack through the request's dispatch every time: at
// 1 MiB reads, runtime.newstack and newproc took 5% of the daemon's CPU. A
// worker keeps its stack, and waits for the next request until the server
// ends; there are at most as many workers as requests were ever offloaded
// at once, so at most the queues' entries.
type offloader struct {
	ch chan *entry // unbuffered: a send succeeds only to an idle worker
	// workers counts the live workers, idle those waiting for a request.
	workers, idle atomic.Int32
}

func newOffloader() *offloader { return &offloader{ch: make(chan *entry)} }

// run runs e's request on an idle worker, or on a new one if none is idle.
func (o *offloader) run(e *entry) {
	select {
	case o.ch <- e:
	default:
		o.workers.Add(1)
		go o.work(e)
	}
}

// work runs e's request, then every request an idle worker is handed,
// until close.
func (o *offloader) work(e *entry) {
	defer o.workers.Add(-1)
	for ok := true; ok; {
		e.runOffloaded()
		o.idle.Add(1)
		e, ok = <-o.ch
		o.idle.Add(-1)
	}
}

// close ends the idle workers. No request may be offloaded after it: the
// server calls it once every queue's thread has ended.
func (o *offloader) close() { close(o.ch) }
