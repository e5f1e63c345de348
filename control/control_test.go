package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
)

// ctlEnv is a manager with a control server over two backing files.
type ctlEnv struct {
	t   *testing.T
	dir string
	mgr *stack.Manager
	srv *Server
	// core answers the manager's core messages, if set.
	core func(d *stack.Device, args []string) (string, error)
}

func newCtlEnv(t *testing.T) *ctlEnv {
	t.Helper()
	dir := t.TempDir()
	for _, n := range []string{"a.img", "b.img"} {
		if err := os.WriteFile(filepath.Join(dir, n), make([]byte, 4096*stack.SectorSize), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped, stack.Zero, stack.Error, stack.Dust)
	if err != nil {
		t.Fatal(err)
	}
	e := &ctlEnv{t: t, dir: dir}
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, CoreMessage: func(d *stack.Device, args []string) (string, error) {
		if e.core == nil {
			return "", stack.Errorf("Unsupported message sent to DM core")
		}
		return e.core(d, args)
	}})
	e.mgr, e.srv = m, NewServer(context.Background(), m)
	t.Cleanup(func() { e.srv.Close(); m.Close() })
	return e
}

// do runs one request; it fails the test if the request is invalid.
func (e *ctlEnv) do(r Request) *Response {
	e.t.Helper()
	if r.Table != "" && r.Dir == "" {
		r.Dir = e.dir
	}
	return e.srv.Handle(context.Background(), &r)
}

// ok runs a request that must succeed and returns its output.
func (e *ctlEnv) ok(r Request) string {
	e.t.Helper()
	resp := e.do(r)
	if resp.Error != "" {
		e.t.Fatalf("%+v: %s (%s)", r, resp.Error, resp.Errno)
	}
	return resp.Output
}

// state prints everything a client can see, to compare before and after a
// failed command.
func (e *ctlEnv) state() string {
	var b strings.Builder
	for _, op := range []Request{{Op: OpList}, {Op: OpTable}, {Op: OpTable, Inactive: true}, {Op: OpStatus}, {Op: OpInfo}} {
		b.WriteString(e.ok(op))
	}
	return b.String()
}

func TestControlLifecycle(t *testing.T) {
	e := newCtlEnv(t)
	info := func(name string) string { return e.ok(Request{Op: OpInfo, Name: name}) }
	has := func(s string, subs ...string) {
		t.Helper()
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				t.Errorf("output lacks %q:\n%s", sub, s)
			}
		}
	}
	e.ok(Request{Op: OpCreate, Name: "d1", NoTable: true})
	has(info("d1"), "State:             ACTIVE\n", "Tables present:    None\n", "Number of targets: 0\n")
	e.ok(Request{Op: OpLoad, Name: "d1", Table: "0 2048 zero"})
	has(info("d1"), "Tables present:    INACTIVE\n")
	if got := e.ok(Request{Op: OpTable, Name: "d1"}); got != "\n" {
		t.Errorf("table of a device without a live table: %q", got)
	}
	if got := e.ok(Request{Op: OpTable, Name: "d1", Inactive: true}); got != "0 2048 zero \n" {
		t.Errorf("table --inactive: %q", got)
	}
	e.ok(Request{Op: OpResume, Name: "d1"})
	has(info("d1"), "Tables present:    LIVE\n")
	d := e.mgr.Lookup("d1")
	if d.Size() != 2048*stack.SectorSize {
		t.Errorf("size %d", d.Size())
	}
	e.ok(Request{Op: OpLoad, Name: "d1", Table: "0 4096 zero"})
	has(info("d1"), "Tables present:    LIVE & INACTIVE\n")
	if d.Size() != 2048*stack.SectorSize {
		t.Errorf("load changed the live size to %d", d.Size())
	}
	e.ok(Request{Op: OpClear, Name: "d1"})
	has(info("d1"), "Tables present:    LIVE\n")
	e.ok(Request{Op: OpSuspend, Name: "d1"})
	e.ok(Request{Op: OpSuspend, Name: "d1"})
	has(info("d1"), "State:             SUSPENDED\n")
	e.ok(Request{Op: OpResume, Name: "d1"})
	has(info("d1"), "State:             ACTIVE\n")

	e.ok(Request{Op: OpCreate, Name: "d2", NoTable: true})
	e.ok(Request{Op: OpSuspend, Name: "d2"})
	if r := e.do(Request{Op: OpResume, Name: "d2"}); r.Errno != "EINVAL" {
		t.Errorf("resume of a suspended device without a table: %+v", r)
	}
	for _, c := range []struct {
		sector uint64
		want   string
	}{{0, "d1: zero: Target type does not support messages"}, {4096, "d1: Target message sector outside device"}} {
		if r := e.do(Request{Op: OpMessage, Name: "d1", Sector: c.sector, Args: []string{"foo"}}); r.Error != c.want || r.Errno != "EINVAL" {
			t.Errorf("message at %d: %+v, want %q", c.sector, r, c.want)
		}
	}

	// A reload that changes the size tells the fs layer.
	var changed []string
	e.mgr.Subscribe(stack.Listener{OnChange: func(d *stack.Device) { changed = append(changed, d.Name()) }})
	e.ok(Request{Op: OpLoad, Name: "d1", Table: "0 4096 zero"})
	e.ok(Request{Op: OpResume, Name: "d1"})
	if d.Size() != 4096*stack.SectorSize || len(changed) != 1 {
		t.Errorf("after reload: size %d, fs told %v", d.Size(), changed)
	}
	if d.EventNr() != 0 {
		t.Errorf("load and resume raised the event counter to %d", d.EventNr())
	}
	// Rename raises the event counter and tells fs (old name, then new).
	changed = nil
	e.ok(Request{Op: OpRename, Name: "d1", NewName: "e1"})
	if d.EventNr() != 1 || !reflect.DeepEqual(changed, []string{"d1", "e1"}) || e.mgr.Lookup("d1") != nil || e.mgr.Lookup("e1") != d {
		t.Errorf("rename: event %d, fs told %v", d.EventNr(), changed)
	}
	e.ok(Request{Op: OpRename, Name: "e1", UUID: "u-1"})
	has(info("e1"), "UUID: u-1\n", "Event number:      2\n")
	var removed []string
	e.mgr.Subscribe(stack.Listener{OnRemove: func(d *stack.Device) { removed = append(removed, d.Name()) }})
	e.ok(Request{Op: OpRemove, Name: "e1"})
	if !reflect.DeepEqual(removed, []string{"e1"}) || d.EventNr() != 3 {
		t.Errorf("remove: fs told %v, event %d", removed, d.EventNr())
	}
	if got := e.ok(Request{Op: OpList}); got != "d2\t(240:1)\n" {
		t.Errorf("ls: %q", got)
	}
}

func TestControlMessages(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "m", Table: "0 1024 zero\n1024 1024 dust ./a.img 0 512"})
	if got := e.ok(Request{Op: OpMessage, Name: "m", Sector: 1500, Args: []string{"addbadblock", "60"}}); got != "" {
		t.Errorf("addbadblock printed %q", got)
	}
	if got := e.ok(Request{Op: OpMessage, Name: "m", Sector: 1024, Args: []string{"countbadblocks"}}); got != "countbadblocks: 1 badblock(s) found\n" {
		t.Errorf("countbadblocks: %q", got)
	}
	// Words are joined and split again as the kernel does.
	if got := e.ok(Request{Op: OpMessage, Name: "m", Sector: 2047, Args: []string{"queryblock 60"}}); got != "dust_query_block: block 60 found in badblocklist\n" {
		t.Errorf("queryblock: %q", got)
	}
	if r := e.do(Request{Op: OpMessage, Name: "m", Sector: 1024, Args: []string{"addbadblock", "60"}}); r.Errno != "EINVAL" || !strings.HasPrefix(r.Error, "m: dust: ") {
		t.Errorf("duplicate bad block: %+v", r)
	}
	if r := e.do(Request{Op: OpMessage, Name: "m", Sector: 10, Args: []string{"addbadblock", "1"}}); r.Error != "m: zero: Target type does not support messages" {
		t.Errorf("message to zero: %+v", r)
	}
	if r := e.do(Request{Op: OpMessage, Name: "m", Args: []string{"@stats_list"}}); r.Error != "m: Unsupported message sent to DM core" || r.Errno != "EINVAL" {
		t.Errorf("core message without a handler: %+v", r)
	}
	if r := e.do(Request{Op: OpMessage, Name: "m", Args: []string{" "}}); r.Error != "m: Empty message received" {
		t.Errorf("blank message: %+v", r)
	}
	// Without a live table (none, or only an inactive one) a message goes
	// nowhere and succeeds silently, as dm's target_message.
	e.ok(Request{Op: OpCreate, Name: "nt", NoTable: true})
	for _, load := range []string{"", "0 1024 dust ./a.img 0 512"} {
		if load != "" {
			e.ok(Request{Op: OpLoad, Name: "nt", Table: load})
		}
		if r := e.do(Request{Op: OpMessage, Name: "nt", Args: []string{"addbadblock", "1"}}); *r != (Response{}) {
			t.Errorf("message to a device without a live table (inactive table %q): %+v", load, r)
		}
	}
	e.ok(Request{Op: OpResume, Name: "nt"})
	if got := e.ok(Request{Op: OpMessage, Name: "nt", Args: []string{"countbadblocks"}}); got != "countbadblocks: 0 badblock(s) found\n" {
		t.Errorf("the inactive table took a message: after resume, %q", got)
	}
	var got []string
	e.core = func(d *stack.Device, args []string) (string, error) {
		got = append([]string{d.Name()}, args...)
		return "0", nil
	}
	if out := e.ok(Request{Op: OpMessage, Name: "m", Args: []string{"@stats_create", "-", "/1"}}); out != "0\n" ||
		!reflect.DeepEqual(got, []string{"m", "@stats_create", "-", "/1"}) {
		t.Errorf("core message: %q, handler saw %q", out, got)
	}
}

func TestControlBadInputChangesNothing(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "base", UUID: "u-base", Table: "0 4096 linear ./a.img 0"})
	e.ok(Request{Op: OpCreate, Name: "top", Table: "0 1024 linear base 0"})
	e.ok(Request{Op: OpCreate, Name: "nt", NoTable: true})
	e.ok(Request{Op: OpLoad, Name: "top", Table: "0 2048 zero"})
	cases := []struct {
		req        Request
		err, errno string
	}{
		{Request{Op: OpCreate, Name: "base", NoTable: true}, "base: device already exists", "EBUSY"},
		{Request{Op: OpCreate, Name: "x", UUID: "u-base", NoTable: true}, "x: uuid u-base already in use", "EBUSY"},
		{Request{Op: OpCreate, Name: "stats", NoTable: true}, `device name "stats": reserved`, "EINVAL"},
		{Request{Op: OpCreate, Name: "a/b", NoTable: true}, `device name "a/b": must not contain '/', whitespace, ',', ';' or ':'`, "EINVAL"},
		{Request{Op: OpCreate, Name: strings.Repeat("n", 128), NoTable: true}, `device name "` + strings.Repeat("n", 128) + `": longer than 127 bytes`, "EINVAL"},
		{Request{Op: OpCreate, Name: "x", Table: "0 8 zero\n9 8 zero"}, "x: line 2: zero: Gap in table", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", Table: "0 8 foo"}, "x: line 1: foo: unknown target type", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", Table: "0 8 zero\n8 8 linear ./missing.img 0"}, "x: line 2: linear: Device lookup failed: ./missing.img: no such file or directory", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", Table: "0 8192 linear ./a.img 0"}, "~a.img too small for target: start=0, len=8192, dev_size=4096", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", Table: "0 8 linear nt 0"}, "x: line 1: linear: Device lookup failed: nt has no live table", "EINVAL"},
		{Request{Op: OpCreate, Name: "x"}, "x: no table given (use --notable for a device without one)", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", NoTable: true, Table: "0 8 zero"}, "x: --notable and a table exclude each other", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", NoTable: true, UUID: strings.Repeat("u", 129)}, "x: uuid longer than 128 bytes", "EINVAL"},
		{Request{Op: OpLoad, Name: "nope", Table: "0 8 zero"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpLoad, Name: "top", Table: "0 8 linear ./a.img"}, "top: line 1: linear: Invalid argument count", "EINVAL"},
		{Request{Op: OpLoad, Name: "base", Table: "0 8 linear top 0"}, "base: line 1: linear: top already stacks on base: a loop", "EINVAL"},
		{Request{Op: OpLoad, Name: "base", Table: "0 8 linear base 0"}, "base: line 1: linear: table may not reference the device itself", "EINVAL"},
		{Request{Op: OpLoad, Name: "top", Table: "0 8 zero", Dir: "relative"}, "load: working directory \"relative\" is not absolute", "EINVAL"},
		{Request{Op: OpClear, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpSuspend, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpResume, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpRemove, Name: "base"}, "base: device is in use by another table", "EBUSY"},
		{Request{Op: OpRemove, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpRename, Name: "top", NewName: "base"}, "top: device base already exists", "EBUSY"},
		{Request{Op: OpRename, Name: "top", NewName: "a,b"}, `top: device name "a,b": must not contain '/', whitespace, ',', ';' or ':'`, "EINVAL"},
		{Request{Op: OpRename, Name: "base", UUID: "other"}, "base: uuid already set to u-base; it cannot be changed", "EINVAL"},
		{Request{Op: OpRename, Name: "top", UUID: "u-base"}, "top: uuid u-base already in use", "EBUSY"},
		{Request{Op: OpRename, Name: "top"}, "top: rename needs a new name or a uuid", "EINVAL"},
		{Request{Op: OpRename, Name: "top", NewName: "x", UUID: "u"}, "top: rename takes a new name or a uuid, not both", "EINVAL"},
		{Request{Op: OpRename, Name: "top", UUID: strings.Repeat("u", 129)}, "top: uuid longer than 128 bytes", "EINVAL"},
		{Request{Op: OpMessage, Name: "top"}, "top: Empty message received", "EINVAL"},
		{Request{Op: OpMessage, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpMessage, Name: "top", Sector: 1 << 63, Args: []string{"x"}}, "top: Target message sector outside device", "EINVAL"},
		{Request{Op: OpTable, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: OpInfo, Name: "nope"}, "nope: no such device", "ENXIO"},
		{Request{Op: "frobnicate"}, `unknown operation "frobnicate"`, "EINVAL"},
		{Request{Op: OpSuspend, Name: "top", Force: true}, `suspend: field "force" does not apply`, "EINVAL"},
		{Request{Op: OpList, Name: "top"}, `ls: field "name" does not apply`, "EINVAL"},
		{Request{Op: OpResume}, "resume: no device name", "EINVAL"},
		{Request{Op: OpCreate, Name: "x", Table: "0 8 zero", Dir: "/\xff"}, "create: text is not valid UTF-8", "EINVAL"},
	}
	for _, c := range cases {
		before := e.state()
		r := e.do(c.req)
		match := r.Error == c.err
		if sub, ok := strings.CutPrefix(c.err, "~"); ok {
			match = strings.Contains(r.Error, sub)
		}
		if r.Error == "" || !match || r.Errno != c.errno {
			t.Errorf("%+v:\n got %q (%s)\nwant %q (%s)", c.req, r.Error, r.Errno, c.err, c.errno)
		}
		if strings.Contains(r.Error, "\n") {
			t.Errorf("%+v: error of more than one line: %q", c.req, r.Error)
		}
		if after := e.state(); after != before {
			t.Errorf("%+v changed the state:\n%s\nto\n%s", c.req, before, after)
		}
	}
	// A failed load keeps the older inactive table.
	if got := e.ok(Request{Op: OpTable, Name: "top", Inactive: true}); got != "0 2048 zero \n" {
		t.Errorf("inactive table after failed loads: %q", got)
	}
}

func TestControlForceRemove(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "f", Table: "0 2048 linear ./a.img 0"})
	d := e.mgr.Lookup("f")
	d.AddOpen(1)
	if r := e.do(Request{Op: OpRemove, Name: "f"}); r.Errno != "EBUSY" || r.Error != "f: device is open" {
		t.Errorf("remove of an open device: %+v", r)
	}
	if got := e.ok(Request{Op: OpTable, Name: "f"}); got != "0 2048 linear "+filepath.Join(e.dir, "a.img")+" 0\n" {
		t.Errorf("plain remove changed the table: %q", got)
	}
	if r := e.do(Request{Op: OpRemove, Name: "f", Force: true}); r.Errno != "EBUSY" {
		t.Errorf("forced remove of an open device: %+v", r)
	}
	if got := e.ok(Request{Op: OpTable, Name: "f"}); got != "0 2048 error \n" {
		t.Errorf("after remove --force of an open device the table is %q, want the error table", got)
	}
	if _, err := d.WriteAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("write after remove --force: %v, want EIO", err)
	}
	d.AddOpen(-1)
	e.ok(Request{Op: OpRemove, Name: "f", Force: true})
	if e.mgr.Lookup("f") != nil {
		t.Error("device still there")
	}
	if _, err := d.ReadAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, syscall.ENXIO) {
		t.Errorf("read of a removed device: %v, want ENXIO", err)
	}
}

// TestControlConcurrent runs control commands on one device from several
// goroutines while I/O runs on it: every command succeeds, every I/O
// succeeds and reads back what was written.
func TestControlConcurrent(t *testing.T) {
	e := newCtlEnv(t)
	e.ok(Request{Op: OpCreate, Name: "c", Table: "0 4096 linear ./a.img 0"})
	d := e.mgr.Lookup("c")
	tables := []string{"0 4096 linear ./a.img 0", "0 1000 linear ./a.img 0\n1000 3000 linear ./a.img 1000\n4000 96 linear ./a.img 4000"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf, back := make([]byte, 4096), make([]byte, 4096)
			for i := 0; ctx.Err() == nil; i++ {
				off := int64((i*2+g)%512) * 4096
				for j := range buf {
					buf[j] = byte(i + g + j)
				}
				if _, err := d.WriteAt(ctx, buf, off); err != nil {
					errs <- err
					return
				}
				if _, err := d.ReadAt(ctx, back, off); err != nil {
					errs <- err
					return
				}
				if string(back) != string(buf) {
					errs <- fmt.Errorf("block at %d reads back different data", off)
					return
				}
			}
		}(g)
	}
	var cw sync.WaitGroup
	for g := 0; g < 4; g++ {
		cw.Add(1)
		go func(g int) {
			defer cw.Done()
			for i := 0; i < 25; i++ {
				reqs := []Request{{Op: OpLoad, Name: "c", Table: tables[(i+g)%2], Dir: e.dir}, {Op: OpResume, Name: "c"},
					{Op: OpInfo, Name: "c"}, {Op: OpStatus}, {Op: OpSuspend, Name: "c"}, {Op: OpResume, Name: "c"}}
				for _, r := range reqs {
					if resp := e.srv.Handle(ctx, &r); resp.Error != "" {
						errs <- fmt.Errorf("%+v: %s", r, resp.Error)
					}
				}
			}
		}(g)
	}
	cw.Wait()
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}
	in := d.Info(false)
	if in.Suspended || in.Inactive || in.EventNr != 0 || in.OpenCount != 0 {
		t.Errorf("final state %+v", in)
	}
}

// TestControlReadAhead: create and resume set the read-ahead as dmsetup's
// --readahead does (sectors rounded down to pages; +N only raising it; none;
// auto leaving it); a bad value is refused before anything changes.
func TestControlReadAhead(t *testing.T) {
	e := newCtlEnv(t)
	ra := func() string {
		t.Helper()
		out := e.ok(Request{Op: OpInfo, Name: "r"})
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "Read Ahead:") {
				return strings.TrimSpace(strings.TrimPrefix(l, "Read Ahead:"))
			}
		}
		t.Fatalf("no read-ahead in\n%s", out)
		return ""
	}
	e.ok(Request{Op: OpCreate, Name: "r", Table: "0 8 zero", ReadAhead: "1001"})
	for _, step := range []struct{ ra, want string }{
		{"", "1000"}, {"+512", "1000"}, {"+2048", "2048"}, {"auto", "2048"}, {"-1", "2048"}, {"none", "0"}, {"4096", "4096"},
	} {
		e.ok(Request{Op: OpSuspend, Name: "r"})
		e.ok(Request{Op: OpResume, Name: "r", ReadAhead: step.ra})
		if got := ra(); got != step.want {
			t.Errorf("resume --readahead %q: read-ahead %s, want %s", step.ra, got, step.want)
		}
	}
	if r := e.do(Request{Op: OpResume, Name: "r", ReadAhead: "+lots"}); r.Errno != "EINVAL" || !strings.Contains(r.Error, `read-ahead "+lots"`) {
		t.Errorf("a bad read-ahead: %+v", r)
	}
	if r := e.do(Request{Op: OpLoad, Name: "r", Table: "0 8 zero", ReadAhead: "8"}); r.Errno != "EINVAL" {
		t.Errorf("read-ahead on load: %+v", r)
	}
	if got := ra(); got != "4096" {
		t.Errorf("after refused requests: %s", got)
	}
}

func TestEscapePath(t *testing.T) {
	for in, want := range map[string]string{
		"/":             "-",
		"/tmp/dm":       "tmp-dm",
		"/tmp//dm/":     "tmp-dm",
		"/tmp/my-dm":    `tmp-my\x2ddm`,
		"/.hidden/a.b":  `\x2ehidden-a.b`,
		"/a b/ü":        `a\x20b-\xc3\xbc`,
		"/x:y/_z":       "x:y-_z",
		"/mnt/dm\\disk": `mnt-dm\x5cdisk`,
	} {
		if got := EscapePath(in); got != want {
			t.Errorf("EscapePath(%q) = %q, want %q", in, got, want)
		}
	}
	p, err := DefaultPath("/" + strings.Repeat("x", 200))
	if err != nil || len(p) > maxSocketPath || !strings.HasPrefix(filepath.Base(p), "h-") {
		t.Errorf("long mount point: %q, %v", p, err)
	}
}

// TestControlSocket checks the socket file and the wire protocol: modes,
// malformed, oversized and incomplete requests, and stale sockets.
func TestControlSocket(t *testing.T) {
	e := newCtlEnv(t)
	dir := filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, "ctl.sock")
	ln, err := Listen(path, true)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()
	for p, mode := range map[string]os.FileMode{dir: os.ModeDir | 0o700, path: os.ModeSocket | 0o600} {
		if st, err := os.Stat(p); err != nil || st.Mode() != mode {
			t.Errorf("%s: mode %v (%v), want %v", p, st.Mode(), err, mode)
		}
	}
	if _, err := Listen(path, true); err == nil || !strings.Contains(err.Error(), "in use by a running dmfuse daemon") {
		t.Errorf("second listener on a live socket: %v", err)
	}
	raw := func(data string, closeWrite bool) string {
		t.Helper()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			c.Write([]byte(data))
			if closeWrite {
				c.(*net.UnixConn).CloseWrite()
			}
		}()
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	for data, want := range map[string]string{
		"not json\n":                     `{"error":"malformed request: invalid character 'o' in literal null (expecting 'u')","errno":"EINVAL"}` + "\n",
		`{"op":"ls","bogus":1}` + "\n":   `{"error":"malformed request: json: unknown field \"bogus\"","errno":"EINVAL"}` + "\n",
		`{"op":"ls"} {"op":"ls"}` + "\n": `{"error":"malformed request: data after the JSON object","errno":"EINVAL"}` + "\n",
		`{"op":"ls"}` + "\n":             `{"output":"No devices found\n"}` + "\n",
		// Well formed but not valid: the server validates what it reads.
		`{"op":"resume"}` + "\n": `{"error":"resume: no device name","errno":"EINVAL"}` + "\n",
	} {
		if got := raw(data, false); got != want {
			t.Errorf("%q: answer %q, want %q", data, got, want)
		}
	}
	// A request without its newline is dropped without effect.
	if got := raw(`{"op":"create","name":"half","notable":true}`, true); got != "" {
		t.Errorf("incomplete request answered %q", got)
	}
	// An oversized request is refused.
	big := `{"op":"create","name":"big","table":"` + strings.Repeat("0", MaxRequestSize) + `"}` + "\n"
	if got := raw(big, true); !strings.Contains(got, "request larger than") {
		t.Errorf("oversized request: %q", got)
	}
	resp, err := Call(path, &Request{Op: OpList})
	if err != nil || resp.Output != "No devices found\n" {
		t.Errorf("after bad requests: %+v, %v", resp, err)
	}
	if err := e.srv.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after close: %v", err)
	}
	if _, err := Call(path, &Request{Op: OpList}); err == nil || !strings.Contains(err.Error(), "no dmfuse daemon answers there") {
		t.Errorf("call without a daemon: %v", err)
	}
	// The client validates before it connects: an invalid request is refused
	// even with no daemon there.
	if resp, err := Call(path, &Request{Op: OpRename, Name: "a", NewName: "b c"}); resp != nil || err == nil ||
		err.Error() != `a: device name "b c": must not contain '/', whitespace, ',', ';' or ':'` {
		t.Errorf("invalid request without a daemon: %+v, %v", resp, err)
	}

	// A socket file left by a daemon that died is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln, err = Listen(path, true)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	ln.Close()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, true); err == nil || !strings.Contains(err.Error(), "exists and is not a socket") {
		t.Errorf("regular file in the socket's place: %v", err)
	}
}

// TestControlStop: stop runs the daemon's stop path with the request's
// force; a refusal is the answer and the server goes on, a stop that
// succeeds closes the listener; without a stop path, stop fails.
func TestControlStop(t *testing.T) {
	e := newCtlEnv(t)
	if r := e.do(Request{Op: OpStop}); r.Error == "" {
		t.Errorf("stop without a stop path: %+v", r)
	}
	sock := filepath.Join(t.TempDir(), "c.sock")
	ln, err := Listen(sock, true)
	if err != nil {
		t.Fatal(err)
	}
	var forced []bool
	refuse := true
	e.srv.OnStop(func(force bool) error {
		forced = append(forced, force)
		if refuse && !force {
			return &stack.ArgError{Reason: "devices still in use: d", Errno: syscall.EBUSY}
		}
		return nil
	})
	go e.srv.Serve(ln)
	resp, err := Call(sock, &Request{Op: OpStop})
	if err != nil || resp.Error != "devices still in use: d" || resp.Errno != "EBUSY" {
		t.Fatalf("refused stop: %+v, %v", resp, err)
	}
	if resp, err := Call(sock, &Request{Op: OpList}); err != nil || resp.Error != "" {
		t.Fatalf("ls after a refused stop: %+v, %v", resp, err)
	}
	if resp, err := Call(sock, &Request{Op: OpStop, Force: true}); err != nil || resp.Error != "" {
		t.Fatalf("forced stop: %+v, %v", resp, err)
	}
	if _, err := Call(sock, &Request{Op: OpList}); err == nil {
		t.Error("the socket still answers after a stop that succeeded")
	}
	if !reflect.DeepEqual(forced, []bool{false, true}) {
		t.Errorf("stop path called with force %v", forced)
	}
}
