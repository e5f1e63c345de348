package dmioctl

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/internal/golden"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// buf is a caller's ioctl argument in memory.
type buf []byte

func (b buf) ReadAt(p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > int64(len(b)) {
		return syscall.EFAULT
	}
	copy(p, b[off:])
	return nil
}

func (b buf) WriteAt(p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > int64(len(b)) {
		return syscall.EFAULT
	}
	copy(b[off:], p)
	return nil
}

// req is a request as libdevmapper builds one (libdm-iface.c: _flatten): the
// header with the version libdm speaks, data_size the whole buffer,
// data_start right after the header, and the payload there.
type req struct {
	size    int
	flags   uint32
	name    string
	uuid    string
	dev     uint64
	eventNr uint32
	targets []spec // TABLE_LOAD
	payload []byte // written at data_start when there are no targets
}

type spec struct {
	start, length uint64
	typ, params   string
}

func (r req) bytes() buf {
	size := r.size
	if size == 0 {
		size = 16 << 10
	}
	b := make(buf, size)
	le.PutUint32(b[0:], 4)
	le.PutUint32(b[4:], 6) // libdm asks for 4.6 at least
	le.PutUint32(b[offDataSize:], uint32(size))
	le.PutUint32(b[offDataStart:], HeaderSize)
	le.PutUint32(b[offTargetCount:], uint32(len(r.targets)))
	le.PutUint32(b[offFlags:], r.flags)
	le.PutUint32(b[offEventNr:], r.eventNr)
	le.PutUint64(b[offDev:], r.dev)
	copy(b[offName:], r.name)
	copy(b[offUUID:], r.uuid)
	at := HeaderSize
	for _, t := range r.targets {
		s := b[at:]
		le.PutUint64(s[specOffStart:], t.start)
		le.PutUint64(s[specOffLength:], t.length)
		copy(s[specOffType:specOffType+MaxTypeName], t.typ)
		n := copy(s[specSize:], t.params)
		next := align8(specSize + n + 1)
		le.PutUint32(s[specOffNext:], uint32(next))
		at += next
	}
	copy(b[at:], r.payload)
	return b
}

type env struct {
	t   *testing.T
	mgr *stack.Manager
	srv *Server
	log []string
	mu  sync.Mutex
	dir string
}

func newEnv(t *testing.T) *env {
	reg, err := stack.NewRegistry(stack.Linear, stack.Zero, stack.Error, stack.Striped, stack.Dust)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: t.TempDir()}
	open := stacktest.Opener{}
	for _, n := range []string{"8:16", "8:32"} {
		open[n] = stacktest.NewMemDevice(n, 1<<20)
	}
	e.mgr = stack.NewManager(stack.ManagerOptions{Registry: reg, Open: open.Open, Major: 253, CoreMessage: stack.DMStatsMessage})
	t.Cleanup(func() { e.mgr.Close() })
	e.srv = NewServer(e.mgr, func(l string) { e.mu.Lock(); e.log = append(e.log, l); e.mu.Unlock() })
	return e
}

// do runs command nr with r and returns the buffer after it and the errno.
func (e *env) do(nr uint32, r req) (buf, syscall.Errno) {
	b := r.bytes()
	return b, e.srv.Ioctl(context.Background(), Ioctl(nr), b, Caller{Admin: true, File: NewFile(e.mgr)})
}

func (e *env) must(nr uint32, r req) param {
	e.t.Helper()
	b, errno := e.do(nr, r)
	if errno != 0 {
		e.t.Fatalf("command %d %+v: %v (log %q)", nr, r, errno, e.lines())
	}
	return param{b: b}
}

func (e *env) lines() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

func load(name string, targets ...spec) req { return req{name: name, targets: targets} }

// TestLayout: the offsets this package uses are struct dm_ioctl's and its
// followers', as include/uapi/linux/dm-ioctl.h lays them out, and the ioctl
// numbers are _IOWR(0xfd, nr, struct dm_ioctl).
func TestLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"sizeof(struct dm_ioctl)", HeaderSize, 312}, {"offsetof(data)", minDataSize, 305},
		{"data_size", offDataSize, 12}, {"data_start", offDataStart, 16}, {"target_count", offTargetCount, 20},
		{"open_count", offOpenCount, 24}, {"flags", offFlags, 28}, {"event_nr", offEventNr, 32},
		{"dev", offDev, 40}, {"name", offName, 48}, {"uuid", offUUID, 176},
		{"sizeof(struct dm_target_spec)", specSize, 40}, {"spec next", specOffNext, 20}, {"spec target_type", specOffType, 24},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	for nr, want := range map[uint32]uint32{CmdVersion: 0xc138fd00, CmdDevCreate: 0xc138fd03, CmdTableLoad: 0xc138fd09, CmdGetTargetVersion: 0xc138fd11} {
		if got := Ioctl(nr); got != want {
			t.Errorf("Ioctl(%d) = %#x, want %#x", nr, got, want)
		}
	}
	for _, c := range []struct{ maj, min uint32 }{{253, 0}, {253, 255}, {253, 256}, {7, 1048575}, {4095, 12}} {
		if maj, min := DecodeDev(EncodeDev(c.maj, c.min)); maj != c.maj || min != c.min {
			t.Errorf("DecodeDev(EncodeDev(%d, %d)) = %d, %d", c.maj, c.min, maj, min)
		}
	}
	if got := EncodeDev(253, 3); got != 0xfd03 {
		t.Errorf("EncodeDev(253, 3) = %#x, want 0xfd03 (huge_encode_dev)", got)
	}
}

// TestLayoutAgainstC compiles a C program against this machine's uapi
// header and compares its offsets with this package's.
func TestLayoutAgainstC(t *testing.T) {
	if _, err := os.Stat("/usr/include/linux/dm-ioctl.h"); err != nil {
		t.Skip("no linux/dm-ioctl.h here")
	}
	cc, err := lookCC()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "l.c")
	os.WriteFile(src, []byte(`#include <stdio.h>
#include <stddef.h>
#include <linux/dm-ioctl.h>
int main(void) {
	printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n",
		sizeof(struct dm_ioctl), offsetof(struct dm_ioctl, data), offsetof(struct dm_ioctl, data_size),
		offsetof(struct dm_ioctl, data_start), offsetof(struct dm_ioctl, target_count), offsetof(struct dm_ioctl, open_count),
		offsetof(struct dm_ioctl, flags), offsetof(struct dm_ioctl, event_nr), offsetof(struct dm_ioctl, dev),
		offsetof(struct dm_ioctl, name), offsetof(struct dm_ioctl, uuid), sizeof(struct dm_target_spec),
		offsetof(struct dm_target_spec, next), offsetof(struct dm_target_spec, target_type),
		sizeof(struct dm_target_deps), sizeof(struct dm_target_versions), (size_t)DM_DEV_CREATE);
	return 0;
}
`), 0o644)
	bin := filepath.Join(dir, "l")
	if out, err := runCmd(cc, "-o", bin, src); err != nil {
		t.Skipf("cannot compile: %v: %s", err, out)
	}
	out, err := runCmd(bin)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d\n", HeaderSize, minDataSize, offDataSize, offDataStart, offTargetCount,
		offOpenCount, offFlags, offEventNr, offDev, offName, offUUID, specSize, specOffNext, specOffType, depsHeaderSize, versionsHeader, Ioctl(CmdDevCreate))
	if out != want {
		t.Errorf("C says %q, this package %q", out, want)
	}
}

// TestCreateLoadResume: the sequence dmsetup create sends (DEV_CREATE,
// TABLE_LOAD, DEV_SUSPEND to resume) makes a live device, and the replies
// carry what libdm reads: the number, the flags, the counts.
func TestCreateLoadResume(t *testing.T) {
	e := newEnv(t)
	p := e.must(CmdDevCreate, req{name: "a", uuid: "LVM-x", size: HeaderSize, flags: FlagPersistentDev, dev: EncodeDev(253, 7)})
	if maj, min := DecodeDev(p.dev()); maj != 253 || min != 7 {
		t.Errorf("created %d:%d, want the requested minor 7", maj, min)
	}
	if p.flags()&(FlagActivePresent|FlagInactivePresent) != 0 || p.dataSize() != minDataSize {
		t.Errorf("after create: flags %#x data_size %d", p.flags(), p.dataSize())
	}
	if _, errno := e.do(CmdDevCreate, req{name: "b", flags: FlagPersistentDev, dev: EncodeDev(253, 7)}); errno != syscall.EBUSY {
		t.Errorf("a second device on minor 7: %v, want EBUSY", errno)
	}
	if _, errno := e.do(CmdDevCreate, req{name: "a"}); errno != syscall.EBUSY {
		t.Errorf("a second device named a: %v, want EBUSY", errno)
	}
	p = e.must(CmdTableLoad, load("a", spec{0, 100, "linear", "8:16 0"}, spec{100, 28, "zero", ""}))
	if p.flags()&FlagInactivePresent == 0 || p.flags()&FlagActivePresent != 0 {
		t.Errorf("after load: flags %#x", p.flags())
	}
	// libdm resumes by number only.
	p = e.must(CmdDevSuspend, req{dev: EncodeDev(253, 7), size: HeaderSize})
	if p.flags()&FlagActivePresent == 0 || p.flags()&FlagSuspend != 0 || p.targetCount() != 2 || p.name() != "a" || p.uuid() != "LVM-x" {
		t.Errorf("after resume: flags %#x targets %d name %q uuid %q", p.flags(), p.targetCount(), p.name(), p.uuid())
	}
	if got := e.mgr.Lookup("a").FormatTable(stack.StatusTable, false); got != "0 100 linear 8:16 0\n100 28 zero \n" {
		t.Errorf("table %q", got)
	}
}

// TestAddressing: exactly one of uuid, name or number; two is refused as the
// kernel refuses them, an unknown one is ENXIO.
func TestAddressing(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a", uuid: "U"})
	for _, c := range []struct {
		r     req
		errno syscall.Errno
		log   string
	}{
		{req{name: "a"}, 0, ""},
		{req{uuid: "U"}, 0, ""},
		{req{dev: EncodeDev(253, 0)}, 0, ""},
		{req{name: "a", uuid: "U"}, syscall.EINVAL, "only supply one of name or uuid, cmd(7)"},
		{req{name: "a", dev: EncodeDev(253, 0)}, syscall.ENXIO, "Invalid ioctl structure: name a, dev fd00"},
		{req{uuid: "U", dev: EncodeDev(253, 0)}, syscall.ENXIO, "Invalid ioctl structure: uuid U, name , dev fd00"},
		{req{dev: EncodeDev(7, 0)}, syscall.ENXIO, ""},
		{req{name: "nosuch"}, syscall.ENXIO, ""},
		{req{}, syscall.ENXIO, ""},
	} {
		before := len(e.lines())
		b, errno := e.do(CmdDevStatus, c.r)
		if errno != c.errno {
			t.Errorf("%+v: %v, want %v", c.r, errno, c.errno)
		}
		if errno == 0 && (param{b: b}).name() != "a" {
			t.Errorf("%+v: name %q written back, want a", c.r, (param{b: b}).name())
		}
		if c.log != "" && !slicesContain(e.lines()[before:], "device-mapper: ioctl: "+c.log) {
			t.Errorf("%+v: log %q, want %q", c.r, e.lines()[before:], c.log)
		}
	}
}

func slicesContain(v []string, s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

// TestBadInput: inconsistent sizes, offsets and strings are refused with
// EINVAL (EFAULT for a buffer that is not the caller's), nothing changes and
// nothing is read or written beyond the buffer.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a"})
	short := req{name: "a"}.bytes()
	le.PutUint32(short[offDataSize:], 100)
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdDevStatus), short, Caller{Admin: true}); errno != syscall.EINVAL {
		t.Errorf("data_size 100: %v", errno)
	}
	big := req{name: "a", size: 1024}.bytes()
	le.PutUint32(big[offDataSize:], 4096) // more than the caller's memory
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdTableStatus), big, Caller{Admin: true}); errno != syscall.EFAULT {
		t.Errorf("data_size past the buffer: %v, want EFAULT", errno)
	}
	// A spec whose next points past the end, or backwards into the
	// header, or off alignment; parameters without their NUL.
	for name, mangle := range map[string]func(b buf){
		"next past end":    func(b buf) { le.PutUint32(b[HeaderSize+specOffNext:], 1<<20) },
		"next into header": func(b buf) { le.PutUint32(b[offDataStart:], 8) },
		"next unaligned":   func(b buf) { le.PutUint32(b[HeaderSize+specOffNext:], 52) },
		"no NUL": func(b buf) {
			clear(b[HeaderSize+specSize+5:])
			copy(b[HeaderSize+specSize:], bytes.Repeat([]byte{'x'}, len(b)-HeaderSize-specSize))
		},
		"data_start past end": func(b buf) { le.PutUint32(b[offDataStart:], 1<<30) },
	} {
		b := load("a", spec{0, 8, "zero", ""}, spec{8, 8, "zero", ""}).bytes()
		mangle(b)
		if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdTableLoad), b, Caller{Admin: true}); errno != syscall.EINVAL {
			t.Errorf("%s: %v, want EINVAL", name, errno)
		}
		if e.mgr.Lookup("a").Inactive() != nil {
			t.Errorf("%s: a table was loaded", name)
		}
	}
	// A name that fills its field: the kernel ends it at byte 127.
	long := strings.Repeat("n", 200)
	p := e.must(CmdDevCreate, req{name: long})
	if got := p.name(); got != long[:127] {
		t.Errorf("long name: %d bytes", len(got))
	}
	// Rename to a string with no NUL before the end.
	b := req{name: "a", size: HeaderSize + 8}.bytes()
	copy(b[HeaderSize:], "bbbbbbbb")
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdDevRename), b, Caller{Admin: true}); errno != syscall.EINVAL {
		t.Errorf("unterminated new name: %v", errno)
	}
	// Without CAP_SYS_ADMIN: EACCES, as ctl_ioctl answers, before anything.
	b = req{name: "zz"}.bytes()
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdDevCreate), b, Caller{}); errno != syscall.EACCES || e.mgr.Lookup("zz") != nil {
		t.Errorf("unprivileged create: %v", errno)
	}
	if le.Uint32(b[4:]) != 6 {
		t.Errorf("an unprivileged caller's buffer was written")
	}
	// Another ioctl type, an unknown command, a version too new.
	if errno := e.srv.Ioctl(context.Background(), 0xc1385800, req{}.bytes(), Caller{Admin: true}); errno != syscall.ENOTTY {
		t.Errorf("type 0x58: %v", errno)
	}
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdMpathProbePaths), req{}.bytes(), Caller{Admin: true}); errno != syscall.ENOTTY {
		t.Errorf("probe paths on the control node: %v", errno)
	}
	b = req{name: "a"}.bytes()
	le.PutUint32(b[4:], 99)
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdDevStatus), b, Caller{Admin: true}); errno != syscall.EINVAL || le.Uint32(b[4:]) != VersionMinor {
		t.Errorf("version 4.99: %v, version written back %d", errno, le.Uint32(b[4:]))
	}
}

// TestTableStatus: TABLE_STATUS lays its targets out as the kernel does
// (next from the first spec), and a buffer too small says so with
// DM_BUFFER_FULL_FLAG, as libdm expects before it doubles the buffer.
func TestTableStatus(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a"})
	e.must(CmdTableLoad, load("a", spec{0, 16, "linear", "8:16 8"}, spec{16, 16, "striped", "2 8 8:16 0 8:32 0"}))
	e.must(CmdDevSuspend, req{name: "a"})
	p := e.must(CmdTableStatus, req{name: "a", flags: FlagStatusTable})
	specs := parseSpecs(t, p)
	if want := []string{"0 16 linear 8:16 8", "16 16 striped 2 8 8:16 0 8:32 0"}; !equal(specs, want) {
		t.Errorf("table: %q, want %q", specs, want)
	}
	p = e.must(CmdTableStatus, req{name: "a"})
	if want := []string{"0 16 linear ", "16 16 striped 2 8:16 8:32 1 AA"}; !equal(parseSpecs(t, p), want) {
		t.Errorf("status: %q, want %q", parseSpecs(t, p), want)
	}
	p = e.must(CmdTableStatus, req{name: "a", size: HeaderSize + specSize + 10})
	if p.flags()&FlagBufferFull == 0 {
		t.Errorf("a small buffer: flags %#x, want DM_BUFFER_FULL_FLAG", p.flags())
	}
}

// parseSpecs reads a TABLE_STATUS reply as libdm's dm_get_next_target does.
func parseSpecs(t *testing.T, p param) []string {
	t.Helper()
	var out []string
	base := int(p.dataStart())
	at := base
	for i := 0; i < int(p.targetCount()); i++ {
		s := p.b[at:]
		params := cstring(s[specSize:])
		out = append(out, fmt.Sprintf("%d %d %s %s", le.Uint64(s[specOffStart:]), le.Uint64(s[specOffLength:]), cstring(s[specOffType:specOffType+MaxTypeName]), params))
		at = base + int(le.Uint32(s[specOffNext:]))
	}
	if end := int(p.dataSize()); at > end+8 {
		t.Errorf("specs run to %d, past data_size %d", at, end)
	}
	return out
}

func equal(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") }

// TestListDepsVersions: LIST_DEVICES with event numbers and uuids, DEPS by
// number, LIST_VERSIONS and GET_TARGET_VERSION.
func TestListDepsVersions(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a", uuid: "UA"})
	e.must(CmdTableLoad, load("a", spec{0, 8, "linear", "8:16 0"}))
	e.must(CmdDevSuspend, req{name: "a"})
	e.must(CmdDevCreate, req{name: "b"})
	e.must(CmdTableLoad, load("b", spec{0, 8, "linear", "253:0 0"}, spec{8, 8, "linear", "8:32 0"}))
	e.must(CmdDevSuspend, req{name: "b"})
	p := e.must(CmdListDevices, req{flags: FlagUUID})
	var got []string
	b := p.b[p.dataStart():p.dataSize()]
	for at := 0; ; {
		n := cstring(b[at+nameListHeader:])
		ev := align8(at + nameListHeader + len(n) + 1)
		line := fmt.Sprintf("%x %s ev=%d flags=%d", le.Uint64(b[at:]), n, le.Uint32(b[ev:]), le.Uint32(b[ev+4:]))
		if le.Uint32(b[ev+4:])&NameListHasUUID != 0 {
			line += " uuid=" + cstring(b[align8(ev+8):])
		}
		got = append(got, line)
		next := int(le.Uint32(b[at+8:]))
		if next == 0 {
			break
		}
		at += next
	}
	if want := []string{"fd00 a ev=0 flags=1 uuid=UA", "fd01 b ev=0 flags=2"}; !equal(got, want) {
		t.Errorf("list: %q, want %q", got, want)
	}
	p = e.must(CmdListDevices, req{name: "b"})
	if n := cstring(p.b[p.dataStart()+nameListHeader:]); n != "b" || le.Uint32(p.b[p.dataStart()+8:]) != 0 {
		t.Errorf("list with prefix b: %q", n)
	}
	// The memory devices of the test are no block devices: of b's
	// devices only a has a number.
	p = e.must(CmdTableDeps, req{name: "b"})
	d := p.b[p.dataStart():]
	if le.Uint32(d) != 1 || le.Uint64(d[8:]) != EncodeDev(253, 0) || p.dataSize() != HeaderSize+16 {
		t.Errorf("deps: %x (data_size %d)", d[:24], p.dataSize())
	}
	p = e.must(CmdGetTargetVersion, req{name: "striped"})
	v := p.b[p.dataStart():]
	if cstring(v[versionsHeader:]) != "striped" || le.Uint32(v[4:]) != 1 {
		t.Errorf("striped version: %x", v[:24])
	}
	if _, errno := e.do(CmdGetTargetVersion, req{name: "crypt"}); errno != syscall.EINVAL {
		t.Errorf("crypt: %v, want EINVAL as a kernel without dm-crypt", errno)
	}
	p = e.must(CmdListVersions, req{})
	var types []string
	v = p.b[p.dataStart():p.dataSize()]
	for at := 0; ; {
		types = append(types, cstring(v[at+versionsHeader:]))
		next := int(le.Uint32(v[at:]))
		if next == 0 {
			break
		}
		at += next
	}
	if want := []string{"dust", "error", "linear", "striped", "zero"}; !equal(types, want) {
		t.Errorf("versions: %q", types)
	}
}

// TestRenameMessageRemove: rename by name and uuid with the kernel's checks,
// a message with output (DM_DATA_OUT_FLAG), remove and deferred remove.
func TestRenameMessageRemove(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a"})
	e.must(CmdTableLoad, load("a", spec{0, 8, "zero", ""}))
	e.must(CmdDevSuspend, req{name: "a"})
	e.must(CmdDevCreate, req{name: "c"})
	rename := func(name, to string, flags uint32) syscall.Errno {
		_, errno := e.do(CmdDevRename, req{name: name, flags: flags, payload: append([]byte(to), 0)})
		return errno
	}
	if errno := rename("a", "c", 0); errno != syscall.EBUSY {
		t.Errorf("rename onto c: %v", errno)
	}
	if errno := rename("nosuch", "d", 0); errno != syscall.ENXIO {
		t.Errorf("rename of nosuch: %v", errno)
	}
	if errno := rename("a", "b", 0); errno != 0 || e.mgr.Lookup("b") == nil {
		t.Errorf("rename a b: %v", errno)
	}
	if errno := rename("b", "UUID-B", FlagUUID); errno != 0 || e.mgr.Lookup("b").UUID() != "UUID-B" {
		t.Errorf("set uuid: %v", errno)
	}
	if errno := rename("b", "OTHER", FlagUUID); errno != syscall.EINVAL {
		t.Errorf("second uuid: %v", errno)
	}
	if errno := rename("b", "control", 0); errno != syscall.EINVAL {
		t.Errorf("rename to control: %v", errno)
	}
	msg := func(words string) (param, syscall.Errno) {
		b, errno := e.do(CmdTargetMsg, req{name: "b", payload: append(make([]byte, msgHeaderSize), append([]byte(words), 0)...)})
		return param{b: b}, errno
	}
	p, errno := msg("@stats_create - /1")
	if errno != 0 || p.flags()&FlagDataOut == 0 || cstring(p.b[p.dataStart():]) != "0" {
		t.Errorf("@stats_create: %v flags %#x out %q", errno, p.flags(), cstring(p.b[p.dataStart():]))
	}
	if _, errno := msg("   "); errno != syscall.EINVAL {
		t.Errorf("empty message: %v", errno)
	}
	if _, errno := msg("hello"); errno != syscall.EINVAL || !slicesContain(e.lines(), "device-mapper: ioctl: Target type does not support messages") {
		t.Errorf("message to zero: %v, log %q", errno, e.lines())
	}
	// Deferred removal of a device in use flags it and succeeds.
	e.mgr.Lookup("b").AddOpen(1)
	p = e.must(CmdDevRemove, req{name: "b", flags: FlagDeferredRemove})
	if p.flags()&FlagDeferredRemove == 0 || e.mgr.Lookup("b") == nil {
		t.Errorf("deferred remove of an open device: flags %#x", p.flags())
	}
	if _, errno := e.do(CmdDevRemove, req{name: "b"}); errno != syscall.EBUSY {
		t.Errorf("remove of an open device: %v", errno)
	}
	e.mgr.Lookup("b").AddOpen(-1)
	p = e.must(CmdDevRemove, req{name: "c"})
	if e.mgr.Lookup("c") != nil || p.flags()&FlagDeferredRemove != 0 {
		t.Errorf("remove c: flags %#x", p.flags())
	}
}

// TestWaitAndPoll: DEV_WAIT blocks until the event number moves, or until
// its context ends (EINTR); a File armed before an event is ready after it.
func TestWaitAndPoll(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a"})
	e.must(CmdTableLoad, load("a", spec{0, 8, "zero", ""}))
	e.must(CmdDevSuspend, req{name: "a"})
	f := NewFile(e.mgr)
	b := req{name: "a"}.bytes()
	if errno := e.srv.Ioctl(context.Background(), Ioctl(CmdDevArmPoll), b, Caller{Admin: true, File: f}); errno != 0 || f.Ready(e.mgr.GlobalEvent()) {
		t.Fatalf("arm: %v", errno)
	}
	done := make(chan syscall.Errno)
	wb := req{name: "a", eventNr: 0}.bytes()
	go func() { done <- e.srv.Ioctl(context.Background(), Ioctl(CmdDevWait), wb, Caller{Admin: true}) }()
	select {
	case errno := <-done:
		t.Fatalf("wait returned before an event: %v", errno)
	case <-time.After(50 * time.Millisecond):
	}
	e.mgr.Lookup("a").RaiseEvent()
	if errno := <-done; errno != 0 || (param{b: wb}).eventNr() != 1 || (param{b: wb}).targetCount() != 1 {
		t.Errorf("wait: %v event %d", errno, (param{b: wb}).eventNr())
	}
	if !f.Ready(e.mgr.GlobalEvent()) {
		t.Errorf("the control file is not ready after an event")
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		done <- e.srv.Ioctl(ctx, Ioctl(CmdDevWait), req{name: "a", eventNr: 1}.bytes(), Caller{Admin: true})
	}()
	cancel()
	if errno := <-done; errno != syscall.EINTR {
		t.Errorf("interrupted wait: %v", errno)
	}
}

// TestLoadErrorLog: a table that does not build is logged as the kernel
// logs it, with the device's number, and leaves no inactive table.
func TestLoadErrorLog(t *testing.T) {
	e := newEnv(t)
	e.must(CmdDevCreate, req{name: "a"})
	if _, errno := e.do(CmdTableLoad, load("a", spec{0, 8, "linear", "9:9 0"})); errno == 0 {
		t.Fatal("a table over a missing device loaded")
	}
	want := "device-mapper: table: 253:0: linear: Device lookup failed: 9:9: no such file or directory (-EINVAL)"
	if !slicesContain(e.lines(), want) || !slicesContain(e.lines(), "device-mapper: ioctl: error adding target to table") {
		t.Errorf("log %q, want %q", e.lines(), want)
	}
	if e.mgr.Lookup("a").Inactive() != nil {
		t.Error("an inactive table was left")
	}
}

// TestGolden: the replies of a fixed sequence, byte for byte, as hex:
// changes to what goes back to callers show up here.
func TestGolden(t *testing.T) {
	e := newEnv(t)
	var out strings.Builder
	step := func(what string, nr uint32, r req) {
		r.size = 512
		b, errno := e.do(nr, r)
		fmt.Fprintf(&out, "== %s: errno %d\n%s", what, errno, hex.Dump(b[:param{b: b}.dataSize()]))
	}
	step("version", CmdVersion, req{})
	step("create a", CmdDevCreate, req{name: "a", uuid: "LVM-a"})
	step("load a", CmdTableLoad, load("a", spec{0, 8, "linear", "8:16 0"}, spec{8, 8, "zero", ""}))
	step("resume a", CmdDevSuspend, req{name: "a"})
	step("status a", CmdTableStatus, req{name: "a"})
	step("table a", CmdTableStatus, req{name: "a", flags: FlagStatusTable})
	step("deps a", CmdTableDeps, req{name: "a"})
	step("list", CmdListDevices, req{flags: FlagUUID})
	step("versions", CmdGetTargetVersion, req{name: "linear"})
	step("suspend a", CmdDevSuspend, req{name: "a", flags: FlagSuspend})
	step("remove a", CmdDevRemove, req{uuid: "LVM-a"})
	golden.Check(t, filepath.Join("testdata", "replies.golden"), []byte(out.String()))
}

func lookCC() (string, error) { return exec.LookPath("cc") }

func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// countingExporter exports every device as 7:minor with users users of its
// block device, and counts the scans (Users calls).
type countingExporter struct {
	users int32
	scans atomic.Int32
}

func (x *countingExporter) Block(d *stack.Device) (uint32, uint32, bool) { return 7, d.Minor(), true }
func (x *countingExporter) Users(*stack.Device) (int32, int32) {
	x.scans.Add(1)
	return x.users, 1
}
func (x *countingExporter) Lookup(uint32, uint32) *stack.Device { return nil }
func (x *countingExporter) Freeze(*stack.Device) error          { return nil }
func (x *countingExporter) Thaw(*stack.Device) error            { return nil }

// TestOpenCountSkipBdget: DEV_STATUS reports the users of the exported
// block device, which takes a scan; with DM_SKIP_BDGET_FLAG (libdevmapper's
// noopencount) it leaves the scan out and counts the tables stacked on the
// device and the handles of its file.
func TestOpenCountSkipBdget(t *testing.T) {
	e := newEnv(t)
	x := &countingExporter{users: 2}
	e.mgr.SetExporter(x)
	e.must(CmdDevCreate, req{name: "a"})
	e.must(CmdTableLoad, load("a", spec{0, 8, "zero", ""}))
	e.must(CmdDevSuspend, req{name: "a"})
	e.must(CmdDevCreate, req{name: "b"})
	e.must(CmdTableLoad, load("b", spec{0, 8, "linear", "a 0"}))
	e.must(CmdDevSuspend, req{name: "b"})
	a := e.mgr.Lookup("a")
	a.AddOpen(2) // the loop device's handle and one more
	defer a.AddOpen(-2)
	x.scans.Store(0)
	if p := e.must(CmdDevStatus, req{name: "a"}); p.u32(offOpenCount) != 1+1+2 || x.scans.Load() != 1 {
		t.Errorf("open count %d with %d scans, want 4 (a table, a handle, two block device users) with 1", p.u32(offOpenCount), x.scans.Load())
	}
	x.scans.Store(0)
	if p := e.must(CmdDevStatus, req{name: "a", flags: FlagSkipBdget}); p.u32(offOpenCount) != 1+1 || x.scans.Load() != 0 {
		t.Errorf("with DM_SKIP_BDGET_FLAG: open count %d with %d scans, want 2 with none", p.u32(offOpenCount), x.scans.Load())
	}
}
