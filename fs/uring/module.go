// Package uring serves a FUSE connection through FUSE-over-io_uring queues
// (Linux 6.14 and later) instead of read(2) and write(2) on /dev/fuse.
//
// The kernel keeps one queue per possible CPU and sends a request to the
// queue of the CPU it was issued on. Each queue here is one io_uring ring
// with Depth registered entries (a header buffer and a payload buffer each),
// served by a thread locked to the queue's CPU. FUSE_INIT, FORGET,
// BATCH_FORGET and INTERRUPT still arrive on /dev/fuse, and notifications are
// written there. go-fuse answers FUSE_INIT and writes notifications; once the
// rings serve, Server.ServeDev reads /dev/fuse in place of go-fuse's loop:
// it passes FORGETs to the same fuse.RawFileSystem that answers every other
// request, and routes each INTERRUPT to the ring request it names, closing
// that request's cancel channel (go-fuse's loop knows only its own requests
// and would lose it). An interrupt that overtakes its request (the queue had
// not reaped it yet) is kept until the request starts. With
// Config.Interruptible the request's context (Server.Context) ends too, so a
// request waiting in the stack stops waiting; otherwise only the channel
// closes.
//
// A queue's thread answers a request inline, which is the fast path: one
// io_uring_enter both commits the previous reply and waits for the next
// request. A request that is going to wait (a delay target, a suspended
// device, multipath without a path, a block device below) must not stall
// the other requests of its CPU: the device I/O runs with the context
// Server.Context returns, whose hints.Waiter hands the ring to a standby
// thread the moment the stack calls hints.Waiting; the thread that runs the
// waiting request puts its reply on the queue's list of finished entries
// when it is done, and the queue's current thread commits it. Every request
// starts inline, so a fast request of a node whose last request waited
// (multipath over a fast and a slow path) costs no hand-off. A watchdog
// does the same for a request that held the thread for 1 ms without saying
// it waits.
// A waiting request that says when it will complete (hints.Expecting), alone
// on its queue, lets the queue's thread sleep with a timeout that ends
// Config.ExpectMargin before then and spin for the reply, so that it need
// not be woken from another CPU.
//
// Files: ring.go (the ring interface and the kernel's ring), queue.go (a
// queue, its thread hand-off and its polling), watchdog.go, dispatch.go (an
// entry and the requests it serves), server.go (the Server, its contexts and
// interrupts), dev.go (the /dev/fuse side).
package uring

import (
	"errors"
	"os"
	"strings"
)

// ModuleParam is the fuse module parameter that lets the kernel offer
// FUSE_OVER_IO_URING in FUSE_INIT.
const ModuleParam = "/sys/module/fuse/parameters/enable_uring"

// Available returns nil if new FUSE connections will be offered io_uring,
// and otherwise why not.
func Available() error {
	b, err := os.ReadFile(ModuleParam)
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("the kernel has no FUSE over io_uring (needs Linux 6.14 with CONFIG_FUSE_IO_URING)")
	}
	if err != nil {
		return err
	}
	if v := strings.TrimSpace(string(b)); v != "Y" && v != "1" {
		return errors.New(ModuleParam + " is " + v)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil {
		if v := strings.TrimSpace(string(b)); v == "2" || (v == "1" && os.Geteuid() != 0) {
			return errors.New("io_uring is disabled (/proc/sys/kernel/io_uring_disabled is " + v + ")")
		}
	}
	return nil
}

// Enable switches the fuse module parameter on (root only). Connections
// made before keep /dev/fuse.
func Enable() error {
	if err := Available(); err == nil {
		return nil
	}
	return os.WriteFile(ModuleParam, []byte("Y"), 0)
}
