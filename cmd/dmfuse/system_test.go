package main

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
)

// TestDmsetupReadyNotListening: a daemon that holds its lock but does not
// listen (one starting by hand, or stopping) makes a command wait at most
// startTimeout, whether or not the command holds the start lock itself,
// and the call then fails instead of hanging.
func TestDmsetupReadyNotListening(t *testing.T) {
	old := startTimeout
	startTimeout = 100 * time.Millisecond
	defer func() { startTimeout = old }()
	s := system{t.TempDir()}
	daemon, err := os.OpenFile(s.path("daemon.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer daemon.Close()
	if err := unix.Flock(int(daemon.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if !s.running() {
		t.Fatal("the held daemon lock does not read as a running daemon")
	}
	for _, locked := range []bool{false, true} {
		var lock *os.File
		if locked {
			if lock, err = s.lockStart(); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		go func() {
			c, err := s.ready(locked)
			if err == nil {
				_, err = c.Call(&control.Request{Op: control.OpList})
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("locked %v: a call to a daemon that does not listen succeeded", locked)
			}
		case <-time.After(time.Minute):
			t.Fatalf("locked %v: ready still waits after a minute", locked)
		}
		if lock != nil {
			lock.Close()
		}
	}
}
