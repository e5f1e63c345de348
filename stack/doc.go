// Package stack is dmfuse's device-mapper core: target types and their
// registry, table text and the tables built from it, mapped devices (Device)
// with their life cycle, suspend gate and accounting, and the Manager that
// owns the devices of one daemon. It also holds the small kernel targets
// linear, striped, zero, error, flakey and dust. The targets that bring
// machinery of their own live in packages of their own, written against this
// package's public target API: delay (and its scheduler), multipath (with the
// path selectors of package selectors), log-writes (package logwrites, with
// its log format and replay-log), powercut, thin-pool and thin (package
// thin, with the kernel's metadata format in thin/metadata over the
// persistent-data library in package persistent), and snapshot,
// snapshot-origin and snapshot-merge (package snapshot, with the kernel's
// exception store). Package targets lists
// every target type; the counters are package stats'.
//
// The Manager's verbs each have a file named after them: create.go,
// load.go (load and clear), suspend.go, resume.go, remove.go (remove,
// remove_all, deferred removal), rename.go (rename, set-uuid), message.go,
// wait.go and info.go (info, table, status, deps); resolve.go resolves the
// device arguments of tables (names, numbers, paths, in-process stacking and
// exported devices), and exporter.go is what the manager asks of the block
// devices its devices are exported as.
//
// # Request flow
//
// One request flows
//
//	fs  ->  Device (suspend gate, live table)  ->  Table (split, accounting)  ->  Target  ->  BlockDevice
//
// as a bio flows through drivers/md/dm.c: dm_submit_bio, dm_split_and_process_bio
// and __map_bio. Device.ReadAt and the other I/O methods pass the gate (held
// while the device is suspended), load the live table and clip the range to
// the device. Table splits it at segment boundaries and at each target's
// MaxIO (drivers/md/dm.c: max_io_len) and hands each piece to its target
// with an offset relative to the segment; the target maps it onto a
// BlockDevice: a backing file or block device (OpenFile), or another
// Device of the same daemon, which is how devices stack in-process.
//
// # Targets
//
// A Target is one constructed table line. Its methods take byte offsets
// relative to the start of its segment: the table subtracts the segment's
// start, so a target never sees where its segment lies in the device
// (Ctor.Begin tells the constructor, for targets whose behaviour depends on
// it). The table never hands a target a range that crosses the end of its
// segment or a multiple of its MaxIO counted from the segment's start. Every
// method may be called concurrently, as with io.ReaderAt.
//
// ReadAt and WriteAt return the bytes transferred and an error. A short count
// without an error is a bug; the table turns it into EIO. As with
// io.ReaderAt and io.WriterAt, a target keeps no reference to p after it
// returns, and never writes into the buffer of a write: the write-zeroes
// fallback hands every target the same shared buffer of zeros, and flakey
// corrupts writes on a copy. Errors should wrap a syscall.Errno.
//
// Status(StatusTable) is what `dmfuse table` prints after "<start> <len>
// <type> ", and must be accepted back by the constructor, so device names are
// printed through EscapeArg; Status(StatusInfo) is what `dmfuse status`
// prints. Close releases what the constructor acquired, except the devices
// it opened through Ctor.Open: the table owns and closes those.
//
// # Optional interfaces
//
// The core finds a target's other capabilities by type assertion, once, when
// the table is built. What each one means, and what happens without it:
//
//   - Flusher: the target passes flushes (fsync) down. The device sends one
//     empty flush to every target of the table (drivers/md/dm.c:
//     __send_empty_flush); a target without Flusher completes it at once,
//     as dm sends no flush to a target whose num_flush_bios is 0.
//   - Discarder: the target takes discards (fallocate PUNCH_HOLE), as a dm
//     target that sets num_discard_bios. A table takes discards only if every
//     target does and every device a target opened does too
//     (drivers/md/dm-table.c: dm_table_supports_discards); on a table that
//     does not, a discard fails with EOPNOTSUPP before any target sees it.
//   - DiscardOwner: a Discarder that completes discards itself whatever its
//     devices take (dm's discards_supported): zero drops them, error fails
//     them. Without it, a device below that takes no discards (Limiter)
//     takes them away from the whole table.
//   - ZeroWriter: the target takes write-zeroes (fallocate ZERO_RANGE), as a
//     dm target that sets num_write_zeroes_bios, under the same every-target,
//     every-device rule (dm_table_supports_write_zeroes). On a table that
//     does not, or when a target or device answers EOPNOTSUPP, the device
//     writes zeros instead, as ordinary writes of at most 1 MiB
//     (block/blk-lib.c: blkdev_issue_zeroout falls back to
//     blkdev_issue_zero_pages): over zero they succeed, over error they fail
//     with EIO. Only linear, striped and multipath take write-zeroes.
//   - Messager: the target takes `dmfuse message`. Without it a message
//     fails with "Target type does not support messages" (EINVAL).
//   - NoFlushStatuser: the target's INFO status does work first (thin-pool
//     commits its metadata) that `status --noflush` skips (dm's
//     DM_STATUS_NOFLUSH_FLAG): a status of type StatusInfoNoFlush calls
//     StatusNoFlush instead of Status(StatusInfo). Without it the flag is
//     ignored.
//   - Presuspender: Presuspend(noflush) runs before the suspend waits for the
//     I/O inside the device (and, without noflush, before new I/O is held).
//     A target that keeps I/O waiting inside its methods (delay's queue,
//     multipath with queue_if_no_path) must release it here, or the suspend
//     waits for it. Without it nothing runs.
//   - Postsuspender: Postsuspend runs once no I/O is inside the device.
//   - Preresumer: Preresume may refuse a resume; see Life cycle. Without it
//     the target never refuses.
//   - Resumer: Resume runs after every Preresume succeeded, before held I/O is
//     released.
//   - MaxIOer: MaxIO() in bytes, dm's max_io_len: no read or write piece
//     handed to the target crosses a multiple of it (striped: one chunk;
//     dust: one block). Discards and write-zeroes are split at segment ends
//     only (drivers/md/dm.c: __send_changing_extent_only). Without it, pieces
//     are cut at segment ends only.
//   - MapAccounter: the target decides at map time whether a piece is passed
//     on or killed, and calls StartAccounting; see Accounting. Without it the
//     table starts accounting before it calls the target.
//
// Underlying devices have one optional interface of their own: Limiter says
// whether a BlockDevice takes discards and write-zeroes (a block device's
// discard_max_bytes and write_zeroes_max_bytes; a Device's live table). A
// BlockDevice without it takes both.
//
// Remap is the core of the targets that map a segment onto one range of one
// device (drivers/md/dm-linear.c): linear is a Remap plus WriteZeroes;
// flakey, dust and delay embed it and override what they change. OpenArea
// and OpenRemap open a "<dev> <offset>" pair through Ctor.Open and check
// that the area lies on the device (drivers/md/dm-table.c:
// device_area_is_invalid), when the table is built rather than at resume.
//
// # Errors
//
// A constructor fails with an *ArgError: the reason in dm's words (the
// kernel's ti->error, plus which argument and why where dm says less) and the
// errno the kernel returns, EINVAL when zero (Errorf builds one). Build wraps
// it in a *TableError naming the line and the type, and the Manager wraps that
// in a *DeviceError naming the device, so a failed command prints as
// "NAME: line N: TARGET: reason", e.g. "d1: line 2: zero: Gap in table".
//
// I/O errors made up on purpose by a fault target (error, flakey, dust) are
// *InjectedError values: they match ErrInjected (errors.Is) and unwrap to
// EIO, the kernel's BLK_STS_IOERR, and no error of an underlying device
// matches ErrInjected, so a caller can tell an injected fault from a real
// one. They are preallocated, so failing an I/O allocates nothing.
// ErrPushBack is multipath's push-back (dm's DM_MAPIO_REQUEUE): during a
// noflush suspend the device holds the I/O and issues it again after resume
// (drivers/md/dm.c: dm_handle_requeue); otherwise it becomes EIO.
//
// The fs layer turns an error into the errno the caller sees: the
// syscall.Errno it wraps (errors.As), else EIO. The device's own errors:
// ENXIO when it has no live table (or was removed while I/O waited), EROFS
// for a write to a read-only device, ENOSPC for a write at or past the end,
// EOPNOTSUPP for a discard the table does not take.
//
// Numbers in target arguments and messages are read by the kernel's rules
// (package dmarg): Args.Uint and Args.Group as dm_read_arg's sscanf "%u%c"
// (no sign, leading white space skipped, a value too large wraps to 32
// bits), ParseSector as the targets' "%llu%c" for offsets (no '+'),
// ParseUint32 as kstrtouint (one '+' allowed, a value too large is an error).
//
// # Life cycle
//
// A Device has a live table, which I/O uses, and an inactive slot, which load
// fills; the life cycle is device-mapper's (drivers/md/dm-ioctl.c: table_load,
// do_resume; drivers/md/dm.c: __dm_suspend, dm_swap_table, dm_resume).
//
//   - Load (Manager.Load) builds the table at once: constructors run, devices
//     are opened and every area is checked against its device's size, so
//     argument errors are reported now (dm checks the areas at resume). The
//     table goes into the inactive slot, destroying any older inactive table;
//     a failed load keeps the older one. Live I/O is not affected.
//   - Suspend runs, in table order, each target's Presuspend(noflush); closes
//     the gate, so new I/O waits (uncounted, without a timeout) and the
//     suspend waits until no I/O is inside; then runs each Postsuspend. With
//     noflush, new I/O is held already before the presuspend hooks run, so
//     that I/O a target pushes back from them (ErrPushBack) waits at the gate
//     for resume. Suspending a suspended device does nothing.
//   - Resume with an inactive table first suspends the device (with flush) if
//     it is not suspended, then swaps the tables: the inactive table becomes
//     live, the device's read-only flag follows it, and the old live table is
//     closed once every reader of table contents (WithTables) is done. A
//     table is swapped only while the device is suspended and no I/O is
//     inside, so no I/O ever runs in a closed table. Then, if the device is
//     suspended: with no live table (or one of size 0) resume fails with
//     EINVAL; otherwise every Preresume runs in table order, then every
//     Resume (drivers/md/dm-table.c: dm_table_resume_targets), and the gate
//     opens: held I/O goes through the new live table. If a Preresume fails,
//     the swap has happened, as in dm: the new table is live, the device
//     stays suspended, and the error names the line.
//   - Remove refuses (EBUSY) a device that is open or that another device's
//     live or inactive table stacks on; otherwise the device is suspended
//     (its hooks run), both tables are destroyed and I/O still held fails
//     with ENXIO. With Flags.Force, Remove first loads and resumes an error
//     table of the same size, as `dmsetup remove --force` does, so that
//     outstanding I/O fails; if the device is still held then, the error
//     table stays live and the removal fails with EBUSY.
//   - Create (Manager.Create) is all-or-nothing: a device whose table does not
//     build or resume is removed again.
//
// The device's event counter (Device.EventNr) goes up on rename, uuid change
// and remove, and when a target raises a table event through Ctor.Event
// (striped after stripe errors, multipath on path and group changes); loads
// and resumes do not raise it.
//
// A message (Manager.Message, drivers/md/dm-ioctl.c: target_message) whose
// first word starts with '@' goes to ManagerOptions.CoreMessage (dm-stats); any other
// goes to the live target covering its sector ("Target message sector outside
// device", EINVAL, past the end). A device without a live table takes a
// message and answers nothing, as dm does when dm_get_live_table finds no
// table. A suspended device keeps its live table, and its targets get
// messages (multipath refuses them with EBUSY itself).
//
// # Locks
//
// From outermost to innermost; a lock is only ever taken while holding locks
// above it in this list, never below:
//
//  1. Device.ctl, one device's control lock: held for the whole of one
//     control operation on that device (Manager.Load, Clear, Suspend,
//     Resume, Remove, Rename, SetUUID; Device.Suspend, Load,
//     Resume), including a suspend's wait for the I/O inside and the
//     building of a table. It serialises control operations per device, as
//     dm's md->suspend_lock does. No code holds two devices' control locks
//     at once. Messages and readers of table contents do not take it.
//  2. Manager.graph: held while a table is built and put in the inactive
//     slot (Create, Load), so that two loads cannot make devices stack on
//     each other in a loop.
//  3. Manager.mu: the maps of names and minors. Held while a device argument
//     is resolved to a mapped device and counted as a holder of it, so that
//     Remove, which checks holders under it, never removes a device a new
//     table just took. Create takes a new device's ctl while holding it; no
//     one else can hold that device yet.
//  4. Device.tmu: taken shared by readers of table contents (WithTables:
//     table, status, info, messages) and exclusively, once, by retire after
//     a table is unreachable and before it is closed. retire runs under ctl.
//     A WithTables callback must not call control operations of its device.
//  5. Device.mu: name, uuid, read-only flag, the inactive slot, the suspended
//     and removed flags. Held briefly, never while waiting or while taking
//     another lock of this list; taken under m.mu for any device (dependsOn
//     walks the tables of others) and by I/O paths only to read a name.
//  6. Target-internal locks (multipath's mu, which is dm-mpath's m->lock;
//     dust's bad-block list; flakey's PRNG lock; delay's queue and scheduler
//     locks) and the locks of package stats (the dm-stats ctlMu, then
//     per-area locks): leaves, never held while calling into a device below
//     or while waiting for I/O.
//
// The gate is not a lock in this list, but it orders like one: every I/O
// holds its device's gate shared while it runs through the table (the
// kernel's DMF_BLOCK_IO_FOR_SUSPEND flag and md->pending_io count), including
// while it runs in devices below, and a
// suspend holds ctl while it waits for the gate to drain. So nothing on the
// I/O path may take ctl, graph, m.mu or tmu, or wait for anything that is held
// while one of them is. I/O passes the gates of stacked devices from top to
// bottom; tables cannot stack in a loop, so neither can gates.
//
// The listeners' OnChange and OnRemove (Manager.Subscribe) run with no
// manager lock held; OnRemove and every OnChange run after the device's ctl
// is released, except the first OnChange of a rename, which runs under it so
// that the fs layer forgets the old name before the new one exists. OnRemove
// runs after the device has left the table of names, so a listener that
// looks the name up no longer finds it. The CoreMessage hook runs with no lock
// of the device held, so it may suspend and resume the device.
//
// # Accounting
//
// Every Device counts its own I/O in its stats.Disk, as a bio-based dm
// device does since kernel 6.10 (drivers/md/dm.c: dm_io_acct, which calls
// block/blk-core.c: bdev_start_io_acct and bdev_end_io_acct, and
// drivers/md/dm-stats.c: dm_stats_account_io for dm-stats regions):
//
//   - The unit is the piece: each piece of a request split at a segment end
//     or a target's MaxIO is counted separately (a 16-sector read across a
//     striped chunk boundary is 2 reads), at completion, with its sectors
//     rounded up to whole sectors.
//   - A piece's start time is when the table began mapping it (drivers/md/dm.c:
//     alloc_io stamps io->start_time), so I/O held at a suspended device's
//     gate is neither in flight nor timed until it is released.
//   - For a target without MapAccounter the table starts accounting before
//     calling the target and always ends it: failures count as completed
//     I/O, as for an I/O error from the device below.
//   - A MapAccounter target (error, flakey, dust, delay, multipath) gets a
//     context that carries the piece; it calls StartAccounting(ctx) when it
//     passes the piece on or completes it itself (drivers/md/dm.c: __map_bio
//     starts accounting through dm_start_io_acct on DM_MAPIO_REMAPPED and
//     DM_MAPIO_SUBMITTED, dm_submit_bio_remap for targets that submit on
//     their own). A piece that fails without accounting started was killed
//     at map time (DM_MAPIO_KILL) and counts nothing; one that succeeds
//     without it is started and ended at completion (drivers/md/dm.c:
//     __dm_io_complete). delay starts accounting when the wait is over, so
//     in-flight excludes waiting I/O while the time fields include it. Only
//     MapAccounter targets may call StartAccounting: other targets' ctx may
//     belong to the device above.
//   - A flush is one piece for the whole table, counted once as a write of 0
//     sectors (ioop.Flush), whichever targets take it; the flush fields of
//     diskstats stay 0, as for every bio-based dm device.
//   - A discard or write-zeroes is one piece per segment (discards in the
//     discard group, write-zeroes as writes); the write-zeroes fallback is
//     counted as the writes it issues.
//   - A piece pushed back (ErrPushBack) before accounting started counts
//     nothing; the I/O issued again after resume is counted as new, as dm
//     accounts a deferred bio when it is submitted again.
//
// A Device without dm-stats regions pays one atomic pointer load per piece
// for them. The counters, io_ticks (block/blk-core.c: update_io_ticks) and
// the output formats are package stats'.
//
// # dm-stats
//
// A manager built with ManagerOptions.CoreMessage set to DMStatsMessage makes
// every device answer dm-stats' core messages
// (drivers/md/dm-stats.c: dm_stats_message), with the regions kept in the
// device's stats.Disk:
//
//	@stats_create <range> <step> [<n> <option>...] [<program_id> [<aux_data>]]
//	@stats_delete <id>
//	@stats_clear <id>
//	@stats_list [<program_id>]
//	@stats_print <id> [<first> <count>]
//	@stats_print_clear <id> [<first> <count>]
//	@stats_set_aux <id> <aux_data>
//
// The range is - (the live table; 1 sector without one) or <start>+<len>; the
// step <sectors> or /<areas>; the options precise_timestamps (times in ns
// instead of ms) and histogram:b1,b2,... (strictly increasing boundaries above
// 0). A word after the step that is a number is the option count, so a
// numeric program_id needs an explicit 0. The answer is the lowest free id. A
// region may reach past the end of the device, as in dm. Each @stats_print
// line is <area start>+<step> (also for a shorter last area) and 13 counters:
// reads, reads merged, sectors read, ms reading, the same four for writes,
// I/Os in flight, io_ticks, time_in_queue (the weighted value), read busy
// time, write busy time; then " b0:b1:...:bn" for a region with a histogram.
// A piece is counted in every area it overlaps, once in each, with the
// sectors it shares with the area (for a piece that is not sector-aligned,
// the sectors it touches); empty flushes are not counted. stats/dmstats.go
// describes the rest of the counting (the rounding of the time columns, the
// kernel's merged-column quirk).
//
// Errors are the kernel's: EINVAL ("Invalid parameters for message
// @stats_...") for bad words, an empty range, step 0, bad or repeated
// histogram boundaries and extra words; ENOENT for an unknown region;
// EOVERFLOW for more than 8,388,608 areas; ENOMEM when all regions together
// would need more than a quarter of RAM; ENFILE when no id is left. A failed
// message changes nothing; other @ words fail with "Unsupported message sent
// to DM core". Regions belong to their device: removing the device removes
// them, and a new device of the same name has none. Every region with a
// histogram is also a Prometheus histogram on the daemon's /metrics (buckets
// summed over areas, reads and writes together; le is the boundary minus one
// unit, since a bucket holds durations below its boundary).
//
// # Adding a target type
//
//  1. One file, stack/NAME.go, for a small kernel target, or a package of
//     its own, as delay, multipath, logwrites and powercut, when the target
//     brings machinery of its own; such a package uses only this package's
//     exported API. Either way: an exported *TargetType value with
//     the kernel target's name and version and its constructor; the table
//     syntax in the doc comment above the constructor, as newLinear and
//     newFlakey show it; errors in dm's words (Errorf, ArgError); device
//     arguments only through Ctor.Open (OpenArea, OpenRemap); a StatusTable
//     form the constructor reads back; and a compile-time assertion for each
//     optional interface it implements, as linear.go has them.
//  2. Its entry in package targets: one short file holding the type and its
//     conformance case (the parameters that make it usable over memory
//     devices and backing files, what it does with data, what it needs built
//     below it, and the checks that do not apply, each with the reason the
//     kernel's behaviour gives), and a line in targets.All. The dmfuse
//     command registers that list, and the conformance suite
//     (targets/conformance) runs every check that applies on it, in process
//     and through a mounted file on both transports.
//  3. Unit tests for its logic (stacktest.FaultDevice fails, holds and
//     counts the I/O that reaches its devices), its table and status lines in
//     testdata/tables.in (golden; stacktest.CheckTables for a package of its
//     own), and a fuzz target for its constructor and its messages.
package stack
