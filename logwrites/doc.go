// Package logwrites is dmfuse's log-writes target (Type, after the
// kernel's drivers/md/dm-log-writes.c, target version 1.1.0), the on-disk
// format of its log, a streaming reader of that format, and the replay-log engine
// (Replay) that `dmfuse replay-log` runs after reading its command line, as
// xfstests' src/log-writes/replay-log reads the log.
//
//   - target.go: the target: every write to the data device is passed on
//     and also recorded, with its data, on a log device, together with
//     flushes, FUA writes, discards and named marks;
//   - format.go: the super block and the entry headers;
//   - reader.go: a streaming reader that walks a log of any size with
//     bounded buffers;
//   - replay.go, replayeach.go: replay-log: find, count, replay and check
//     the entries of a log onto a device, with replay-log's output and
//     exit statuses, and dmfuse's --each.
//
// # Format
//
// A log is a sequence of log units of S bytes, S being the logical block size
// of the recorded device (512 or 4096). Unit 0 holds the super; entry 0 starts
// at unit 1. Each entry is one header unit followed, for a data write, by the
// written data (NrSectors units); discards, flushes and marks have no data.
// All integers are little-endian.
//
//	super  (unit 0):  magic u64 | version u64 | nr_entries u64 | sectorsize u32 | pad u32 | zeros
//	header (1 unit):  sector u64 | nr_sectors u64 | flags u64 | data_len u64 | mark name | zeros
//
// sector and nr_sectors count log units; data_len is the length of a mark's
// name in bytes and 0 for every other entry.
package logwrites
