package stack

import (
	"context"
	"strings"
)

// Message sends a message to the device called name, as
// drivers/md/dm-ioctl.c: target_message does: a message of no words fails
// ("Empty message received", EINVAL); one whose first word starts with `@`
// goes to CoreMessage; any other goes to the target of the live table that
// covers sector, and returns the target's response. A device with no live
// table (none, or only an inactive one) takes such a message without an
// error and answers nothing, as dm does when dm_get_live_table finds no
// table; a suspended device keeps its live table and its targets get the
// message.
func (m *Manager) Message(ctx context.Context, name string, sector uint64, args []string) (string, error) {
	d := m.Lookup(name)
	if d == nil {
		return "", NoSuchDevice(name)
	}
	fail := func(err error) (string, error) { return "", &DeviceError{Name: name, Err: err} }
	if len(args) == 0 {
		return fail(Errorf("Empty message received"))
	}
	if strings.EqualFold(args[0], "@cancel_deferred_remove") {
		if err := m.cancelDeferred(d, len(args)); err != nil {
			return fail(err)
		}
		return "", nil
	}
	if len(args[0]) > 0 && args[0][0] == '@' {
		if m.core == nil {
			return fail(Errorf("Unsupported message sent to DM core"))
		}
		out, err := m.core(d, args)
		if err != nil {
			return fail(err)
		}
		return out, nil
	}
	var out string
	var err error
	d.WithTables(func(live, _ *Table) {
		if live == nil {
			return
		}
		if sector > uint64(live.Sectors()) {
			sector = uint64(live.Sectors())
		}
		var tg Target
		var typ *TargetType
		if tg, typ, err = live.TargetAt(int64(sector)); err != nil {
			return
		}
		ms, ok := tg.(Messager)
		if !ok {
			err = &TableError{Target: typ.Name, Err: ErrNoMessages}
			return
		}
		out, err = ms.Message(ctx, args)
		if err != nil {
			err = &TableError{Target: typ.Name, Err: err}
		}
	})
	if err != nil {
		return fail(err)
	}
	return out, nil
}
