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
package multipath
