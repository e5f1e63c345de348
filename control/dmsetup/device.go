package dmsetup

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
)

// maxName is the longest device name dm takes (DM_NAME_LEN - 1).
const maxName = 127

// errnoText is glibc's strerror text for an errno name such as "EBUSY";
// "Invalid argument" for a name it does not know.
func errnoText(name string) string {
	for e := syscall.Errno(1); e < 200; e++ {
		if unix.ErrnoName(e) == name {
			s := e.Error()
			return strings.ToUpper(s[:1]) + s[1:]
		}
	}
	return "Invalid argument"
}

// target is the device a task addresses: by name, uuid or number, as
// libdevmapper's task (and its ioctl failure line) has them.
type target struct {
	name, uuid string
	devno      string // "(M:m)" when addressed by number
	// absent is a uuid or number that names no device.
	absent bool
}

// failure prints libdevmapper's line for a failed ioctl:
// "device-mapper: <op> ioctl on <name> <uuid><devno> failed: <strerror>".
// With -v the reason dmfuse gives (what the kernel would log) comes first.
func (r *run) failure(op string, t target, resp *control.Response) {
	if r.o.verbose() > 0 && resp.Error != "" {
		r.errf("dmfuse: %s", resp.Error)
	}
	r.errf("device-mapper: %s ioctl on %s %s%s failed: %s", op, t.name, t.uuid, t.devno, errnoText(resp.Errno))
}

// call sends one request, validated first as the daemon would (an invalid
// request answers EINVAL, as an ioctl the kernel refuses). A daemon that
// cannot be reached is reported and returns nil.
func (r *run) call(req *control.Request) *control.Response {
	if err := req.Validate(); err != nil {
		return &control.Response{Error: err.Error(), Errno: "EINVAL"}
	}
	c, err := r.connect()
	if err != nil {
		r.errf("dmfuse: %v", err)
		return nil
	}
	resp, err := c.Call(req)
	if err != nil {
		r.errf("dmfuse: %v", err)
		return nil
	}
	return resp
}

// do sends a request for op on t and prints the failure line if it fails;
// it returns the response and whether it succeeded.
func (r *run) do(op string, t target, req *control.Request) (*control.Response, bool) {
	if t.absent {
		resp := &control.Response{Error: "no such device", Errno: "ENXIO"}
		r.failure(op, t, resp)
		return resp, false
	}
	resp := r.call(req)
	if resp == nil {
		return nil, false
	}
	if resp.Error != "" {
		r.failure(op, t, resp)
		return resp, false
	}
	return resp, true
}

// devices returns the report of every device, nil if the daemon cannot be
// reached.
func (r *run) devices() ([]control.DeviceReport, bool) {
	resp := r.call(&control.Request{Op: control.OpReport})
	if resp == nil {
		return nil, false
	}
	if resp.Error != "" {
		r.errf("dmfuse: %s", resp.Error)
		return nil, false
	}
	devs, err := control.ParseReport(resp.Output)
	if err != nil {
		r.errf("dmfuse: %v", err)
		return nil, false
	}
	return devs, true
}

// device resolves the device a verb addresses, as libdevmapper's
// dm_task_set_name and dmsetup's _set_task_device do: the positional name
// if there is one (a path resolves through the mapper folder), else -u
// UUID, else -j/-m. ok is false (and the message printed) for a name that
// cannot be used; t.name is "" when -u or -j/-m name no device, so that
// the daemon answers ENXIO.
func (r *run) device(arg string, create bool) (t target, ok bool) {
	if arg == "" {
		switch {
		case r.o.on("uuid"):
			t.uuid = r.o.val("uuid")
			t.name = r.lookup(func(d control.DeviceReport) bool { return d.UUID == t.uuid })
			t.absent = t.name == ""
			return t, true
		case r.o.on("major"):
			maj, min := r.o.intArg("major"), r.o.intArg("minor")
			t.devno = fmt.Sprintf("(%d:%d)", maj, min)
			t.name = r.lookup(func(d control.DeviceReport) bool { return int(d.Major) == maj && int(d.Minor) == min })
			t.absent = t.name == ""
			return t, true
		}
		r.errf("No device specified.")
		return t, false
	}
	if strings.Contains(arg, "/") {
		if create {
			r.errf("Name \"%s\" invalid. It contains \"/\".", arg)
			return t, false
		}
		name, ok := r.nameFromPath(arg)
		return target{name: name}, ok
	}
	if len(arg) > maxName {
		r.errf("Name \"%s\" too long.", arg)
		return t, false
	}
	return target{name: arg}, true
}

// lookup returns the name of the first device match accepts, "" if none.
// A device that is not there is answered by the daemon (ENXIO), as the
// kernel answers a uuid or number it does not know.
func (r *run) lookup(match func(control.DeviceReport) bool) string {
	devs, _ := r.devices()
	for _, d := range devs {
		if match(d) {
			return d.Name
		}
	}
	return ""
}

// nameFromPath resolves a device argument that is a path, as
// libdm-common.c: _dm_task_set_name_from_path: a path that exists names the
// device whose node in the mapper folder has the same device number; a
// relative a/b that does not exist is tried under the device folder.
// dmfuse also takes MAPPER/NAME (and mapper/NAME) for a device NAME whose
// node does not exist yet (no live table).
func (r *run) nameFromPath(path string) (string, bool) {
	mapper := filepath.Join(r.devDir, "mapper")
	last := path[strings.LastIndexByte(path, '/')+1:]
	var st unix.Stat_t
	p := path
	if unix.Stat(p, &st) != nil {
		if strings.HasPrefix(path, "/") || strings.Count(path, "/") != 1 || len(path) < 3 {
			return r.mapperName(path, mapper, last)
		}
		p = filepath.Join(r.devDir, path)
		if unix.Stat(p, &st) != nil {
			return r.mapperName(path, mapper, last)
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		var nst unix.Stat_t
		if unix.Stat(filepath.Join(mapper, last), &nst) == nil && nst.Rdev == st.Rdev {
			return last, true
		}
		ents, _ := os.ReadDir(mapper)
		for _, e := range ents {
			if unix.Stat(filepath.Join(mapper, e.Name()), &nst) == nil && nst.Mode&unix.S_IFMT == unix.S_IFBLK && nst.Rdev == st.Rdev {
				return e.Name(), true
			}
		}
	}
	if filepath.Clean(filepath.Dir(p)) == mapper && r.exists(last) {
		return last, true
	}
	r.errf("Device %s not found", last)
	return "", false
}

// mapperName resolves a path that does not exist: MAPPER/NAME or
// mapper/NAME of a device without a node; otherwise "Device PATH not
// found".
func (r *run) mapperName(path, mapper, last string) (string, bool) {
	if dir := filepath.Dir(path); (filepath.Clean(dir) == mapper || dir == "mapper") && r.exists(last) {
		return last, true
	}
	r.errf("Device %s not found", path)
	return "", false
}

// exists reports whether the daemon has a device called name.
func (r *run) exists(name string) bool {
	resp := r.call(&control.Request{Op: control.OpReport, Name: name})
	return resp != nil && resp.Error == ""
}
