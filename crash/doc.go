// Package crash builds the states a power cut may leave on a device whose
// writes a log-writes log recorded, and checks them with a command: the
// engine of `dmfuse crash`.
//
// # The model
//
// A cut is a moment in the log: every entry up to it happened. At a cut,
// the writes logged before the last completed flush are on the device, and
// so is every FUA write; each other write since that flush may be on the
// device or not. A cut at a flush is the crash while that flush is in
// flight (the entry before it). The states of a cut, by Mode:
//
//   - Prefix: every write up to the cut kept: the one state replay-log
//     replays.
//   - Subset: any subset of the writes since the last flush lost, whole
//     (CrashMonkey's model).
//   - Sector: every tear unit of each of those writes kept or lost on its
//     own (FoundationDB's), so that a write tears at the unit. A unit larger
//     than the log's (4096 on a 512-byte log) makes a lost unit damage the
//     sectors of it the write did not cover, as a 512e disk's torn
//     read-modify-write damages the neighbouring logical sectors.
//
// What a lost unit reads as is the Fill: the old data, zeros, or junk drawn
// from the state's seed. A cut with at most Options.Limit states has all of
// them enumerated; one with more has Limit of them sampled from
// Options.Seed (one generator per cut, so that the states of a cut do not
// depend on the other cuts), Options.Clean being the chance that a sample
// loses nothing.
//
// # State ids
//
// A state's id names everything it is made of, so that it rebuilds
// exactly from the same log:
//
//	CUT[@UNIT]:LOST:FILL[.SEED]
//
// CUT is the cut's entry, UNIT the tear unit of torn writes, LOST "-" or
// the lost writes by log entry, comma-separated, a torn one as
// ENTRY/UNITS with its lost units dot-separated (0-3.7), FILL old, zero or
// junk (with the junk's seed). Record.Parse refuses an id that does not
// belong to the log.
//
// # Building a state
//
// The device of a state is an Overlay: the Base (a copy of the device's
// starting image, advanced cut by cut to the writes before the cut's last
// flush, the one copy of a run) with the writes since painted over it as the
// state keeps or loses them, their data read from the log when read, and
// the checker's own writes kept in memory. A Server shows each state as a
// regular file of the device's size in a FUSE folder, under a name of its
// own, so that a checker can fsck it, or mount it through a loop device,
// with no copy made.
//
// # Checking and shrinking
//
// Run checks the states of a cut in parallel (Run.Jobs) with a Checker,
// which runs the user's command with the state's file in DMFUSE_CRASH_DEV,
// kills it (its process group) after a timeout and keeps the end of its
// output. Run.Shrink looks for a smallest set of the lost writes (or torn
// units) of a failing state that still fails, by delta debugging (ddmin).
//
// # Recording
//
// The log comes from the log-writes target (package logwrites): a table
// `log-writes DEV LOGDEV`, the workload run on it, marks set with its
// `mark NAME` message where the test wants cuts.
package crash
