// Package multipath is dmfuse's multipath target (Type, after the kernel's
// drivers/md/dm-mpath.c, target version 1.15.0): priority groups of paths
// to one storage, a path selector per group (package selectors), failover
// on path errors, queueing while no path is left, and the push-back of
// queued I/O across a noflush suspend (stack.ErrPushBack).
//
// It is written against stack's public target API only:
//
//   - multipath.go: the target type and its constructor (table syntax above
//     it), the priority groups and paths;
//   - map.go: mapping each I/O to a path, failover, queueing and the
//     suspend and resume hooks;
//   - message.go: the messages (fail_path, reinstate_path, switch_group,
//     queue_if_no_path, ...), whose device arguments stack.ResolveDevArg
//     resolves;
//   - status.go: the TABLE and INFO forms.
//
// # Behaviour
//
// Multipath follows bio-mode dm-mpath (drivers/md/dm-mpath.c) whatever
// queue_mode says: the table prints what the kernel prints for the mode given,
// but every I/O is handled as bio mode handles it.
//
//   - Each I/O asks the current group's selector for a path (choose_pgpath);
//     the device stays in that group while it has a usable path, and
//     otherwise takes the group switch_group asked for, then the first group
//     with a usable path, bypassed (disable_group) groups last.
//   - An I/O error from a path that is a path error (blk_path_error: not
//     EOPNOTSUPP, ENOSPC, EREMOTEIO, EBADE, ENODATA or EILSEQ) fails the path
//     (F, its fail count goes up, a table event) and the I/O is retried on
//     another path; other errors are returned as they are.
//   - With no usable path, I/O waits inside the target while queue_if_no_path
//     is set, and is retried when a path is reinstated (fail_if_no_path fails
//     it with EIO instead); without queue_if_no_path it fails with EIO and is
//     not counted.
//   - A flush, discard or write-zeroes goes to one path, chosen like any I/O,
//     as in dm: all paths lead to the same storage.
//   - Presuspend turns queue_if_no_path off until Resume (so table does not
//     show it while suspended), releasing held I/O: a flush suspend fails it
//     with EIO; a noflush suspend pushes it back (stack.ErrPushBack), and the
//     device issues it again after resume, so nothing is lost.
//   - A hardware handler needs a SCSI path, and no dmfuse path is one: as
//     drivers/md/dm-mpath.c: parse_path does for a path that is not SCSI, the
//     first path drops the handler with a logged "hardware handlers are only
//     allowed for scsi devices", so table prints 0 for it and no pg_init ever
//     runs (pg_init_count stays 0). In bio mode the handler is ignored when
//     the table is read (parse_hw_handler).
//   - Messages fail with EBUSY while the device is suspended. fail_path and
//     reinstate_path take the device in any form that resolves to the path's
//     device (name, 253:N, path, MAJOR:MINOR; a relative path is taken from the
//     daemon's working directory) or in the escaped form table prints.
//   - historical-service-time gets a nanosecond start stamp taken at map time
//     from the selector's own clock (package selectors says why).
package multipath
