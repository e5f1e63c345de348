package dmsetup

// The verbs that show devices and wait on them: info, status and table,
// deps, ls and wait.

import (
	"strings"

	"github.com/dmfuse/dmfuse/control"
)

func (r *run) wait(args []string, _ bool) bool {
	name := ""
	if !r.o.on("uuid") && !r.o.on("major") {
		if len(args) == 0 {
			r.errf("No device specified.")
			return false
		}
		name, args = args[0], args[1:]
	}
	t, ok := r.device(name, false)
	if !ok {
		return false
	}
	var nr uint32
	if len(args) > 0 {
		n, _ := atoi(args[len(args)-1])
		nr = uint32(n)
	}
	if _, ok := r.do("waitevent", t, &control.Request{Op: control.OpWait, Name: t.name, EventNr: nr}); !ok {
		return false
	}
	return r.infoAfter(t)
}

// allDevices runs fn once per device (dmsetup's _process_all), or prints
// "No devices found".
func (r *run) allDevices(fn func(name string) bool) bool {
	devs, ok := r.devices()
	if !ok {
		return false
	}
	if len(devs) == 0 {
		r.outf("No devices found\n")
		return true
	}
	res := true
	for _, d := range devs {
		if !fn(d.Name) {
			res = false
		}
	}
	return res
}

func (r *run) info(args []string, _ bool) bool {
	if len(args) == 0 && !r.o.on("uuid") && !r.o.on("major") {
		return r.allDevices(func(name string) bool { return r.displayInfo(target{name: name}) })
	}
	t, ok := r.device(first(args), false)
	if !ok {
		return false
	}
	return r.displayInfo(t)
}

// status is dmsetup's _status, for table and status.
func (r *run) status(args []string, multi bool) bool {
	if len(args) == 0 && !r.o.on("uuid") && !r.o.on("major") {
		ok := r.allDevices(func(name string) bool { return r.statusOne(target{name: name}, true) })
		r.endConcise()
		return ok
	}
	t, ok := r.device(first(args), false)
	if !ok {
		return false
	}
	ok = r.statusOne(t, multi)
	if len(args) <= 1 {
		r.endConcise()
	}
	return ok
}

// endConcise ends table --concise's single line.
func (r *run) endConcise() {
	if r.cmd.name == "table" && r.o.on("concise") && r.conciseDone {
		r.outf("\n")
		r.conciseDone = false
	}
}

func (r *run) statusOne(t target, multi bool) bool {
	op, verb := control.OpStatus, "status"
	concise := false
	if r.cmd.name == "table" {
		op, verb = control.OpTable, "table"
		concise = r.o.on("concise")
	}
	if t.absent && verb == "status" {
		r.errf("Device does not exist.")
		return false
	}
	req := &control.Request{Op: op, Name: t.name, Inactive: r.o.on("inactive"), Target: r.o.val("target"), Concise: concise,
		NoFlush: verb == "status" && r.o.on("noflush")}
	if t.absent {
		r.do(verb, t, req)
		return false
	}
	resp := r.call(req)
	if resp == nil {
		return false
	}
	if resp.Errno == "ENXIO" && verb == "status" {
		r.errf("Device does not exist.")
		return false
	}
	if resp.Error != "" {
		r.failure(verb, t, resp)
		return false
	}
	if concise {
		if r.conciseDone {
			r.outf(";")
		}
		r.outf("%s", strings.TrimSuffix(resp.Output, "\n"))
		r.conciseDone = true
		return true
	}
	if resp.Output == "" {
		return true // --target matched no line
	}
	if r.o.verbose() > 0 && !r.displayInfo(t) {
		return false
	}
	prefix := ""
	if multi && r.o.verbose() == 0 {
		prefix = t.name + ": "
	}
	for _, l := range strings.SplitAfter(resp.Output, "\n") {
		if l != "" {
			r.outf("%s%s", prefix, l)
		}
	}
	if multi && r.o.verbose() > 0 {
		r.outf("\n")
	}
	return true
}

func (r *run) deps(args []string, multi bool) bool {
	one := func(t target, multi bool) bool {
		req := &control.Request{Op: control.OpDeps, Name: t.name, Inactive: r.o.on("inactive"), Format: r.devName}
		resp, ok := r.do("deps", t, req)
		if !ok {
			return false
		}
		if r.o.verbose() > 0 && !r.displayInfo(t) {
			return false
		}
		prefix := ""
		if multi && r.o.verbose() == 0 {
			prefix = t.name + ": "
		}
		r.outf("%s%s", prefix, resp.Output)
		if multi && r.o.verbose() > 0 {
			r.outf("\n")
		}
		return true
	}
	if len(args) == 0 && !r.o.on("uuid") && !r.o.on("major") {
		return r.allDevices(func(name string) bool { return one(target{name: name}, true) })
	}
	t, ok := r.device(first(args), false)
	if !ok {
		return false
	}
	return one(t, multi)
}

func (r *run) ls(_ []string, _ bool) bool {
	devs, ok := r.devices()
	if !ok {
		return false
	}
	switch {
	case r.o.on("target") || r.o.on("exec"):
		for _, d := range devs {
			if r.o.on("target") && !contains(d.Types, r.o.val("target")) {
				continue
			}
			if !r.o.on("exec") || r.o.verbose() > 0 {
				r.outf("%s\t(%d, %d)\n", d.Name, d.Major, d.Minor)
			}
			if r.o.on("exec") && !r.exec(d.Name) {
				return false
			}
		}
		return true
	case r.o.on("tree"):
		if len(devs) == 0 {
			r.outf("No devices found\n")
			return true
		}
		r.printTree(devs)
		return true
	}
	if len(devs) == 0 {
		r.outf("No devices found\n")
		return true
	}
	for _, d := range devs {
		switch r.devName {
		case "blkdevname":
			r.outf("%s\t(%s)\n", d.Name, d.BlkDevName)
		case "devname":
			r.outf("%s\t(%s)\n", d.Name, d.Name)
		default:
			r.outf("%s\t(%d:%d)\n", d.Name, d.Major, d.Minor)
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
