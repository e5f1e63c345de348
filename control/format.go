package control

import (
	"fmt"
	"strings"

	"github.com/dmfuse/dmfuse/stack"
)

// What table, status, info and ls print, in dmsetup's formats.

// formatTable prints a device's live (or inactive) table as dmsetup's table
// (stack.StatusTable) or status (stack.StatusInfo) do: each line prefixed
// with prefix; a device with no such table prints the prefix and a newline.
func formatTable(d *stack.Device, st stack.StatusType, inactive bool, prefix string) string {
	text := d.FormatTable(st, inactive)
	if text == "" {
		return prefix + "\n"
	}
	if prefix == "" {
		return text
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		if l != "" {
			b.WriteString(prefix)
			b.WriteString(l)
		}
	}
	return b.String()
}

// formatInfo prints a device's info block as `dmsetup info` does: labels
// padded so that values start in column 20, the UUID line only when a uuid is
// set, and an empty line at the end. major and minor are the number the
// device reports.
func formatInfo(in stack.Info, major, minor uint32) string {
	var b strings.Builder
	line := func(label, format string, a ...any) {
		fmt.Fprintf(&b, "%-19s%s\n", label, fmt.Sprintf(format, a...))
	}
	state := "ACTIVE"
	if in.Suspended {
		state = "SUSPENDED"
	}
	if in.ReadOnly {
		state += " (READ-ONLY)"
	}
	if in.DeferredRemove {
		state += " (DEFERRED REMOVE)"
	}
	tables := "None"
	switch {
	case in.Live && in.Inactive:
		tables = "LIVE & INACTIVE"
	case in.Live:
		tables = "LIVE"
	case in.Inactive:
		tables = "INACTIVE"
	}
	line("Name:", "%s", in.Name)
	line("State:", "%s", state)
	line("Read Ahead:", "%d", in.ReadAhead)
	line("Tables present:", "%s", tables)
	line("Open count:", "%d", in.OpenCount)
	line("Event number:", "%d", in.EventNr)
	line("Major, minor:", "%d, %d", major, minor)
	line("Number of targets:", "%d", in.Targets)
	if in.UUID != "" {
		fmt.Fprintf(&b, "UUID: %s\n", in.UUID)
	}
	b.WriteByte('\n')
	return b.String()
}

// formatList prints devices as `dmsetup ls` does: `<name>\t(<major>:<minor>)`
// per device, or "No devices found".
func formatList(m *stack.Manager, devs []*stack.Device) string {
	if len(devs) == 0 {
		return "No devices found\n"
	}
	var b strings.Builder
	for _, d := range devs {
		maj, min := m.DevNo(d)
		fmt.Fprintf(&b, "%s\t(%d:%d)\n", d.Name(), maj, min)
	}
	return b.String()
}
