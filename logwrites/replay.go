package logwrites

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CheckMode says after which entries replay-log runs its check command
// (--check and --each).
type CheckMode int

// Check modes: every N-th entry, every FUA, flush or discard entry.
const (
	CheckNumber CheckMode = 1 + iota
	CheckFUA
	CheckFlush
	CheckDiscard
)

// ParseCheckMode reads the argument of --check and --each: flush, fua,
// discard or a number N above 0 (every N-th entry, read by parseNumber).
// ok is false for anything else.
func ParseCheckMode(s string, parseNumber func(string) (uint64, bool)) (mode CheckMode, n uint64, ok bool) {
	switch s {
	case "flush":
		return CheckFlush, 0, true
	case "fua":
		return CheckFUA, 0, true
	case "discard":
		return CheckDiscard, 0, true
	}
	n, ok = parseNumber(s)
	if n == 0 || !ok {
		return 0, 0, false
	}
	return CheckNumber, n, true
}

// ReplayOptions are the options of one run of replay-log, as its command
// line gives them (xfstests' src/log-writes/replay-log.c).
type ReplayOptions struct {
	// Prog is what dmfuse's own messages start with (argv[0]).
	Prog string
	// Usage is printed on standard error, and the run ends with status 1,
	// when a check command is given without a check mode or the other way
	// round, as replay-log prints its usage.
	Usage string
	// Log is the log to read (--log).
	Log string
	// Replay is the device or file to replay onto (--replay), if HasReplay.
	Replay    string
	HasReplay bool
	// Fsck is the check command (--fsck), run through /bin/sh, if HasFsck.
	Fsck    string
	HasFsck bool
	// StopFlags stops a replay or a find at the first entry with one of
	// these flags (FlagFlush: --next-flush, FlagFUA: --next-fua, FlagMark:
	// --end-mark, at a mark named EndMark).
	StopFlags uint64
	// EndMark and StartMark are the marks of --end-mark and --start-mark.
	EndMark, StartMark *string
	// StartEntry is the entry to start from (--start-entry); Limit the
	// number of entries to replay or search, 0 for all (--limit).
	StartEntry, Limit uint64
	// StartSector and EndSector bound the region whose writes are replayed
	// (--start-sector, --end-sector); EndSector is 2^64-1 for no bound.
	StartSector, EndSector uint64
	// Find (--find) prints the entry that meets the stop condition;
	// NumEntries (--num-entries) prints the number of entries.
	Find, NumEntries bool
	// NoDiscard (--no-discard) skips discard entries.
	NoDiscard bool
	// Check and CheckN are --check: when to run Fsck while replaying.
	Check  CheckMode
	CheckN uint64
	// Verbose is the count of -v: 1 prints replayed entries, 2 also
	// skipped ones.
	Verbose int
	// Each, when set, replays once onto Replay and runs Fsck at every
	// check point (dmfuse's --each).
	Each *EachOptions
}

// MaxReplayMark is how much of a mark name replay-log keeps from its
// command line: 4097 minus its 40-byte entry struct.
const MaxReplayMark = 4097 - CheckSize

// rlExit ends the program with a status; replayLog recovers it.
type rlExit int

// rlog is one run of replay-log.
type rlog struct {
	prog   string
	out    *bufio.Writer
	vout   *bufio.Writer // where -v lines go: out, or standard error under --json
	stdout io.Writer
	errw   io.Writer

	logPath, replayPath, fsck  string
	hasLog, hasReplay, hasFsck bool
	stopFlags                  uint64
	startEntry, limit          uint64
	startSector, endSector     uint64
	endMark, startMark         *string
	find, numEntries           bool
	noDiscard                  bool
	checkMode                  CheckMode
	checkN                     uint64
	verbose                    int
	each                       *EachOptions
	usageText                  string

	logf    *os.File
	replayf *os.File
	r       *Reader
	s       uint64
	nr      uint64
	// errno is C's errno as replay-log would see it: set by every failed
	// call, left alone by a short read.
	errno          syscall.Errno
	discardNotSupp bool
	zeros          []byte
	dataBytes      int64 // bytes of data written to the replay target
}

// Replay runs replay-log with the options o, writing what it prints to
// stdout and stderr, and returns its exit status: replay-log's (0, 1 and
// 255 as its code returns them) and, for --each, 2 when no check point was
// met.
func Replay(o ReplayOptions, stdout, stderr io.Writer) (status int) {
	rl := &rlog{prog: o.Prog, usageText: o.Usage, stdout: stdout, out: bufio.NewWriterSize(stdout, 64<<10), errw: stderr,
		logPath: o.Log, hasLog: true, replayPath: o.Replay, hasReplay: o.HasReplay, fsck: o.Fsck, hasFsck: o.HasFsck,
		stopFlags: o.StopFlags, startEntry: o.StartEntry, limit: o.Limit, startSector: o.StartSector, endSector: o.EndSector,
		endMark: o.EndMark, startMark: o.StartMark, find: o.Find, numEntries: o.NumEntries, noDiscard: o.NoDiscard,
		checkMode: o.Check, checkN: o.CheckN, verbose: o.Verbose, each: o.Each}
	rl.vout = rl.out
	defer func() {
		rl.flush()
		if rl.logf != nil {
			rl.logf.Close()
		}
		if rl.replayf != nil {
			rl.replayf.Close()
		}
		if v := recover(); v != nil {
			e, ok := v.(rlExit)
			if !ok {
				panic(v)
			}
			status = int(e)
		}
	}()
	rl.checkEach()
	rl.open()
	if rl.startMark != nil {
		rl.seekToMark(*rl.startMark)
	} else {
		rl.seekEntry(rl.startEntry)
	}
	if rl.each != nil {
		return rl.runEach()
	}
	if rl.hasFsck != (rl.checkMode != 0) {
		rl.usage()
	}
	switch {
	case rl.find:
		return rl.runFind()
	case rl.numEntries:
		fmt.Fprintf(rl.out, "%d\n", rl.nr)
		return 0
	case !rl.hasReplay:
		fmt.Fprintf(rl.out, "Log version=%d, sectorsize=%d, entries=%d\n", Version, rl.s, rl.nr)
		return 0
	}
	return rl.runReplay()
}

func (rl *rlog) exit(status int) { panic(rlExit(status)) }

// flush writes out what is buffered for standard output (and the -v lines).
func (rl *rlog) flush() {
	rl.out.Flush()
	rl.vout.Flush()
}

func (rl *rlog) fail(format string, a ...any) {
	rl.flush()
	fmt.Fprintf(rl.errw, format, a...)
	rl.exit(1)
}

func (rl *rlog) usage() {
	rl.flush()
	io.WriteString(rl.errw, rl.usageText)
	rl.exit(1)
}

// open opens the log and the replay target and reads the super
// (log_open).
func (rl *rlog) open() {
	f, err := os.Open(rl.logPath)
	if err != nil {
		rl.fail("Couldn't open log %s: %d\n", rl.logPath, rl.setErrno(err))
	}
	rl.logf = f
	if rl.hasReplay {
		if rl.replayf, err = os.OpenFile(rl.replayPath, os.O_WRONLY, 0); err != nil {
			rl.fail("Couldn't open replay file %s: %d\n", rl.replayPath, rl.setErrno(err))
		}
	}
	r, err := Open(f, Size(f), 0)
	var re *ReadError
	var ve *VersionError
	var se *SectorSizeError
	switch {
	case errors.As(err, &re) && re.Err != nil:
		// replay-log compares read's -1 with an unsigned size, goes on
		// with a super it never read, and stops at the magic.
		rl.setErrno(re.Err)
		rl.fail("Magic doesn't match\n")
	case errors.As(err, &re):
		rl.fail("Error reading super: %d\n", rl.errno)
	case errors.Is(err, ErrMagic):
		rl.fail("Magic doesn't match\n")
	case errors.As(err, &ve):
		rl.fail("Version mismatch, wanted %d, have %d\n", Version, int32(ve.Version))
	case errors.As(err, &se):
		rl.fail("Unsupported sector size %d in the log's super (want %d to %d)\n", se.SectorSize, CheckSize, MaxSectorSize)
	case err != nil:
		rl.fail("%v\n", err)
	}
	rl.r, rl.s, rl.nr = r, uint64(r.SectorSize()), r.Super().NrEntries
}

// setErrno records err's errno as C's errno and returns it; nil (a short
// read) leaves it unchanged.
func (rl *rlog) setErrno(err error) syscall.Errno {
	var e syscall.Errno
	if err != nil {
		if errors.As(err, &e) {
			rl.errno = e
		} else {
			rl.errno = syscall.EIO
		}
	}
	return rl.errno
}

// entryError reports a failed entry read as replay-log does and returns
// false.
func (rl *rlog) entryError(err error) bool {
	var me *MalformedError
	var re *ReadError
	rl.flush()
	switch {
	case errors.As(err, &me):
		fmt.Fprintf(rl.errw, "Malformed entry @%d\n", me.Unit)
	case errors.As(err, &re):
		fmt.Fprintf(rl.errw, "Error reading %s: %d\n", re.What, rl.setErrno(re.Err))
	default:
		fmt.Fprintf(rl.errw, "%v\n", err)
	}
	return false
}

// skipData moves past e's data as replay-log's lseek does: the log's file
// system (or block device) decides how far a file offset may go.
func (rl *rlog) skipData(e *Entry) error {
	if n, ok := rl.r.DataLen(e); ok && n == 0 {
		return nil
	}
	if err := rl.r.SkipData(e); err != nil {
		return err
	}
	_, err := unix.Seek(int(rl.logf.Fd()), rl.r.Pos(), io.SeekStart)
	return err
}

// seekError reports a failed move past an entry's data and returns false.
func (rl *rlog) seekError(err error) bool {
	rl.flush()
	fmt.Fprintf(rl.errw, "Error seeking in log: %d\n", rl.setErrno(err))
	return false
}

// seekEntry positions the log at entry n, reading only the fixed part of
// each header before it (log_seek_entry).
func (rl *rlog) seekEntry(n uint64) {
	if n >= rl.nr {
		rl.fail("Invalid entry number\n")
	}
	for i := uint64(0); i < n; i++ {
		e, err := rl.r.Next(CheckSize)
		if err != nil {
			rl.entryError(err)
			rl.exit(1)
		}
		if rl.verbose > 1 {
			fmt.Fprintf(rl.out, "seek entry %d@%d: %d, size %d, flags 0x%x\n", int32(i), e.Pos/int64(rl.s), e.Sector, e.NrSectors, e.Flags)
		}
		if err := rl.skipData(e); err != nil {
			rl.fail("Error seeking in file: %d\n", rl.setErrno(err))
		}
	}
}

// seekNext reads the next entry's header unit and skips its data
// (log_seek_next_entry). It returns nil at the end of the counted entries,
// and nil with ok false after an error it has reported.
func (rl *rlog) seekNext() (e *Entry, ok bool) {
	if !rl.r.More() {
		return nil, true
	}
	e, err := rl.r.Next(int(rl.s))
	if err != nil {
		return nil, rl.entryError(err)
	}
	if rl.verbose > 1 {
		fmt.Fprintf(rl.out, "seek entry %d@%d: %d, size %d, flags 0x%x(%s)\n", int32(e.Index), rl.r.Pos()/int64(rl.s), e.Sector, e.NrSectors, e.Flags, FlagNames(e.Flags))
	}
	if err := rl.skipData(e); err != nil {
		return nil, rl.seekError(err)
	}
	return e, true
}

// seekToMark moves past the first mark named name.
func (rl *rlog) seekToMark(name string) {
	for {
		e, ok := rl.seekNext()
		if !ok {
			rl.exit(1)
		}
		if e == nil {
			rl.fail("Couldn't find starting mark\n")
		}
		if shouldStop(e, FlagMark, &name) {
			return
		}
	}
}

// shouldStop is replay-log's stop test: an entry with one of the flags
// stops; when the flags include FlagMark, only a mark of that name does.
func shouldStop(e *Entry, flags uint64, mark *string) bool {
	if e.Flags&flags == 0 {
		return false
	}
	if flags&FlagMark == 0 {
		return true
	}
	return e.Flags&FlagMark != 0 && mark != nil && MarkMatches(*mark, e.Unit, e.DataLen)
}

// runFind prints <entry>@<log unit after it> for the first entry that
// meets the stop condition or the limit.
func (rl *rlog) runFind() int {
	for n := uint64(1); ; n++ {
		e, ok := rl.seekNext()
		if !ok {
			return 255
		}
		if e == nil {
			rl.flush()
			fmt.Fprintf(rl.errw, "Couldn't find entry\n")
			return 1
		}
		if rl.limit != 0 && n == rl.limit || shouldStop(e, rl.stopFlags, rl.endMark) {
			fmt.Fprintf(rl.out, "%d@%d\n", e.Index, rl.r.Pos()/int64(rl.s))
			return 0
		}
	}
}

// checkPoint reports whether the check mode asks for a check after entry e,
// the n-th replayed.
func checkPoint(mode CheckMode, every, n uint64, e *Entry) bool {
	switch mode {
	case CheckNumber:
		return n%every == 0
	case CheckFUA:
		return e.Flags&FlagFUA != 0
	case CheckFlush:
		return e.Flags&FlagFlush != 0
	case CheckDiscard:
		return e.Flags&FlagDiscard != 0
	}
	return false
}

// runReplay is replay-log's replay loop.
func (rl *rlog) runReplay() int {
	status := 0
	for n := uint64(1); ; n++ {
		e, ok := rl.replayNext()
		if !ok {
			status = 1
			break
		}
		if e == nil {
			break
		}
		if rl.hasFsck && checkPoint(rl.checkMode, rl.checkN, n, e) && !rl.runFsck() {
			rl.flush()
			fmt.Fprintf(rl.errw, "Fsck errored out on entry %d\n", e.Index)
			status = 1
			break
		}
		if rl.limit != 0 && n == rl.limit || shouldStop(e, rl.stopFlags, rl.endMark) {
			break
		}
	}
	rl.replayf.Sync()
	return status
}

// runFsck syncs the replay target and runs the check command through the
// shell as system(3) does. As replay-log reads the status with WEXITSTATUS,
// a command killed by a signal counts as a success.
func (rl *rlog) runFsck() bool {
	if err := rl.replayf.Sync(); err != nil {
		rl.setErrno(err)
		return false
	}
	rl.flush()
	cmd := exec.Command("/bin/sh", "-c", rl.fsck)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, rl.stdout, rl.errw
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode() <= 0
	}
	return err == nil
}

// replayNext reads the next entry and applies it to the replay target
// (log_replay_next_entry). It returns nil at the end of the counted
// entries, and nil with ok false after an error it has reported.
func (rl *rlog) replayNext() (e *Entry, ok bool) {
	if !rl.r.More() {
		return nil, true
	}
	e, err := rl.r.Next(int(rl.s))
	if err != nil {
		return nil, rl.entryError(err)
	}
	size := e.NrSectors * rl.s
	skip := e.NrSectors != 0 && (e.Sector+e.NrSectors <= rl.startSector || e.Sector > rl.endSector)
	if rl.verbose > 1 || rl.verbose > 0 && !skip {
		word := "replaying"
		if skip {
			word = "skipping"
		}
		fmt.Fprintf(rl.vout, "%s %d@%d: sector %d, size %d, flags 0x%x(%s)\n", word, int32(e.Index), rl.r.Pos()/int64(rl.s), e.Sector, size, e.Flags, FlagNames(e.Flags))
	}
	switch {
	case size == 0:
		return e, true
	case e.Flags&FlagDiscard != 0:
		return e, rl.discard(e.Sector*rl.s, size)
	case skip:
		if err := rl.skipData(e); err != nil {
			return nil, rl.seekError(err)
		}
		return e, true
	}
	if size > allocLimit() {
		// replay-log reads an entry's data into one malloc'd buffer; the
		// kernel refuses an allocation larger than memory and swap.
		rl.flush()
		fmt.Fprintf(rl.errw, "Error allocating buffer %d entry %d\n", size, e.Index)
		return nil, false
	}
	base := int64(e.Sector * rl.s)
	err = rl.r.Data(e, func(chunk []byte, off int64) error {
		if err := pwriteAll(rl.replayf, chunk, base+off); err != nil {
			rl.flush()
			fmt.Fprintf(rl.errw, "Error writing data: %d\n", rl.setErrno(err))
			return errReported
		}
		rl.dataBytes += int64(len(chunk))
		return nil
	})
	switch {
	case err == errReported:
		return nil, false
	case err != nil:
		return nil, rl.entryError(err)
	}
	return e, true
}

// allocLimit is the largest allocation the kernel's default overcommit
// heuristic grants: memory plus swap.
func allocLimit() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 1<<64 - 1
	}
	return (si.Totalram + si.Totalswap) * uint64(si.Unit)
}

// errReported is an error whose message is already printed.
var errReported = errors.New("reported")

func pwriteAll(f *os.File, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(int(f.Fd()), p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// replay-log's discard limits (log_discard, zero_range).
const (
	rlDiscardChunk = 1 << 30
	rlMaxZero      = 128 << 20
	rlZeroBuf      = 1 << 20
)

// discard replays a discard of [start, start+size) bytes as replay-log
// does (log_discard): in chunks of 1 GiB, BLKDISCARD while the target takes
// it, else zeros written over chunks of at most 128 MiB (larger ones are
// left as they are).
func (rl *rlog) discard(start, size uint64) bool {
	if rl.noDiscard {
		return true
	}
	for size > 0 {
		n := min(size, rlDiscardChunk)
		if !rl.discardNotSupp {
			r := [2]uint64{start, n}
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, rl.replayf.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&r))); e != 0 {
				rl.errno = e
				if rl.verbose > 0 {
					fmt.Fprintf(rl.vout, "replay device doesn't support discard, switching to writing zeros\n")
				}
				rl.discardNotSupp = true
			}
		}
		if rl.discardNotSupp && !rl.zeroRange(start, n) {
			return false
		}
		size -= n
		start += n
	}
	return true
}

func (rl *rlog) zeroRange(start, n uint64) bool {
	if n > rlMaxZero {
		if rl.verbose > 0 {
			fmt.Fprintf(rl.vout, "discard len %d larger than max %d\n", n, uint64(rlMaxZero))
		}
		return true
	}
	if rl.zeros == nil {
		rl.zeros = make([]byte, rlZeroBuf)
	}
	for n > 0 {
		m := min(n, rlZeroBuf)
		if err := pwriteAll(rl.replayf, rl.zeros[:m], int64(start)); err != nil {
			rl.flush()
			fmt.Fprintf(rl.errw, "Error zeroing file: %d\n", rl.setErrno(err))
			return false
		}
		start, n = start+m, n-m
	}
	return true
}
