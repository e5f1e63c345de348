package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/logwrites"
)

// tlEntry is one entry of a test log; writes carry nr units of fill.
type tlEntry struct {
	sector, nr, flags uint64
	name              string
	fill              byte
}

// buildLog lays out a log with unit s whose super counts count entries.
func buildLog(s int, count uint64, ents []tlEntry) []byte {
	b := make([]byte, s)
	logwrites.PutSuper(b, logwrites.Super{Magic: logwrites.Magic, Version: logwrites.Version, NrEntries: count, SectorSize: uint32(s)})
	for _, e := range ents {
		unit := make([]byte, s)
		logwrites.PutHeader(unit, logwrites.Header{Sector: e.sector, NrSectors: e.nr, Flags: e.flags, DataLen: uint64(len(e.name))}, e.name)
		b = append(b, unit...)
		if e.flags&logwrites.FlagDiscard == 0 {
			b = append(b, bytes.Repeat([]byte{e.fill}, int(e.nr)*s)...)
		}
	}
	return b
}

const (
	fFlush = logwrites.FlagFlush
	fFUA   = logwrites.FlagFUA
	fDisc  = logwrites.FlagDiscard
	fMark  = logwrites.FlagMark
	fMeta  = logwrites.FlagMetadata
)

var (
	// Log A: three writes, a flush, a mark.
	logAEntries = []tlEntry{{0, 1, 0, "", 0xaa}, {8, 2, 0, "", 0xbb}, {16, 1, 0, "", 0xcc}, {0, 0, fFlush, "", 0}, {0, 0, fMark, "mkfs", 0}}
	// Log B: a write, a flush, a FUA|META write, a discard, a flush, a mark.
	logBEntries = []tlEntry{{0, 8, 0, "", 0x11}, {0, 0, fFlush, "", 0}, {8, 1, fFUA | fMeta, "", 0x22}, {100, 2048, fDisc, "", 0}, {0, 0, fFlush, "", 0}, {0, 0, fMark, "fsync", 0}}
	// Log D: the generic/482 loop.
	logDEntries = []tlEntry{{0, 0, fMark, "mkfs", 0}, {0, 2, 0, "", 1}, {0, 0, fFlush, "", 0}, {64, 1, fFUA | fMeta, "", 2}, {8, 1, 0, "", 3}, {0, 0, fFlush, "", 0}, {65, 1, fFUA | fMeta, "", 4}, {0, 0, fMark, logwrites.EndMark, 0}}
)

// rlEnv is a folder with the vector logs and a replay target.
type rlEnv struct {
	t   *testing.T
	dir string
}

func newRLEnv(t *testing.T) *rlEnv {
	e := &rlEnv{t: t, dir: t.TempDir()}
	malformed := buildLog(512, 1, []tlEntry{{0, 1, 0, "", 7}})
	malformed[512+32] = 0x41
	badMagic := buildLog(512, 5, logAEntries)
	badMagic[0] ^= 1
	badVersion := buildLog(512, 5, logAEntries)
	badVersion[8] = 2
	logs := map[string][]byte{
		"A":          buildLog(512, 5, logAEntries),
		"Aend":       buildLog(512, 6, append(logAEntries[:5:5], tlEntry{0, 0, fMark, logwrites.EndMark, 0})),
		"B":          buildLog(512, 6, logBEntries),
		"C":          buildLog(4096, 2, []tlEntry{{2, 1, 0, "", 0x33}, {0, 0, fMark, logwrites.EndMark, 0}}),
		"D":          buildLog(512, 8, logDEntries),
		"empty":      buildLog(512, 0, nil),
		"malformed":  malformed,
		"magic":      badMagic,
		"version":    badVersion,
		"short":      []byte("rhswf"),
		"undercount": buildLog(512, 1, []tlEntry{{0, 1, 0, "", 5}, {1, 1, 0, "", 6}}),
	}
	for name, b := range logs {
		e.write(name, b)
	}
	e.fillTarget(0xff)
	return e
}

func (e *rlEnv) write(name string, b []byte) {
	if err := os.WriteFile(filepath.Join(e.dir, name), b, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// fillTarget makes R.img a 2 MiB file of b.
func (e *rlEnv) fillTarget(b byte) { e.write("R.img", bytes.Repeat([]byte{b}, 2<<20)) }

func (e *rlEnv) target() []byte {
	b, err := os.ReadFile(filepath.Join(e.dir, "R.img"))
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// run runs replay-log in the folder with args (log names and R.img
// relative) and returns stdout, stderr and the exit status.
func (e *rlEnv) run(args ...string) (string, string, int) {
	e.t.Helper()
	wd, _ := os.Getwd()
	if err := os.Chdir(e.dir); err != nil {
		e.t.Fatal(err)
	}
	defer os.Chdir(wd)
	var out, errb bytes.Buffer
	code := replayLog(append([]string{"replay-log"}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

// rlVector is one command with the output and status replay-log gives.
type rlVector struct {
	args           string
	stdout, stderr string
	code           int
}

var usageErr = replayLogUsage

// replayLogVectors are replay-log's outputs on the vector logs, recorded
// from xfstests' replay-log.
var replayLogVectors = []rlVector{
	{"--log A", "Log version=1, sectorsize=512, entries=5\n", "", 0},
	{"--log A --num-entries", "5\n", "", 0},
	{"--log Aend --num-entries", "6\n", "", 0},
	{"--log A --find --end-mark mkfs", "4@10\n", "", 0},
	{"--log A --find --next-flush", "3@9\n", "", 0},
	{"--log A --find --limit 2", "1@6\n", "", 0},
	{"--log A --find --start-entry 3 --limit 1", "3@9\n", "", 0},
	{"--log A --start-entry 0x3 --find --limit 1", "3@9\n", "", 0},
	{"--log A --find --next-fua", "", "Couldn't find entry\n", 1},
	{"--log A --find --end-mark mkf", "", "Couldn't find entry\n", 1},
	{"--log A --find --start-mark mkfs --next-flush", "", "Couldn't find entry\n", 1},
	{"-v --log A --replay R.img", "replaying 0@2: sector 0, size 512, flags 0x0(NONE)\nreplaying 1@4: sector 8, size 1024, flags 0x0(NONE)\nreplaying 2@7: sector 16, size 512, flags 0x0(NONE)\nreplaying 3@9: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 4@10: sector 0, size 0, flags 0x8(MARK)\n", "", 0},
	{"-vv --log A --replay R.img --start-sector 8 --end-sector 8", "skipping 0@2: sector 0, size 512, flags 0x0(NONE)\nreplaying 1@4: sector 8, size 1024, flags 0x0(NONE)\nskipping 2@7: sector 16, size 512, flags 0x0(NONE)\nreplaying 3@9: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 4@10: sector 0, size 0, flags 0x8(MARK)\n", "", 0},
	{"-vv --log A --replay R.img --limit 2", "replaying 0@2: sector 0, size 512, flags 0x0(NONE)\nreplaying 1@4: sector 8, size 1024, flags 0x0(NONE)\n", "", 0},
	{"-vv --log A --start-entry 3 --find --limit 2", "seek entry 0@1: 0, size 1, flags 0x0\nseek entry 1@3: 8, size 2, flags 0x0\nseek entry 2@6: 16, size 1, flags 0x0\nseek entry 3@9: 0, size 0, flags 0x1(FLUSH)\nseek entry 4@10: 0, size 0, flags 0x8(MARK)\n4@10\n", "", 0},
	{"--log A --start-mark nosuch", "", "Couldn't find starting mark\n", 1},
	{"--log A --start-entry 9", "", "Invalid entry number\n", 1},
	{"--log A --start-entry 3x", "", "Invalid entry number\n", 1},
	{"--log A --check fua", "", usageErr, 1},
	{"--log A --replay R.img --check 0 --fsck true", "", "Invalid entry number\n", 1},
	{"--log nosuch.img", "", "Couldn't open log nosuch.img: 2\n", 1},
	{"--replay R.img", "", usageErr, 1},
	{"--log A --number-entries", "", "replay-log: unrecognized option '--number-entries'\n" + usageErr, 1},
	{"--log A --n", "Log version=1, sectorsize=512, entries=5\n", "", 0},
	{"--log A --nu", "5\n", "", 0},

	{"--log B --find --next-fua", "2@13\n", "", 0},
	{"--log B --find --next-flush --start-entry 2", "4@15\n", "", 0},
	{"--log B --find --next-fua --end-mark fsync", "5@16\n", "", 0},
	{"--log B --find --start-entry 3 --next-fua", "", "Couldn't find entry\n", 1},
	{"-v --log B --replay R.img", "replaying 0@2: sector 0, size 4096, flags 0x0(NONE)\nreplaying 1@11: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 2@12: sector 8, size 512, flags 0x12(FUA|METADATA)\nreplaying 3@14: sector 100, size 1048576, flags 0x4(DISCARD)\nreplay device doesn't support discard, switching to writing zeros\nreplaying 4@15: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 5@16: sector 0, size 0, flags 0x8(MARK)\n", "", 0},
	{"-v --log B --replay R.img --no-discard", "replaying 0@2: sector 0, size 4096, flags 0x0(NONE)\nreplaying 1@11: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 2@12: sector 8, size 512, flags 0x12(FUA|METADATA)\nreplaying 3@14: sector 100, size 1048576, flags 0x4(DISCARD)\nreplaying 4@15: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 5@16: sector 0, size 0, flags 0x8(MARK)\n", "", 0},
	{"-vv --log B --replay R.img --start-sector 50 --end-sector 60", "skipping 0@2: sector 0, size 4096, flags 0x0(NONE)\nreplaying 1@11: sector 0, size 0, flags 0x1(FLUSH)\nskipping 2@12: sector 8, size 512, flags 0x12(FUA|METADATA)\nskipping 3@14: sector 100, size 1048576, flags 0x4(DISCARD)\nreplay device doesn't support discard, switching to writing zeros\nreplaying 4@15: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 5@16: sector 0, size 0, flags 0x8(MARK)\n", "", 0},
	{"-v --log B --replay R.img --next-fua", "replaying 0@2: sector 0, size 4096, flags 0x0(NONE)\nreplaying 1@11: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 2@12: sector 8, size 512, flags 0x12(FUA|METADATA)\n", "", 0},
	{"-v --log B --replay R.img --check fua --fsck false", "replaying 0@2: sector 0, size 4096, flags 0x0(NONE)\nreplaying 1@11: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 2@12: sector 8, size 512, flags 0x12(FUA|METADATA)\n", "Fsck errored out on entry 2\n", 1},
	{"--log B --replay R.img --check 2 --fsck 'echo FSCK'", "FSCK\nFSCK\nFSCK\n", "", 0},
	{"--log B --replay R.img --check flush --fsck 'echo FSCK'", "FSCK\nFSCK\n", "", 0},
	{"--log B --replay R.img --check discard --fsck 'echo FSCK'", "FSCK\n", "", 0},
	{"-v --log B --replay missing.img", "", "Couldn't open replay file missing.img: 2\n", 1},

	{"--log C", "Log version=1, sectorsize=4096, entries=2\n", "", 0},
	{"-v --log C --replay R.img", "replaying 0@2: sector 2, size 4096, flags 0x0(NONE)\nreplaying 1@4: sector 0, size 0, flags 0x8(MARK)\n", "", 0},
	{"--log C --find --end-mark dm-log-writes-end", "1@4\n", "", 0},

	{"--find --log D --end-mark mkfs", "0@2\n", "", 0},
	{"--find --log D --next-fua --start-entry 0", "3@8\n", "", 0},
	{"-vv --log D --replay R.img --limit 4", "replaying 0@2: sector 0, size 0, flags 0x8(MARK)\nreplaying 1@3: sector 0, size 1024, flags 0x0(NONE)\nreplaying 2@6: sector 0, size 0, flags 0x1(FLUSH)\nreplaying 3@7: sector 64, size 512, flags 0x12(FUA|METADATA)\n", "", 0},
	{"--find --log D --next-fua --start-entry 4", "6@13\n", "", 0},
	{"--find --log D --next-fua --start-entry 7", "", "Couldn't find entry\n", 1},
	{"--log D --num-entries", "8\n", "", 0},

	{"--log empty --num-entries", "", "Invalid entry number\n", 1},
	{"--log empty", "", "Invalid entry number\n", 1},
	{"--log empty --find --start-mark x", "", "Couldn't find starting mark\n", 1},
	{"-v --log malformed --replay R.img", "", "Malformed entry @1\n", 1},
	{"--log malformed --find --end-mark m", "", "Malformed entry @1\n", 255},
	{"--log magic --num-entries", "", "Magic doesn't match\n", 1},
	{"--log version", "", "Version mismatch, wanted 1, have 2\n", 1},
	{"--log short", "", "Error reading super: 0\n", 1},
	{"-v --log undercount --replay R.img", "replaying 0@2: sector 0, size 512, flags 0x0(NONE)\n", "", 0},
}

// splitShell splits a vector's command line at spaces, keeping 'quoted'
// words together.
func splitShell(s string) []string {
	var out []string
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		if strings.HasPrefix(s, "'") {
			end := strings.Index(s[1:], "'") + 1
			out = append(out, s[1:end])
			s = s[end+1:]
			continue
		}
		w, rest, _ := strings.Cut(s, " ")
		out = append(out, w)
		s = rest
	}
	return out
}

func TestReplayLogVectors(t *testing.T) {
	e := newRLEnv(t)
	for _, v := range replayLogVectors {
		e.fillTarget(0xff)
		out, errs, code := e.run(splitShell(v.args)...)
		if out != v.stdout || errs != v.stderr || code != v.code {
			t.Errorf("replay-log %s:\n got stdout %q stderr %q exit %d\nwant stdout %q stderr %q exit %d", v.args, out, errs, code, v.stdout, v.stderr, v.code)
		}
	}
}

// TestReplayLogTargets checks what the vector replays leave on the target.
func TestReplayLogTargets(t *testing.T) {
	e := newRLEnv(t)
	ff := func(n int) []byte { return bytes.Repeat([]byte{0xff}, n) }
	rep := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	for _, tc := range []struct {
		args string
		want [][]byte // the target's first bytes, in pieces
	}{
		{"--log A --replay R.img", [][]byte{rep(0xaa, 512), ff(3584), rep(0xbb, 1024), ff(3072), rep(0xcc, 512), ff(512)}},
		// The discard becomes zeros (a regular file takes no BLKDISCARD).
		{"--log B --replay R.img", [][]byte{rep(0x11, 4096), rep(0x22, 512), ff(51200 - 4608), make([]byte, 1048576), ff(2<<20 - 51200 - 1048576)}},
		{"--log B --replay R.img --no-discard", [][]byte{rep(0x11, 4096), rep(0x22, 512), ff(2<<20 - 4608)}},
		{"--log C --replay R.img", [][]byte{ff(8192), rep(0x33, 4096), ff(4096)}},
		{"--log A --replay R.img --start-sector 8 --end-sector 8", [][]byte{ff(4096), rep(0xbb, 1024), ff(4096)}},
	} {
		e.fillTarget(0xff)
		if _, errs, code := e.run(splitShell(tc.args)...); code != 0 {
			t.Fatalf("replay-log %s: exit %d: %s", tc.args, code, errs)
		}
		want := bytes.Join(tc.want, nil)
		if got := e.target()[:len(want)]; !bytes.Equal(got, want) {
			t.Errorf("replay-log %s: target differs from byte %d", tc.args, firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestReplayLogOptionParsing covers getopt_long's rules as glibc applies
// them to replay-log's table: abbreviations, ambiguity, arguments joined
// with =, clustered -v, errors.
func TestReplayLogOptionParsing(t *testing.T) {
	e := newRLEnv(t)
	for _, v := range optionVectors {
		out, errs, code := e.run(splitShell(v.args)...)
		if out != v.stdout || errs != v.stderr || code != v.code {
			t.Errorf("replay-log %s:\n got stdout %q stderr %q exit %d\nwant stdout %q stderr %q exit %d", v.args, out, errs, code, v.stdout, v.stderr, v.code)
		}
	}
}

// optionVectors exercise getopt_long's rules on replay-log's table.
var optionVectors = []rlVector{
	{"--l A", "Log version=1, sectorsize=512, entries=5\n", "", 0},
	{"--log=A --num", "5\n", "", 0},
	{"--log A --f", "", "replay-log: option '--f' is ambiguous; possibilities: '--find' '--fsck'\n" + usageErr, 1},
	{"--log A --find=x", "", "replay-log: option '--find' doesn't allow an argument\n" + usageErr, 1},
	{"--log A --limit", "", "replay-log: option '--limit' requires an argument\n" + usageErr, 1},
	{"--log A -x", "", "replay-log: invalid option -- 'x'\n" + usageErr, 1},
	{"--log A --bogus=1", "", "replay-log: unrecognized option '--bogus=1'\n" + usageErr, 1},
	{"stray --log A words", "Log version=1, sectorsize=512, entries=5\n", "", 0},
	{"--log A -- --num-entries", "Log version=1, sectorsize=512, entries=5\n", "", 0},
	{"--log A --st 3 --find --limit 1", "3@9\n", "", 0},
	{"--log A --e mkfs --find", "4@10\n", "", 0},
	{"-vvv --log A --replay R.img --limit 1", "replaying 0@2: sector 0, size 512, flags 0x0(NONE)\n", "", 0},
	{"--log A --start-entry 010 --find --limit 1", "", "Invalid entry number\n", 1}, // octal 8
	{"--log A --start-entry 04 --find --limit 1", "4@10\n", "", 0},
	{"--log A --start-entry '' --find --limit 1", "0@3\n", "", 0},
	{"--log A --start-entry ' 2' --find --limit 1", "2@8\n", "", 0},
	{"--log A --start-entry 0x --find", "", "Invalid entry number\n", 1},
	{"--log A --start-sector x", "", "Invalid sector number\n", 1},
	{"--log A --limit -1 --find", "", "Couldn't find entry\n", 1},
	{"--log A --check FUA --fsck true", "", "Invalid entry number\n", 1},
	{"--log A --fsck '' --check fua", "Log version=1, sectorsize=512, entries=5\n", "", 0},
}

// TestReplayLogEach walks the check points of Log D in one pass: the
// command sees each FUA point with its entry number in the environment,
// and a failing point stops the walk with the entry and a command that
// reproduces it.
func TestReplayLogEach(t *testing.T) {
	e := newRLEnv(t)
	e.fillTarget(0)
	out, errs, code := e.run("--log", "D", "--replay", "R.img", "--each", "fua", "--fsck", `echo "checked $DMFUSE_REPLAY_ENTRY $DMFUSE_REPLAY_TARGET"`)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	for _, want := range []string{"point 1: entry 3@7 (FUA|METADATA): clean", "point 2: entry 6@12 (FUA|METADATA): clean", "; 2 fua points checked\n", "all 2 fua points clean\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "checked 3") {
		t.Errorf("the command's output of a passing point was printed:\n%s", out)
	}

	// Fail at the second flush: stop there, the target as of entry 5.
	e.fillTarget(0)
	script := `test "$DMFUSE_REPLAY_ENTRY" != 5 || { echo "bad state at $DMFUSE_REPLAY_ENTRY"; exit 4; }`
	out, _, code = e.run("--log", "D", "--replay", "R.img", "--each", "flush", "--fsck", script)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{
		"point 1: entry 2@6 (FLUSH): clean",
		"point 2: entry 5@11 (FLUSH): FAILED (exit status 4)",
		"    bad state at 5\n",
		"first failure at entry 5 (flush point 2)",
		"replay-log --log D --replay R.img --limit 6 && DMFUSE_REPLAY_ENTRY=5 DMFUSE_REPLAY_TARGET=R.img sh -c ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "entry 6") {
		t.Errorf("the walk went on past the failure:\n%s", out)
	}
	got := e.target()
	if got[8*512] != 3 || got[65*512] != 0 {
		t.Errorf("target after the failure: sector 8 = %#x (want 3), sector 65 = %#x (want 0)", got[8*512], got[65*512])
	}

	// --each-from: only the points after the mark; --json for tools.
	e.fillTarget(0)
	out, _, code = e.run("--log", "B", "--replay", "R.img", "--each", "flush", "--each-from", "nosuch", "--fsck", "true")
	if code != 1 || !strings.Contains(out, "0 flush points checked") {
		t.Errorf("--each-from a missing mark: exit %d\n%s", code, out)
	}
	out, _, code = e.run("--log", "D", "--replay", "R.img", "--each", "2", "--json", "-v", "--fsck", "true")
	if code != 0 {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 {
		t.Fatalf("--json printed %d lines, want 4 points and a summary:\n%s", len(lines), out)
	}
	var p logwrites.EachPoint
	if err := json.Unmarshal([]byte(lines[0]), &p); err != nil || p.Point != 1 || p.Entry != 1 || !p.OK || p.Flags != "NONE" {
		t.Errorf("first point %q: %+v %v", lines[0], p, err)
	}
	var s logwrites.EachSummary
	if err := json.Unmarshal([]byte(lines[4]), &s); err != nil || !s.Summary || s.Points != 4 || s.Entries != 8 || s.Failed || s.Kind != "every-2" || s.DataBytes != 5*512 {
		t.Errorf("summary %q: %+v %v", lines[4], s, err)
	}
	// No point at all: exit 2, nothing checked.
	_, errs, code = e.run("--log", "A", "--replay", "R.img", "--each", "fua", "--fsck", "true")
	if code != 2 || !strings.Contains(errs, "no fua point in the log") {
		t.Errorf("a log without FUA entries: exit %d, %q", code, errs)
	}
	for _, args := range [][]string{
		{"--log", "A", "--each", "fua", "--fsck", "true"},
		{"--log", "A", "--replay", "R.img", "--each", "fua"},
		{"--log", "A", "--replay", "R.img", "--each", "fua", "--fsck", "true", "--check", "fua"},
		{"--log", "A", "--replay", "R.img", "--json"},
	} {
		if _, errs, code := e.run(args...); code != 1 || errs == "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errs)
		}
	}
}

// TestReplayLogAgainstXfstests runs every vector and the option cases with
// xfstests' own replay-log as well, when DMFUSE_XFSTESTS_REPLAY_LOG names
// one, and compares output, status and the replayed bytes.
func TestReplayLogAgainstXfstests(t *testing.T) {
	bin := os.Getenv("DMFUSE_XFSTESTS_REPLAY_LOG")
	if bin == "" {
		t.Skip("set DMFUSE_XFSTESTS_REPLAY_LOG to an xfstests src/log-writes/replay-log binary to compare with it")
	}
	e := newRLEnv(t)
	for _, v := range append(replayLogVectors, optionVectors...) {
		args := splitShell(v.args)
		if strings.Contains(v.args, "--fsck") {
			continue // the child's output interleaves differently with C's stdio buffers
		}
		e.fillTarget(0xff)
		out, errs, code := e.run(args...)
		ours := e.target()
		e.fillTarget(0xff)
		cmd := exec.Command(bin, args...)
		cmd.Dir = e.dir
		var cout, cerr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &cout, &cerr
		err := cmd.Run()
		ccode := 0
		if ee, ok := err.(*exec.ExitError); ok {
			ccode = ee.ExitCode()
		}
		cerrs := strings.ReplaceAll(cerr.String(), bin+":", "replay-log:")
		if out != cout.String() || strings.Replace(errs, replayLogUsageMore, "", 1) != cerrs || code != ccode {
			t.Errorf("%s:\n dmfuse stdout %q stderr %q exit %d\nxfstests stdout %q stderr %q exit %d", v.args, out, errs, code, cout.String(), cerr.String(), ccode)
		}
		if theirs := e.target(); !bytes.Equal(ours, theirs) {
			t.Errorf("%s: replayed bytes differ from byte %d", v.args, firstDiff(ours, theirs))
		}
	}
}

// runBoth runs args with dmfuse's and xfstests' replay-log on a fresh
// target each and reports any difference in output, status or bytes.
func (e *rlEnv) runBoth(t *testing.T, bin string, args []string) {
	t.Helper()
	e.fillTarget(0xff)
	out, errs, code := e.run(args...)
	ours := e.extents(t)
	e.fillTarget(0xff)
	cmd := exec.Command(bin, args...)
	cmd.Dir = e.dir
	var cout, cerr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &cout, &cerr
	err := cmd.Run()
	ccode := 0
	if ee, ok := err.(*exec.ExitError); ok {
		ccode = ee.ExitCode()
	}
	cerrs := strings.ReplaceAll(cerr.String(), bin+":", "replay-log:")
	if out != cout.String() || strings.Replace(errs, replayLogUsageMore, "", 1) != cerrs || code != ccode {
		t.Errorf("%q:\n dmfuse stdout %q stderr %q exit %d\nxfstests stdout %q stderr %q exit %d", args, out, errs, code, cout.String(), cerr.String(), ccode)
	}
	if theirs := e.extents(t); ours != theirs {
		t.Errorf("%q: replayed targets differ", args)
	}
}

// extents describes R.img by its size and the data in its allocated
// extents: a garbage sector makes the replay write far past 2 MiB, into a
// sparse file too large to read whole.
func (e *rlEnv) extents(t *testing.T) string {
	f, err := os.Open(filepath.Join(e.dir, "R.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	var b strings.Builder
	fmt.Fprintf(&b, "size %d\n", st.Size())
	for off := int64(0); off < st.Size(); {
		data, err := f.Seek(off, 3) // SEEK_DATA
		if err != nil {
			break
		}
		hole, err := f.Seek(data, 4) // SEEK_HOLE
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, min(hole-data, 8<<20))
		f.ReadAt(buf, data)
		fmt.Fprintf(&b, "%d: %x\n", data, sha256.Sum256(buf))
		off = hole
	}
	return b.String()
}

// TestReplayLogAgainstXfstestsRandom compares the two on damaged logs and
// random option sets, when DMFUSE_XFSTESTS_REPLAY_LOG names an xfstests
// replay-log.
func TestReplayLogAgainstXfstestsRandom(t *testing.T) {
	bin := os.Getenv("DMFUSE_XFSTESTS_REPLAY_LOG")
	if bin == "" {
		t.Skip("set DMFUSE_XFSTESTS_REPLAY_LOG to an xfstests src/log-writes/replay-log binary to compare with it")
	}
	e := newRLEnv(t)
	seed, _ := strconv.ParseUint(os.Getenv("DMFUSE_XFSTESTS_SEED"), 10, 64)
	r := rand.New(rand.NewPCG(1, seed))
	bases := [][]byte{buildLog(512, 5, logAEntries), buildLog(512, 6, logBEntries), buildLog(512, 8, logDEntries),
		buildLog(4096, 2, []tlEntry{{2, 1, 0, "", 0x33}, {0, 0, fMark, logwrites.EndMark, 0}})}
	words := [][]string{{"-v"}, {"-vv"}, {"--find"}, {"--num-entries"}, {"--no-discard"}, {"--next-fua"}, {"--next-flush"},
		{"--end-mark", "mkfs"}, {"--end-mark", "fsync"}, {"--end-mark", "dm-log-writes-end"}, {"--start-mark", "mkfs"},
		{"--start-entry", "1"}, {"--start-entry", "3"}, {"--limit", "2"}, {"--limit", "5"}, {"--replay", "R.img"},
		{"--start-sector", "8"}, {"--end-sector", "64"}, {"--check", "fua", "--fsck", "true"}}
	for i := range 400 {
		log := bytes.Clone(bases[r.IntN(len(bases))])
		switch r.IntN(4) {
		case 0: // a random byte in the first units
			log[r.IntN(min(len(log), 4096))] = byte(r.Uint32())
		case 1: // cut
			log = log[:r.IntN(len(log)+1)]
		case 2: // a header field set to garbage
			off := 512*(1+r.IntN(max(1, len(log)/512-1))) + 8*r.IntN(4)
			if off+8 <= len(log) {
				// Below 2^50: dmfuse refuses a data length that
				// overflows 64 bits, which replay-log wraps.
				binary := r.Uint64() >> (14 + r.IntN(50))
				for k := range 8 {
					log[off+k] = byte(binary >> (8 * k))
				}
			}
		}
		e.write("fz", log)
		args := []string{"--log", "fz"}
		for range r.IntN(4) {
			args = append(args, words[r.IntN(len(words))]...)
		}
		if r.IntN(3) > 0 {
			args = append(args, "--replay", "R.img")
		}
		e.runBoth(t, bin, args)
		if t.Failed() {
			t.Fatalf("case %d; log written to %s", i, filepath.Join(e.dir, "fz"))
		}
	}
	fmt.Fprintln(os.Stderr, "compared 400 random cases")
}
