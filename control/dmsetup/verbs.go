package dmsetup

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/stack"
)

// The verbs, each as dmsetup's function of the same name does it. A verb
// gets the positional words from its device on (repeatable verbs run once
// per device name) and multi, dmsetup's multiple_devices; it returns false
// after printing why it failed.

// removeRetries is how often remove --retry tries (libdm's
// DM_IOCTL_RETRIES), removeRetryWait the wait between tries.
const (
	removeRetries   = 25
	removeRetryWait = 200 * time.Millisecond
)

func first(args []string) string {
	if len(args) > 0 {
		return args[0]
	}
	return ""
}

// infoAfter prints the info block (or row) of t after a verb that succeeded
// with -v, as dmsetup's _display_info.
func (r *run) infoAfter(t target) bool {
	if r.o.verbose() == 0 {
		return true
	}
	return r.displayInfo(t)
}

// displayInfo prints t's info block, or with -c its row.
func (r *run) displayInfo(t target) bool {
	if r.report != nil {
		resp := r.call(&control.Request{Op: control.OpReport, Name: t.name, Inactive: r.o.on("inactive")})
		if resp == nil {
			return false
		}
		if resp.Error != "" || t.absent {
			r.errf("Device does not exist.")
			return false
		}
		devs, err := control.ParseReport(resp.Output)
		if err != nil {
			r.errf("dmfuse: %v", err)
			return false
		}
		r.rows = append(r.rows, devs...)
		return true
	}
	if t.absent {
		r.errf("Device does not exist.")
		return false
	}
	resp := r.call(&control.Request{Op: control.OpInfo, Name: t.name, Inactive: r.o.on("inactive")})
	if resp == nil {
		return false
	}
	if resp.Errno == "ENXIO" {
		r.errf("Device does not exist.")
		return false
	}
	if resp.Error != "" {
		r.failure("info", t, resp)
		return false
	}
	r.outf("%s", resp.Output)
	return true
}

func (r *run) create(args []string, _ bool) bool {
	if r.o.on("concise") {
		if len(args) > 1 {
			r.errf("dmsetup create --concise takes at most one argument")
			return false
		}
		return r.createConcise(args)
	}
	if len(args) == 0 {
		r.errf("Please provide a name for the new device.")
		return false
	}
	var minor *uint32
	if r.o.on("minor") {
		m := uint32(r.o.intArg("minor"))
		minor = &m
	}
	var table *string
	if !r.o.on("notable") {
		text, _, ok := r.tableSource(first(args[1:]))
		if !ok {
			return false
		}
		table = &text
	}
	return r.createOne(args[0], r.o.val("uuid"), minor, r.o.on("readonly"), table)
}

// createOne creates a device as libdevmapper's _create_and_load_v4: create
// it, load its table (addressed by number, as the failure line shows) if it
// has targets, resume it, and remove it again if the load or the resume
// fails. table nil is --notable. A table with targets goes first in one
// request that does the three steps (one round trip instead of four); only
// if that fails are they taken one by one, for libdevmapper's failure lines.
func (r *run) createOne(name, uuid string, minor *uint32, ro bool, table *string) bool {
	t, ok := r.device(name, true)
	if !ok {
		return false
	}
	if len(name) > maxName {
		r.errf("Name \"%s\" too long.", name)
		return false
	}
	t.uuid = uuid
	if table != nil && *table != "" {
		// One request does it all when it succeeds; one that fails has
		// left nothing, and the steps below then fail where libdevmapper
		// would, with its lines.
		req := &control.Request{Op: control.OpCreate, Name: name, UUID: uuid, ReadOnly: ro, Minor: minor, Table: *table, Dir: r.env.Dir,
			ReadAhead: r.o.val("readahead")}
		resp := r.call(req)
		if resp == nil {
			return false
		}
		if resp.Error == "" {
			return r.infoAfter(t)
		}
	}
	req := &control.Request{Op: control.OpCreate, Name: name, UUID: uuid, NoTable: true, ReadOnly: ro, Minor: minor}
	ct := t
	if minor != nil {
		ct.devno = fmt.Sprintf("(%d:%d)", r.o.intArg("major"), *minor)
	}
	if _, ok := r.do("create", ct, req); !ok {
		return false
	}
	if table != nil && *table != "" {
		// The load goes by number and the resume by name, neither with
		// the uuid, as libdevmapper's _create_and_load_v4 sends them.
		lt := target{name: name}
		if devs := r.reportOf(name); len(devs) == 1 {
			lt.devno = fmt.Sprintf("(%d:%d)", devs[0].Major, devs[0].Minor)
		}
		_, ok := r.do("reload", lt, &control.Request{Op: control.OpLoad, Name: name, Table: *table, Dir: r.env.Dir})
		if ok {
			_, ok = r.do("resume", target{name: name}, &control.Request{Op: control.OpResume, Name: name, ReadAhead: r.o.val("readahead")})
		}
		if !ok {
			if resp := r.call(&control.Request{Op: control.OpRemove, Name: name}); resp == nil || resp.Error != "" {
				r.errf("Failed to revert device creation.")
			}
			return false
		}
	}
	return r.infoAfter(t)
}

// reportOf returns the report of the device called name (nil if none).
func (r *run) reportOf(name string) []control.DeviceReport {
	resp := r.call(&control.Request{Op: control.OpReport, Name: name})
	if resp == nil || resp.Error != "" {
		return nil
	}
	devs, _ := control.ParseReport(resp.Output)
	return devs
}

// createConcise is dmsetup's _create_concise: devices separated by `;`,
// each name,uuid,minor,flags,table[,table...], `\` escaping the next
// character (stack.ScanConcise reads them); it creates each device as it
// is read and stops at the first failure.
func (r *run) createConcise(args []string) bool {
	if r.o.on("table") || r.o.on("minor") || r.o.on("uuid") || r.o.on("notable") || r.o.on("inactive") {
		r.errf("--concise is incompatible with --[no]table, --minor, --uuid and --inactive.")
		return false
	}
	var spec string
	if len(args) == 1 {
		spec = args[0]
	} else {
		b, err := io.ReadAll(r.env.Stdin)
		if err != nil {
			r.errf("Read from stdin aborted: %v", err)
			return false
		}
		spec = string(b)
	}
	ok := true
	stack.ScanConcise(spec, false, func(e stack.ConciseEntry) bool {
		fields := e.Fields
		if len(fields) > 5 {
			fields = append(fields[:4:4], strings.Join(fields[4:], "\n"))
		}
		parsed := func() string {
			f := append(append([]string(nil), fields...), make([]string, 5)...)
			return fmt.Sprintf("Parsed %d fields: name: %s uuid: %s minor: %s flags: %s table: %s",
				len(fields), f[0], nilText(f[1], len(fields) > 1), nilText(f[2], len(fields) > 2), nilText(f[3], len(fields) > 3), nilText(f[4], len(fields) > 4))
		}
		switch {
		case e.Err == stack.ErrConciseBackslash:
			r.errf("Backslash must be followed by another character at end of string.")
		case e.Err == stack.ErrConciseIncomplete:
			r.errf("Incomplete entry: five comma-separated fields are required for each device")
		case len(fields) != 5:
			r.errf("Five comma-separated fields are required for each device")
		case fields[3] != "" && fields[3] != "ro" && fields[3] != "rw":
			r.errf("Invalid flags parameter '%s' must be 'ro' or 'rw' or empty.", fields[3])
			ok = false
			return false
		default:
			var minor *uint32
			if fields[2] != "" {
				n, _ := atoi(fields[2])
				m := uint32(n)
				minor = &m
			}
			text, _, good := r.parseLines(fields[4], "")
			ok = good && r.createOne(fields[0], fields[1], minor, fields[3] == "ro", &text)
			return ok
		}
		r.errf("%s", parsed())
		ok = false
		return false
	})
	return ok
}

// nilText prints a concise field as dmsetup's %s does: "(null)" for a field
// not reached.
func nilText(s string, set bool) string {
	if !set {
		return "(null)"
	}
	return s
}

func (r *run) load(args []string, _ bool) bool {
	if r.o.on("notable") {
		r.errf("--notable only available when creating new device.")
		return false
	}
	name := ""
	if !r.o.on("uuid") && !r.o.on("major") {
		if len(args) == 0 {
			r.errf("Please specify device.")
			return false
		}
		name, args = args[0], args[1:]
	} else if len(args) > 1 {
		r.errf("Too many command line arguments.")
		return false
	}
	t, ok := r.device(name, false)
	if !ok {
		return false
	}
	text, _, ok := r.tableSource(first(args))
	if !ok {
		return false
	}
	if _, ok := r.do("reload", t, &control.Request{Op: control.OpLoad, Name: t.name, Table: text, Dir: r.env.Dir}); !ok {
		return false
	}
	return r.infoAfter(t)
}

// simple is dmsetup's _simple for suspend, resume and clear.
func (r *run) simple(op string, args []string, req control.Request) bool {
	t, ok := r.device(first(args), false)
	if !ok {
		return false
	}
	req.Name = t.name
	if _, ok := r.do(op, t, &req); !ok {
		return false
	}
	return r.infoAfter(t)
}

func (r *run) suspend(args []string, _ bool) bool {
	return r.simple("suspend", args, control.Request{Op: control.OpSuspend, NoFlush: r.o.on("noflush"), NoLockFS: r.o.on("nolockfs")})
}

func (r *run) resume(args []string, _ bool) bool {
	return r.simple("resume", args, control.Request{Op: control.OpResume, NoFlush: r.o.on("noflush"), NoLockFS: r.o.on("nolockfs"),
		ReadAhead: r.o.val("readahead")})
}

func (r *run) clear(args []string, _ bool) bool {
	return r.simple("clear", args, control.Request{Op: control.OpClear})
}

// deviceSectors is dmsetup's _get_device_size: the sum of the lengths of
// the live table's lines (0 if it cannot be read, after the failure line).
func (r *run) deviceSectors(name string) uint64 {
	t, ok := r.device(name, false)
	if !ok {
		return 0
	}
	resp, ok := r.do("table", t, &control.Request{Op: control.OpTable, Name: t.name})
	if !ok {
		return 0
	}
	var size uint64
	for _, l := range strings.Split(resp.Output, "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			size += n
		}
	}
	return size
}

// errorDevice is dmsetup's _error_device (wipe_table, remove --force): load
// an error table of the device's size and resume; with --force the resume
// neither flushes nor freezes. A failed resume clears the inactive table.
func (r *run) errorDevice(name string) bool {
	if name == "" {
		r.errf("No device specified.")
		return false
	}
	size := r.deviceSectors(name)
	t, ok := r.device(name, false)
	if !ok {
		return false
	}
	table := fmt.Sprintf("0 %d error \n", size)
	if _, ok := r.do("reload", t, &control.Request{Op: control.OpLoad, Name: t.name, Table: table}); !ok {
		return false
	}
	if r.o.on("force") {
		r.o.set("nolockfs", 1)
		r.o.set("noflush", 1)
	}
	req := &control.Request{Op: control.OpResume, Name: t.name, NoFlush: r.o.on("noflush"), NoLockFS: r.o.on("nolockfs")}
	if _, ok := r.do("resume", t, req); !ok {
		r.do("clear", t, &control.Request{Op: control.OpClear, Name: t.name})
		return false
	}
	return true
}

func (r *run) wipeTable(args []string, _ bool) bool {
	return r.errorDevice(first(args))
}

func (r *run) remove(args []string, _ bool) bool {
	if r.o.on("force") && len(args) > 0 {
		r.errorDevice(args[0])
	}
	t, ok := r.device(first(args), false)
	if !ok {
		return false
	}
	req := &control.Request{Op: control.OpRemove, Name: t.name, Deferred: r.o.on("deferred")}
	tries := 1
	if r.o.on("retry") {
		tries = removeRetries
	}
	for i := 1; ; i++ {
		resp, ok := r.do("remove", t, req)
		if ok {
			return true
		}
		if resp == nil || resp.Errno != "EBUSY" || i >= tries {
			return false
		}
		r.env.Sleep(removeRetryWait)
	}
}

func (r *run) removeAll(_ []string, _ bool) bool {
	req := &control.Request{Op: control.OpRemoveAll, Deferred: r.o.on("deferred")}
	if _, ok := r.do("remove_all", target{}, req); !ok {
		return false
	}
	if !r.o.on("force") {
		return true
	}
	devs, ok := r.devices()
	if !ok || len(devs) == 0 {
		return true
	}
	for _, d := range devs {
		r.errorDevice(d.Name)
	}
	r.do("remove_all", target{}, req)
	if devs, _ = r.devices(); len(devs) > 0 {
		r.errf("Unable to remove %d device(s).", len(devs))
	}
	return true
}

func (r *run) rename(args []string, _ bool) bool {
	name := ""
	if len(args) == 2 {
		name = args[0]
	}
	t, ok := r.device(name, false)
	if !ok {
		return false
	}
	newName := args[len(args)-1]
	req := &control.Request{Op: control.OpRename, Name: t.name}
	if r.o.on("setuuid") {
		req.UUID = newName
	} else {
		switch {
		case strings.Contains(newName, "/"):
			r.errf("Name \"%s\" invalid. It contains \"/\".", newName)
			return false
		case len(newName) > maxName:
			r.errf("Name \"%s\" too long", newName)
			return false
		case newName == "":
			r.errf("Non empty new name is required.")
			return false
		}
		req.NewName = newName
	}
	_, ok = r.do("rename", t, req)
	return ok
}

func (r *run) message(args []string, _ bool) bool {
	name := ""
	if !r.o.on("uuid") && !r.o.on("major") {
		name, args = args[0], args[1:]
	}
	t, ok := r.device(name, false)
	if !ok {
		return false
	}
	sector, ok := parseSector(args[0])
	if !ok {
		r.errf("Invalid sector.")
		return false
	}
	args = args[1:]
	if len(args) == 0 {
		r.errf("No message supplied.")
	}
	req := &control.Request{Op: control.OpMessage, Name: t.name, Sector: sector}
	if msg := strings.Join(args, " "); msg != "" {
		req.Args = []string{msg}
	}
	resp, ok := r.do("message", t, req)
	if !ok {
		return false
	}
	r.outf("%s", resp.Output)
	return true
}

// parseSector parses a message's sector as strtoull(s, 10) with dmsetup's
// checks: blanks and a sign may lead, the rest must be digits, and the
// value must fit (a minus sign negates it modulo 2^64).
func parseSector(s string) (uint64, bool) {
	s = strings.TrimLeft(s, " \t\n\r\v\f")
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

// exec runs ls --exec's command with the device's node as its last
// argument, as dmsetup's _exec_command: the command is split on blanks.
func (r *run) exec(name string) bool {
	words := strings.Fields(r.o.val("exec"))
	if len(words) == 0 {
		return false
	}
	cmd := exec.Command(words[0], append(words[1:], filepath.Join(r.devDir, "mapper", name))...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.env.Stdin, r.env.Stdout, r.env.Stderr
	cmd.Run()
	return true
}

// mangle has nothing to do: dmfuse names never hold characters that need
// mangling, so every name is in its correct form.
func (r *run) mangle(args []string, _ bool) bool {
	one := func(name string) bool {
		devs := r.reportOf(name)
		if len(devs) != 1 {
			return false
		}
		d := devs[0]
		if d.UUID != "" {
			r.outf("%s: %s: name and UUID already in correct form\n", d.Name, d.UUID)
		} else {
			r.outf("%s: [no UUID]: name already in correct form\n", d.Name)
		}
		return true
	}
	if len(args) == 0 && !r.o.on("uuid") && !r.o.on("major") {
		return r.allDevices(one)
	}
	t, ok := r.device(first(args), false)
	return ok && !t.absent && one(t.name)
}

func (r *run) targets(_ []string, _ bool) bool {
	resp, ok := r.do("versions", target{}, &control.Request{Op: control.OpTargets})
	if ok {
		r.outf("%s", resp.Output)
	}
	return ok
}

func (r *run) targetVersion(args []string, _ bool) bool {
	resp, ok := r.do("versions", target{}, &control.Request{Op: control.OpTargets})
	if !ok {
		return false
	}
	for _, l := range strings.Split(resp.Output, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == args[0] {
			r.outf("%s\n", l)
			return true
		}
	}
	r.failure("target-version", target{}, &control.Response{Errno: "EINVAL"})
	return false
}

func (r *run) version(_ []string, _ bool) bool {
	r.outf("Library version:   %s\n", LibraryVersion)
	r.outf("Driver version:    %s\n", DriverVersion)
	return true
}

func (r *run) help(_ []string, _ bool) bool {
	usage(r.env.Stderr)
	if r.o.on("columns") {
		fieldHelp(r.env.Stderr)
	}
	return true
}

func (r *run) unsupported(_ []string, _ bool) bool {
	r.errf("dmsetup: %s is not supported by dmfuse.", r.cmd.name)
	return false
}

// The udev verbs: dmfuse makes its nodes itself and never waits for udev,
// so there are no cookies and no semaphores; they answer as dmsetup does on
// a system where udev holds none.
