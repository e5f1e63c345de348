package control

import (
	"context"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestControlDeferredRemove drives remove --deferred, the info state it
// shows and @cancel_deferred_remove over the protocol.
func TestControlDeferredRemove(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "d", Table: "0 8 zero"})
	d := e.mgr.Lookup("d")
	d.AddOpen(1)
	if r := e.do(Request{Op: OpRemove, Name: "d"}); r.Errno != "EBUSY" {
		t.Fatalf("remove of an open device: %+v", r)
	}
	e.ok(Request{Op: OpRemove, Name: "d", Deferred: true})
	info := e.ok(Request{Op: OpInfo, Name: "d"})
	for _, want := range []string{"State:             ACTIVE (DEFERRED REMOVE)\n", "Open count:        1\n"} {
		if !strings.Contains(info, want) {
			t.Errorf("info lacks %q:\n%s", want, info)
		}
	}
	if r := e.do(Request{Op: OpMessage, Name: "d", Args: []string{"@cancel_deferred_remove", "now"}}); r.Errno != "EINVAL" {
		t.Errorf("cancel with an argument: %+v", r)
	}
	if out := e.ok(Request{Op: OpMessage, Name: "d", Args: []string{"@cancel_deferred_remove"}}); out != "" {
		t.Errorf("cancel printed %q", out)
	}
	if info := e.ok(Request{Op: OpInfo, Name: "d"}); !strings.Contains(info, "State:             ACTIVE\n") {
		t.Errorf("after cancel:\n%s", info)
	}
	e.ok(Request{Op: OpRemove, Name: "d", Deferred: true})
	d.AddOpen(-1)
	for deadline := time.Now().Add(10 * time.Second); e.mgr.Lookup("d") != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("deferred device not removed after its last close")
		}
	}
}

func TestControlReportDepsConcise(t *testing.T) {
	e := newCtlEnv(t)
	a := filepath.Join(e.dir, "a.img")
	e.ok(Request{Op: OpCreate, Name: "c1", Table: "0 8 zero\n8 8 error", ReadOnly: true})
	e.ok(Request{Op: OpCreate, Name: "c2", UUID: "U,;\\", Table: "0 1 zero"})
	e.ok(Request{Op: OpCreate, Name: "low", Table: "0 64 linear ./a.img 0"})
	e.ok(Request{Op: OpCreate, Name: "top", Table: "0 8 linear ./a.img 0\n8 8 linear low 0\n16 8 linear ./a.img 8"})
	e.ok(Request{Op: OpCreate, Name: "nt", NoTable: true})

	if got, want := e.ok(Request{Op: OpTable, Concise: true, Name: "c1"}), "c1,,0,ro,0 8 zero ,8 8 error \n"; got != want {
		t.Errorf("concise c1: %q, want %q", got, want)
	}
	want := "c1,,0,ro,0 8 zero ,8 8 error ;c2,U\\,\\;\\\\,1,rw,0 1 zero ;low,,2,rw,0 64 linear " + a + " 0;nt,,4,rw;" +
		"top,,3,rw,0 8 linear " + a + " 0,8 8 linear 240:2 0,16 8 linear " + a + " 8\n"
	if got := e.ok(Request{Op: OpTable, Concise: true}); got != want {
		t.Errorf("concise, all:\n got %q\nwant %q", got, want)
	}
	if got := e.ok(Request{Op: OpTable, Target: "error"}); got != "c1: 8 8 error \n" {
		t.Errorf("table --target error: %q", got)
	}
	if got := e.ok(Request{Op: OpStatus, Name: "top", Target: "zero"}); got != "" {
		t.Errorf("status --target with no match: %q", got)
	}

	for format, want := range map[string]string{
		// The kernel's order: the device named first comes last.
		"":           "2 dependencies\t: (240, 2) (" + a + ")\n",
		"devname":    "2 dependencies\t: (low) (" + a + ")\n",
		"blkdevname": "2 dependencies\t: (dm-2) (" + a + ")\n",
	} {
		if got := e.ok(Request{Op: OpDeps, Name: "top", Format: format}); got != want {
			t.Errorf("deps -o %q: %q, want %q", format, got, want)
		}
	}
	if got := e.ok(Request{Op: OpDeps, Name: "nt"}); got != "0 dependencies\t:\n" {
		t.Errorf("deps of a device without a table: %q", got)
	}
	if got := e.ok(Request{Op: OpDeps}); !strings.HasPrefix(got, "c1: 0 dependencies\t:\nc2: 0 dependencies\t:\nlow: 1 dependencies\t: ("+a+")\n") {
		t.Errorf("deps of every device: %q", got)
	}
	if r := e.do(Request{Op: OpDeps, Name: "nope"}); r.Errno != "ENXIO" {
		t.Errorf("deps of a missing device: %+v", r)
	}
	if r := e.do(Request{Op: OpDeps, Format: "bogus"}); r.Errno != "EINVAL" {
		t.Errorf("deps -o bogus: %+v", r)
	}

	devs, err := ParseReport(e.ok(Request{Op: OpReport, Name: "top"}))
	if err != nil {
		t.Fatal(err)
	}
	wantRep := []DeviceReport{{Name: "top", Major: 240, Minor: 3, BlkDevName: "dm-3", Live: true, Targets: 3, ReadAhead: 256,
		Types: []string{"linear", "linear", "linear"},
		Deps:  []DepReport{{Mapped: "low", Major: 240, Minor: 2, BlkDevName: "dm-2"}, {Path: a, BlkDevName: a}}}}
	if !reflect.DeepEqual(devs, wantRep) {
		t.Errorf("report:\n got %+v\nwant %+v", devs, wantRep)
	}
	all, err := ParseReport(e.ok(Request{Op: OpReport}))
	if err != nil || len(all) != 5 || all[1].UUID != "U,;\\" || !all[0].ReadOnly || all[1].Open != 0 || all[2].Open != 1 {
		t.Errorf("report of every device: %+v %v", all, err)
	}

	// remove_all removes what nothing uses, upper devices first.
	e.mgr.Lookup("c2").AddOpen(1)
	e.ok(Request{Op: OpRemoveAll})
	if got := e.ok(Request{Op: OpList}); got != "c2\t(240:1)\n" {
		t.Errorf("after remove_all: %q", got)
	}
	e.mgr.Lookup("c2").AddOpen(-1)
}

func TestControlWait(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "w", Table: "0 8 zero"})
	e.ok(Request{Op: OpWait, Name: "w", EventNr: 3}) // differs: returns at once
	done := make(chan *Response)
	go func() { done <- e.do(Request{Op: OpWait, Name: "w"}) }()
	time.Sleep(10 * time.Millisecond)
	// A target's table event (whether the waiter is waiting yet or not).
	e.mgr.Lookup("w").RaiseEvent()
	if r := <-done; *r != (Response{}) {
		t.Errorf("wait: %+v", r)
	}
	e.ok(Request{Op: OpRename, Name: "w", NewName: "w2"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if r := e.srv.Handle(ctx, &Request{Op: OpWait, Name: "w2", EventNr: 2}); r.Errno != "EINTR" {
		t.Errorf("interrupted wait: %+v", r)
	}
	if r := e.do(Request{Op: OpWait, Name: "nope"}); r.Errno != "ENXIO" {
		t.Errorf("wait on a missing device: %+v", r)
	}
	if r := e.do(Request{Op: OpInfo, Name: "w2", EventNr: 1}); r.Error != `info: field "event_nr" does not apply` {
		t.Errorf("event_nr on info: %+v", r)
	}
}

// TestControlWaitSocket: a wait over the socket ends when the client hangs
// up or the server closes, so a waiting client never holds the daemon.
func TestControlWaitSocket(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "w", Table: "0 8 zero"})
	path := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := Listen(path, true)
	if err != nil {
		t.Fatal(err)
	}
	go e.srv.Serve(ln)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte(`{"op":"wait","name":"w"}` + "\n"))
	time.Sleep(20 * time.Millisecond)
	c.Close()
	answered := make(chan *Response, 1)
	go func() {
		r, _ := Call(path, &Request{Op: OpWait, Name: "w"})
		answered <- r
	}()
	time.Sleep(20 * time.Millisecond)
	closed := make(chan error)
	go func() { closed <- e.srv.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a waiting client")
	}
	if r := <-answered; r == nil || r.Errno != "EINTR" {
		t.Errorf("wait ended by Close: %+v", r)
	}
}
