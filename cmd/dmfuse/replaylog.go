package main

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

	"github.com/dmfuse/dmfuse/internal/getopt"
	"github.com/dmfuse/dmfuse/stack/logwrites"
)

// ReplayLogCmd is `dmfuse replay-log`: xfstests' src/log-writes/replay-log
// for logs of the log-writes target, with its command line, output and exit
// statuses, plus --each. The binary run under the name replay-log (a
// symlink) is the same program.
type ReplayLogCmd struct {
	Args []string `arg:"" optional:"" help:"replay-log's options: --log LOG [--replay DEV] [--limit N] [--next-flush] [--next-fua] [--start-entry N|--start-mark M] [--end-mark M] [--find] [--num-entries] [--no-discard] [--check fua|flush|discard|N --fsck CMD] [--start-sector S] [--end-sector S] [-v|-vv], and --each fua|flush|discard|N --fsck CMD [--each-from MARK] [--json]."`
}

// Run runs replay-log and exits with its status. As a dmfuse verb it also
// answers --help (and -h) with its usage on standard output; replay-log has
// no such option.
func (c *ReplayLogCmd) Run(*Globals) error {
	for _, a := range c.Args {
		if a == "--" {
			break
		}
		if a == "--help" || a == "-h" {
			fmt.Print(replayLogUsage)
			os.Exit(0)
		}
	}
	os.Exit(replayLog(append([]string{"dmfuse replay-log"}, c.Args...), os.Stdout, os.Stderr))
	return nil
}

// replay-log's option table, in its order (the order decides which option
// an abbreviation stands for), then dmfuse's additions.
const (
	optNextFlush = iota
	optNextFUA
	optStartEntry
	optEndMark
	optLog
	optReplay
	optLimit
	optVerbose
	optFind
	optNumEntries
	optNoDiscard
	optFsck
	optCheck
	optStartMark
	optStartSector
	optEndSector
	optEach
	optEachFrom
	optJSON
)

var replayLogOptions = []getopt.Option{
	{Name: "next-flush"},
	{Name: "next-fua"},
	{Name: "start-entry", HasArg: true},
	{Name: "end-mark", HasArg: true},
	{Name: "log", HasArg: true},
	{Name: "replay", HasArg: true},
	{Name: "limit", HasArg: true},
	{Name: "verbose", Val: 'v'},
	{Name: "find"},
	{Name: "num-entries"},
	{Name: "no-discard"},
	{Name: "fsck", HasArg: true},
	{Name: "check", HasArg: true},
	{Name: "start-mark", HasArg: true},
	{Name: "start-sector", HasArg: true},
	{Name: "end-sector", HasArg: true},
	{Name: "each", HasArg: true},
	{Name: "each-from", HasArg: true},
	{Name: "json"},
}

// replayLogUsage is replay-log's usage text (its typos and its
// --number-entries, which the option table spells --num-entries,
// included), then dmfuse's additions.
const replayLogUsage = `Usage: replay-log --log <logfile> [options]
	--replay <device> - replay onto a specific device
	--limit <number> - number of entries to replay
	--next-flush - replay to/find the next flush
	--next-fua - replay to/find the next fua
	--start-entry <entry> - start at the given entry #
	--start-mark <mark> - mark to start from
	--end-mark <mark> - replay to/find the given mark
	--find - put replay-log in find mode, will search based on the other options
	--number-entries - print the number of entries in the log
	--no-discard - don't process discard entries
	--fsck - the fsck command to run, must specify --check
	--check [<number>|flush|fua|discard] when to check the file system, mush specify --fsck
	--start-sector <sector> - replay ops on region from <sector> onto <device>
	--end-sector <sector> - replay ops on region to <sector> onto <device>
	-v or --verbose - print replayed ops
	-vv - print also skipped ops
` + replayLogUsageMore

// replayLogUsageMore describes dmfuse's additions.
const replayLogUsageMore = `	--each [<number>|flush|fua|discard] - replay onto --replay, run --fsck at every such point, stop at the first failure
	--each-from <mark> - with --each, check only from the first mark of that name on
	--json - with --each, one JSON object per point and a summary
`

// Check modes of --check and --each.
const (
	checkNumber = 1 + iota
	checkFUA
	checkFlush
	checkDiscard
)

// rlMaxMark is how much of a mark name replay-log keeps from its command
// line: 4097 minus its 40-byte entry struct.
const rlMaxMark = 4097 - logwrites.CheckSize

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
	checkMode                  int
	checkN                     uint64
	verbose                    int
	each                       *eachOptions

	logf    *os.File
	replayf *os.File
	r       *logwrites.Reader
	s       uint64
	nr      uint64
	// errno is C's errno as replay-log would see it: set by every failed
	// call, left alone by a short read.
	errno          syscall.Errno
	discardNotSupp bool
	zeros          []byte
	dataBytes      int64 // bytes of data written to the replay target
}

// replayLog runs replay-log with argv (argv[0] is the name messages start
// with) and returns its exit status.
func replayLog(argv []string, stdout, stderr io.Writer) (status int) {
	rl := &rlog{prog: argv[0], stdout: stdout, out: bufio.NewWriterSize(stdout, 64<<10), errw: stderr, endSector: 1<<64 - 1}
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
	rl.parse(argv[1:])
	if !rl.hasLog {
		rl.usage()
	}
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
		fmt.Fprintf(rl.out, "Log version=%d, sectorsize=%d, entries=%d\n", logwrites.Version, rl.s, rl.nr)
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
	io.WriteString(rl.errw, replayLogUsage)
	rl.exit(1)
}

// parse reads the options in order, acting on each as replay-log's main
// does (a bad number ends the program at once).
func (rl *rlog) parse(args []string) {
	_, posix := os.LookupEnv("POSIXLY_CORRECT")
	g := &getopt.Parser{Prog: rl.prog, Args: args, Shorts: "v", Longs: replayLogOptions, Posix: posix}
	number := func(s, what string) uint64 {
		v, ok := strtoull(s)
		if !ok {
			rl.fail("Invalid %s number\n", what)
		}
		return v
	}
	mark := func(s string) *string {
		if len(s) > rlMaxMark {
			s = s[:rlMaxMark]
		}
		return &s
	}
	for {
		o, ok, err := g.Next()
		if err != nil {
			fmt.Fprintln(rl.errw, err)
			rl.usage()
		}
		if !ok {
			return
		}
		if o.Val == 'v' {
			rl.verbose++
			continue
		}
		switch o.Long {
		case optNextFlush:
			rl.stopFlags |= logwrites.FlagFlush
		case optNextFUA:
			rl.stopFlags |= logwrites.FlagFUA
		case optStartEntry:
			rl.startEntry = number(o.Arg, "entry")
		case optStartMark:
			rl.startMark = mark(o.Arg)
		case optEndMark:
			rl.endMark = mark(o.Arg)
			rl.stopFlags |= logwrites.FlagMark
		case optLog:
			rl.logPath, rl.hasLog = o.Arg, true
		case optReplay:
			rl.replayPath, rl.hasReplay = o.Arg, true
		case optLimit:
			rl.limit = number(o.Arg, "entry")
		case optFind:
			rl.find = true
		case optNumEntries:
			rl.numEntries = true
		case optNoDiscard:
			rl.noDiscard = true
		case optFsck:
			rl.fsck, rl.hasFsck = o.Arg, true
		case optCheck:
			rl.checkMode, rl.checkN = rl.checkWord(o.Arg)
		case optStartSector:
			rl.startSector = number(o.Arg, "sector")
		case optEndSector:
			rl.endSector = number(o.Arg, "sector")
		case optEach:
			rl.eachOptions().mode, rl.eachOptions().n = rl.checkWord(o.Arg)
		case optEachFrom:
			rl.eachOptions().from = mark(o.Arg)
		case optJSON:
			rl.eachOptions().json = true
		default:
			rl.usage()
		}
	}
}

// checkWord reads the argument of --check or --each.
func (rl *rlog) checkWord(s string) (mode int, n uint64) {
	switch s {
	case "flush":
		return checkFlush, 0
	case "fua":
		return checkFUA, 0
	case "discard":
		return checkDiscard, 0
	}
	n, ok := strtoull(s)
	if n == 0 || !ok {
		rl.fail("Invalid entry number\n")
	}
	return checkNumber, n
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
	r, err := logwrites.Open(f, logwrites.Size(f), 0)
	var re *logwrites.ReadError
	var ve *logwrites.VersionError
	var se *logwrites.SectorSizeError
	switch {
	case errors.As(err, &re) && re.Err != nil:
		// replay-log compares read's -1 with an unsigned size, goes on
		// with a super it never read, and stops at the magic.
		rl.setErrno(re.Err)
		rl.fail("Magic doesn't match\n")
	case errors.As(err, &re):
		rl.fail("Error reading super: %d\n", rl.errno)
	case errors.Is(err, logwrites.ErrMagic):
		rl.fail("Magic doesn't match\n")
	case errors.As(err, &ve):
		rl.fail("Version mismatch, wanted %d, have %d\n", logwrites.Version, int32(ve.Version))
	case errors.As(err, &se):
		rl.fail("Unsupported sector size %d in the log's super (want %d to %d)\n", se.SectorSize, logwrites.CheckSize, logwrites.MaxSectorSize)
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
	var me *logwrites.MalformedError
	var re *logwrites.ReadError
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
func (rl *rlog) skipData(e *logwrites.Entry) error {
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
		e, err := rl.r.Next(logwrites.CheckSize)
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
func (rl *rlog) seekNext() (e *logwrites.Entry, ok bool) {
	if !rl.r.More() {
		return nil, true
	}
	e, err := rl.r.Next(int(rl.s))
	if err != nil {
		return nil, rl.entryError(err)
	}
	if rl.verbose > 1 {
		fmt.Fprintf(rl.out, "seek entry %d@%d: %d, size %d, flags 0x%x(%s)\n", int32(e.Index), rl.r.Pos()/int64(rl.s), e.Sector, e.NrSectors, e.Flags, logwrites.FlagNames(e.Flags))
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
		if shouldStop(e, logwrites.FlagMark, &name) {
			return
		}
	}
}

// shouldStop is replay-log's stop test: an entry with one of the flags
// stops; when the flags include FlagMark, only a mark of that name does.
func shouldStop(e *logwrites.Entry, flags uint64, mark *string) bool {
	if e.Flags&flags == 0 {
		return false
	}
	if flags&logwrites.FlagMark == 0 {
		return true
	}
	return e.Flags&logwrites.FlagMark != 0 && mark != nil && logwrites.MarkMatches(*mark, e.Unit, e.DataLen)
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
func checkPoint(mode int, every, n uint64, e *logwrites.Entry) bool {
	switch mode {
	case checkNumber:
		return n%every == 0
	case checkFUA:
		return e.Flags&logwrites.FlagFUA != 0
	case checkFlush:
		return e.Flags&logwrites.FlagFlush != 0
	case checkDiscard:
		return e.Flags&logwrites.FlagDiscard != 0
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
func (rl *rlog) replayNext() (e *logwrites.Entry, ok bool) {
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
		fmt.Fprintf(rl.vout, "%s %d@%d: sector %d, size %d, flags 0x%x(%s)\n", word, int32(e.Index), rl.r.Pos()/int64(rl.s), e.Sector, size, e.Flags, logwrites.FlagNames(e.Flags))
	}
	switch {
	case size == 0:
		return e, true
	case e.Flags&logwrites.FlagDiscard != 0:
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
