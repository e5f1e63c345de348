package dmsetup

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/dmfuse/dmfuse/control"
)

// info -c: dmsetup's column report (libdm-report), for the fields of device
// information and dependencies.

// field is one report field: its id (as -o names it), heading, minimum
// width, alignment and value.
type field struct {
	id, heading string
	width       int
	number      bool
	help        string
	value       func(d control.DeviceReport, all []control.DeviceReport) string
}

func num[T ~int | ~int32 | ~uint32](v T) string { return strconv.FormatInt(int64(v), 10) }

// fields are the report fields dmfuse answers, in dmsetup's order.
var fields = []field{
	{"name", "Name", 16, false, "Name of mapped device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.Name }},
	{"mangled_name", "MangledName", 16, false, "Mangled name of mapped device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.Name }},
	{"unmangled_name", "UnmangledName", 16, false, "Unmangled name of mapped device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.Name }},
	{"uuid", "UUID", 32, false, "Unique (optional) identifier for mapped device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.UUID }},
	{"mangled_uuid", "MangledUUID", 32, false, "Mangled unique (optional) identifier for mapped device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.UUID }},
	{"unmangled_uuid", "UnmangledUUID", 32, false, "Unmangled unique (optional) identifier for mapped device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.UUID }},
	{"read_ahead", "RAhead", 6, true, "Read ahead value.", func(d control.DeviceReport, _ []control.DeviceReport) string { return fmt.Sprint(d.ReadAhead) }},
	{"blkdevname", "BlkDevName", 16, false, "Name of block device.", func(d control.DeviceReport, _ []control.DeviceReport) string { return d.BlkDevName }},
	{"attr", "Stat", 4, false, "(L)ive, (I)nactive, (s)uspended, (r)ead-only, read-(w)rite.", func(d control.DeviceReport, _ []control.DeviceReport) string { return attr(d) }},
	{"tables_loaded", "Tables", 6, false, "Which of the live and inactive table slots are filled.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		switch {
		case d.Live && d.Inactive:
			return "Both"
		case d.Live:
			return "Live"
		case d.Inactive:
			return "Inactive"
		}
		return "None"
	}},
	{"suspended", "Suspended", 9, false, "Whether the device is suspended.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		if d.Suspended {
			return "Suspended"
		}
		return "Active"
	}},
	{"readonly", "Read-only", 9, false, "Whether the device is read-only or writeable.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		if d.ReadOnly {
			return "Read-only"
		}
		return "Writeable"
	}},
	{"devno", "DevNo", 5, false, "Device major and minor numbers", func(d control.DeviceReport, _ []control.DeviceReport) string {
		return fmt.Sprintf("%d:%d", d.Major, d.Minor)
	}},
	{"major", "Maj", 3, true, "Block device major number.", func(d control.DeviceReport, _ []control.DeviceReport) string { return num(d.Major) }},
	{"minor", "Min", 3, true, "Block device minor number.", func(d control.DeviceReport, _ []control.DeviceReport) string { return num(d.Minor) }},
	{"open", "Open", 4, true, "Number of references to open device, if requested.", func(d control.DeviceReport, _ []control.DeviceReport) string { return num(d.Open) }},
	{"segments", "Targ", 4, true, "Number of segments in live table, if present.", func(d control.DeviceReport, _ []control.DeviceReport) string { return num(d.Targets) }},
	{"events", "Event", 6, true, "Number of most recent event.", func(d control.DeviceReport, _ []control.DeviceReport) string { return num(d.EventNr) }},
	{"device_count", "#Devs", 5, true, "Number of devices used by this one.", func(d control.DeviceReport, _ []control.DeviceReport) string { return num(len(d.Deps)) }},
	{"devs_used", "DevNamesUsed", 16, false, "List of names of mapped devices used by this one.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		return joinDeps(d.Deps, func(x control.DepReport) string { return x.Mapped })
	}},
	{"devnos_used", "DevNosUsed", 16, false, "List of device numbers of devices used by this one.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		return joinDeps(d.Deps, func(x control.DepReport) string { return depNo(x) })
	}},
	{"blkdevs_used", "BlkDevNamesUsed", 16, false, "List of names of block devices used by this one.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		return joinDeps(d.Deps, func(x control.DepReport) string { return x.BlkDevName })
	}},
	{"device_ref_count", "#Refs", 5, true, "Number of mapped devices referencing this one.", func(d control.DeviceReport, all []control.DeviceReport) string {
		return num(len(users(d, all)))
	}},
	{"names_using_dev", "RefNames", 8, false, "List of names of mapped devices using this one.", func(d control.DeviceReport, all []control.DeviceReport) string {
		var out []string
		for _, u := range users(d, all) {
			out = append(out, u.Name)
		}
		return strings.Join(out, ",")
	}},
	{"devnos_using_dev", "RefDevNos", 9, false, "List of device numbers of mapped devices using this one.", func(d control.DeviceReport, all []control.DeviceReport) string {
		var out []string
		for _, u := range users(d, all) {
			out = append(out, fmt.Sprintf("%d:%d", u.Major, u.Minor))
		}
		return strings.Join(out, ",")
	}},
	{"subsystem", "Subsys", 6, false, "Userspace subsystem responsible for this device.", func(d control.DeviceReport, _ []control.DeviceReport) string {
		if i := strings.IndexByte(d.UUID, '-'); i >= 0 {
			return d.UUID[:i]
		}
		return ""
	}},
}

func attr(d control.DeviceReport) string {
	b := []byte("----")
	if d.Live {
		b[0] = 'L'
	}
	if d.Inactive {
		b[1] = 'I'
	}
	if d.Suspended {
		b[2] = 's'
	}
	b[3] = 'w'
	if d.ReadOnly {
		b[3] = 'r'
	}
	return string(b)
}

func depNo(x control.DepReport) string {
	if x.Major == 0 && x.Minor == 0 && x.Path != "" {
		return x.Path
	}
	return fmt.Sprintf("%d:%d", x.Major, x.Minor)
}

func joinDeps(deps []control.DepReport, f func(control.DepReport) string) string {
	var out []string
	for _, d := range deps {
		if s := f(d); s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}

// users returns the devices whose tables use d.
func users(d control.DeviceReport, all []control.DeviceReport) []control.DeviceReport {
	var out []control.DeviceReport
	for _, u := range all {
		for _, dep := range u.Deps {
			if dep.Mapped == d.Name {
				out = append(out, u)
				break
			}
		}
	}
	return out
}

// fieldHelp lists the fields, as `dmsetup help -c` does.
func fieldHelp(w io.Writer) {
	fmt.Fprintf(w, "Device Information Fields\n-------------------------\n")
	for _, f := range fields {
		fmt.Fprintf(w, "  %-20s - %s\n", f.id, f.help)
	}
	fmt.Fprintln(w)
}

// reportSpec is how info -c prints: the fields, the sort keys and the
// layout.
type reportSpec struct {
	fields   []field
	keys     []sortKey
	sep      string
	aligned  bool
	headings bool
	prefixes bool
	quoted   bool
	rows     bool
	// needAll is set when a field counts the devices that use each one.
	needAll bool
}

type sortKey struct {
	f    field
	desc bool
}

func findField(id string) (field, bool) {
	for _, f := range fields {
		if f.id == id {
			return f, true
		}
	}
	return field{}, false
}

// reportInit sets the report up from -o, -O, --noheadings, --separator,
// --nameprefixes, --unquoted and --rows, as dmsetup's _report_init; it
// returns false after printing why.
func (r *run) reportInit() bool {
	spec := &reportSpec{sep: " ", aligned: true, headings: true, quoted: true}
	options := "name,major,minor,attr,open,segments,events,uuid"
	if r.o.on("noheadings") {
		spec.sep, spec.aligned, spec.headings = ":", false, false
	}
	if r.o.on("headings") {
		switch strings.ToLower(r.o.val("headings")) {
		case "none", "0":
			spec.headings = false
		}
	}
	spec.rows = r.o.on("rows")
	spec.quoted = !r.o.on("unquoted")
	if r.o.on("nameprefixes") {
		spec.aligned, spec.prefixes = false, true
	}
	if o := r.o.val("options"); r.o.on("options") {
		if strings.HasPrefix(o, "+") {
			options += "," + o[1:]
		} else {
			options = o
		}
	}
	for _, id := range strings.Split(options, ",") {
		id = strings.TrimSpace(id)
		if id == "help" || id == "?" {
			fieldHelp(r.env.Stderr)
			return false
		}
		f, ok := findField(id)
		if !ok {
			r.errf("Unrecognised field: %s", id)
			return false
		}
		spec.fields = append(spec.fields, f)
		spec.needAll = spec.needAll || strings.Contains(f.id, "using") || f.id == "device_ref_count"
	}
	if r.o.on("sort") {
		for _, k := range strings.Split(r.o.val("sort"), ",") {
			desc := strings.HasPrefix(k, "-")
			k = strings.TrimLeft(k, "+-")
			f, ok := findField(k)
			if !ok {
				r.errf("Unrecognised field: %s", k)
				return false
			}
			spec.keys = append(spec.keys, sortKey{f, desc})
		}
	}
	if r.o.on("separator") {
		spec.sep, spec.aligned = r.o.val("separator"), false
	}
	r.report = spec
	return true
}

// flushReport prints the gathered rows (nothing if there are none).
func (r *run) flushReport() {
	spec := r.report
	if spec == nil || len(r.rows) == 0 {
		return
	}
	all := r.rows
	if spec.needAll {
		if devs, ok := r.devices(); ok {
			all = devs
		}
	}
	rows := make([][]string, len(r.rows))
	for i, d := range r.rows {
		for _, f := range spec.fields {
			rows[i] = append(rows[i], f.value(d, all))
		}
	}
	if len(spec.keys) > 0 {
		idx := make([]int, len(rows))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool {
			for _, k := range spec.keys {
				va, vb := k.f.value(r.rows[idx[a]], all), k.f.value(r.rows[idx[b]], all)
				if va == vb {
					continue
				}
				less := va < vb
				if k.f.number {
					na, _ := strconv.ParseInt(va, 10, 64)
					nb, _ := strconv.ParseInt(vb, 10, 64)
					less = na < nb
				}
				return less != k.desc
			}
			return false
		})
		sorted := make([][]string, len(rows))
		for i, j := range idx {
			sorted[i] = rows[j]
		}
		rows = sorted
	}
	r.rows = nil
	w := r.env.Stdout
	if spec.rows {
		for j, f := range spec.fields {
			var parts []string
			if spec.headings {
				parts = append(parts, f.heading)
			}
			for _, row := range rows {
				parts = append(parts, r.cell(f, row[j]))
			}
			fmt.Fprintln(w, strings.Join(parts, spec.sep))
		}
		return
	}
	widths := make([]int, len(spec.fields))
	for j, f := range spec.fields {
		widths[j] = f.width
		if spec.headings && len(f.heading) > widths[j] {
			widths[j] = len(f.heading)
		}
		for _, row := range rows {
			widths[j] = max(widths[j], len(row[j]))
		}
	}
	line := func(cells []string, heading bool) {
		var b strings.Builder
		for j, c := range cells {
			if j > 0 {
				b.WriteString(spec.sep)
			}
			switch {
			case !spec.aligned:
				b.WriteString(c)
			case spec.fields[j].number && !heading:
				fmt.Fprintf(&b, "%*s", widths[j], c)
			default:
				fmt.Fprintf(&b, "%-*s", widths[j], c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
	if spec.headings {
		var hs []string
		for _, f := range spec.fields {
			hs = append(hs, f.heading)
		}
		line(hs, true)
	}
	for _, row := range rows {
		cells := make([]string, len(row))
		for j, v := range row {
			cells[j] = r.cell(spec.fields[j], v)
		}
		line(cells, false)
	}
}

// cell is one value as printed: with --nameprefixes DM_ID='value'.
func (r *run) cell(f field, v string) string {
	if !r.report.prefixes {
		return v
	}
	if r.report.quoted {
		v = "'" + v + "'"
	}
	return "DM_" + strings.ToUpper(f.id) + "=" + v
}
