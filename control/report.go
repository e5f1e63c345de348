package control

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/stack"
)

// DeviceReport is the state of one device as report answers it: what
// dmsetup's column reports (info -c), ls --target and ls --tree show.
type DeviceReport struct {
	Name string `json:"name"`
	UUID string `json:"uuid,omitempty"`
	// Major and Minor are the number the device reports: its exported
	// block device's if it has one, else stack.Major and its minor.
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	// BlkDevName is the kernel name of the device's block device (such as
	// loop3), or the device name if it has none.
	BlkDevName string `json:"blkdevname"`
	Live       bool   `json:"live,omitempty"`
	Inactive   bool   `json:"inactive,omitempty"`
	Suspended  bool   `json:"suspended,omitempty"`
	ReadOnly   bool   `json:"readonly,omitempty"`
	// DeferredRemove is a pending deferred removal.
	DeferredRemove bool   `json:"deferred_remove,omitempty"`
	Open           int32  `json:"open"`
	Targets        int    `json:"targets"`
	EventNr        uint32 `json:"event_nr"`
	// ReadAhead is the read-ahead in sectors.
	ReadAhead uint32 `json:"read_ahead"`
	// Types are the target types of the live table's lines, in order.
	Types []string `json:"types,omitempty"`
	// Deps are the devices the live (with inactive: the inactive) table
	// uses, in the kernel's order.
	Deps []DepReport `json:"deps,omitempty"`
}

// ParseReport decodes the output of report.
func ParseReport(out string) ([]DeviceReport, error) {
	var devs []DeviceReport
	if err := json.Unmarshal([]byte(out), &devs); err != nil {
		return nil, fmt.Errorf("malformed report: %w", err)
	}
	return devs, nil
}

// DepReport is one device a table uses.
type DepReport struct {
	// Major and Minor are its number: a mapped device's reported number,
	// a block device's own, or zero for a regular file.
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	// Mapped is the name of a device of the same daemon.
	Mapped string `json:"mapped,omitempty"`
	// BlkDevName is the kernel name of a block device (sda, loop0), a
	// mapped device's BlkDevName, or a regular file's path.
	BlkDevName string `json:"blkdevname"`
	// Path is how the table names a file or block device.
	Path string `json:"path,omitempty"`
}

// DevName is the name dmsetup deps -o devname shows: the device name of a
// mapped device, else the kernel name.
func (d DepReport) DevName() string {
	if d.Mapped != "" {
		return d.Mapped
	}
	return d.BlkDevName
}

// About is the output of the about operation.
type About struct {
	// Major is the block major the daemon's devices report.
	Major uint32 `json:"major"`
}

// kernelName returns the kernel's name of block device major:minor (sda,
// loop0) from sysfs, "" if there is none.
func kernelName(major, minor uint32) string {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor))
	if err != nil {
		return ""
	}
	return filepath.Base(link)
}

// report describes d.
func (s *Server) report(d *stack.Device, inactive bool) DeviceReport {
	m := s.mgr
	in := d.Info(inactive)
	r := DeviceReport{Name: in.Name, UUID: in.UUID, Live: in.Live, Inactive: in.Inactive, Suspended: in.Suspended,
		ReadOnly: in.ReadOnly, DeferredRemove: in.DeferredRemove, Open: m.OpenCount(d), Targets: in.Targets, EventNr: in.EventNr,
		ReadAhead: in.ReadAhead}
	r.Major, r.Minor = m.DevNo(d)
	r.BlkDevName = s.blkDevName(d, r.Major, r.Minor)
	d.WithTables(func(live, _ *stack.Table) {
		if live != nil {
			r.Types = live.Types()
		}
	})
	for _, dep := range m.Deps(d, inactive) {
		var dr DepReport
		switch {
		case dep.Mapped != nil:
			dr.Mapped = dep.Mapped.Name()
			dr.Major, dr.Minor = m.DevNo(dep.Mapped)
			dr.BlkDevName = s.blkDevName(dep.Mapped, dr.Major, dr.Minor)
		case dep.Block:
			dr.Major, dr.Minor, dr.Path = dep.Major, dep.Minor, dep.Path
			if dr.BlkDevName = kernelName(dep.Major, dep.Minor); dr.BlkDevName == "" {
				dr.BlkDevName = fmt.Sprintf("%d:%d", dep.Major, dep.Minor)
			}
		default:
			dr.Path, dr.BlkDevName = dep.Path, dep.Path
		}
		r.Deps = append(r.Deps, dr)
	}
	return r
}

// blkDevName is the kernel name of d's block device: the loop device it is
// exported as (what /dev/mapper/NAME leads to and /sys/block knows), else
// dm-MINOR, as the kernel names device-mapper's disks.
func (s *Server) blkDevName(d *stack.Device, major, minor uint32) string {
	if maj, min, ok := s.mgr.Exported(d); ok {
		if n := kernelName(maj, min); n != "" {
			return n
		}
	}
	return fmt.Sprintf("dm-%d", minor)
}

// runReport answers report: the named device, or every device.
func (s *Server) runReport(r *Request) ([]DeviceReport, error) {
	if r.Name != "" {
		d := s.mgr.Lookup(r.Name)
		if d == nil {
			return nil, stack.NoSuchDevice(r.Name)
		}
		return []DeviceReport{s.report(d, r.Inactive)}, nil
	}
	out := []DeviceReport{}
	for _, d := range s.mgr.Devices() {
		out = append(out, s.report(d, r.Inactive))
	}
	return out, nil
}

// formatDeps prints one device's deps line as dmsetup deps does:
// "<n> dependencies\t:" then " (maj, min)" per device, or " (name)" with
// the devname and blkdevname formats. A regular file, which has no number,
// shows as its path.
func formatDeps(rep DeviceReport, format, prefix string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s%d dependencies\t:", prefix, len(rep.Deps))
	for _, d := range rep.Deps {
		switch {
		case format == "devname":
			fmt.Fprintf(&b, " (%s)", d.DevName())
		case format == "blkdevname" || d.Major == 0 && d.Minor == 0:
			fmt.Fprintf(&b, " (%s)", d.BlkDevName)
		default:
			fmt.Fprintf(&b, " (%d, %d)", d.Major, d.Minor)
		}
	}
	b.WriteByte('\n')
	return b.String()
}

// formatConcise prints devices as dmsetup table --concise does
// (stack.FormatConcise): their live tables, only the lines of type target
// if it is set.
func formatConcise(devs []*stack.Device, target string) string {
	cds := make([]stack.ConfigDevice, len(devs))
	for i, d := range devs {
		in := d.Info(false)
		lines := tableLines(d, stack.StatusTable, false, target)
		cds[i] = stack.ConfigDevice{Name: in.Name, UUID: in.UUID, Minor: int(in.Minor), ReadOnly: in.ReadOnly}
		if len(lines) > 0 {
			cds[i].Table = strings.Join(lines, "\n") + "\n"
		}
	}
	return stack.FormatConcise(cds)
}

// tableLines returns the lines (without newlines) of d's live or inactive
// table in table or status form, only those of type target if it is set.
func tableLines(d *stack.Device, st stack.StatusType, inactive bool, target string) []string {
	text := d.FormatTable(st, inactive)
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if l == "" && text == "" {
			break
		}
		if target != "" {
			if f := strings.Fields(l); len(f) < 3 || f[2] != target {
				continue
			}
		}
		out = append(out, l)
	}
	return out
}

// formatTargetLines prints d's lines of type target with prefix, as dmsetup
// table --target does: nothing when none matches.
func formatTargetLines(d *stack.Device, st stack.StatusType, inactive bool, target, prefix string) string {
	var b strings.Builder
	for _, l := range tableLines(d, st, inactive, target) {
		b.WriteString(prefix)
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// waitContext is the context of a wait request on connection c: it ends
// when the server closes or when the client hangs up (a client sends
// nothing after its request, so a read returns only then).
func (s *Server) waitContext(c net.Conn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(s.waits)
	c.SetReadDeadline(time.Time{})
	go func() {
		var b [1]byte
		c.Read(b[:])
		cancel()
	}()
	return ctx, cancel
}
