package dmsetup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// vector is one command of dmsetup's test vectors with its exact output.
type vector struct {
	stdin    string
	args     []string
	out, err string
	code     int
}

func (h *harness) check(vs []vector) {
	h.t.Helper()
	for _, v := range vs {
		out, errs, code := h.run(v.stdin, v.args...)
		if out != v.out || errs != v.err || code != v.code {
			h.t.Errorf("dmsetup %s:\n got stdout %q\n     stderr %q\n     exit %d\nwant stdout %q\n     stderr %q\n     exit %d",
				strings.Join(v.args, " "), out, errs, code, v.out, v.err, v.code)
		}
	}
}

func args(s ...string) []string { return s }

const failed = "Command failed.\n"

// TestDmsetupVectorsLifecycle follows dmsetup's test vectors V1 to V12 (create,
// info, table and status, ls, deps, columns, absent devices, load errors,
// failed create, table files, suspend, remove, messages). Tables use a
// file where the vectors use 7:0.
func TestDmsetupVectorsLifecycle(t *testing.T) {
	h := newHarness(t)
	a := filepath.Join(h.dir, "a.img")
	info := "Name:              test\nState:             ACTIVE\nRead Ahead:        256\nTables present:    LIVE\n" +
		"Open count:        0\nEvent number:      0\nMajor, minor:      253, 0\nNumber of targets: 1\n\n"
	h.check([]vector{
		// V1, V2
		{args: args("create", "test", "--table", "0 8192 linear "+a+" 0")},
		{args: args("info", "test"), out: info},
		{args: args("table", "test"), out: "0 8192 linear " + a + " 0\n"},
		{args: args("status", "test"), out: "0 8192 linear \n"},
		{args: args("table"), out: "test: 0 8192 linear " + a + " 0\n"},
		{args: args("status"), out: "test: 0 8192 linear \n"},
		// V3
		{args: args("ls"), out: "test\t(253:0)\n"},
		{args: args("ls", "--target", "linear"), out: "test\t(253, 0)\n"},
		{args: args("ls", "--target", "zero")},
		{args: args("deps", "test"), out: "1 dependencies\t: (" + a + ")\n"},
		// V4
		{args: args("info", "-c", "test"), out: "Name             Maj Min Stat Open Targ Event  UUID                            \n" +
			"test             253   0 L--w    0    1      0                                 \n"},
		{args: args("info", "-c", "--noheadings", "test"), out: "test:253:0:L--w:0:1:0:\n"},
		{args: args("info", "-c", "--separator", ",", "test"), out: "Name,Maj,Min,Stat,Open,Targ,Event,UUID\ntest,253,0,L--w,0,1,0,\n"},
		{args: args("info", "-c", "--noheadings", "-o", "name,blkdevname,attr,major,minor,open,segments,events", "--separator", " ", "test"),
			out: "test dm-0 L--w 253 0 0 1 0\n"},
		{args: args("info", "-c", "--nameprefixes", "--noheadings", "-o", "name,open", "test"), out: "DM_NAME='test':DM_OPEN='0'\n"},
		// Rows gathered before a failure are still printed.
		{args: args("info", "-c", "-o", "name", "test", "nosuch"), out: "Name            \ntest            \n",
			err: "Device does not exist.\n" + failed, code: 1},
		{args: args("info", "-c", "--rows", "test"), out: "Name test\nMaj 253\nMin 0\nStat L--w\nOpen 0\nTarg 1\nEvent 0\nUUID \n"},
		// V5
		{args: args("info", "nosuch"), err: "Device does not exist.\n" + failed, code: 1},
		{args: args("status", "nosuch"), err: "Device does not exist.\n" + failed, code: 1},
		{args: args("table", "nosuch"), err: "device-mapper: table ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("deps", "nosuch"), err: "device-mapper: deps ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("remove", "nosuch"), err: "device-mapper: remove ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("suspend", "nosuch"), err: "device-mapper: suspend ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("resume", "nosuch"), err: "device-mapper: resume ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("load", "nosuch", "--table", "0 1 zero"), err: "device-mapper: reload ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("message", "nosuch", "0", "foo"), err: "device-mapper: message ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("clear", "nosuch"), err: "device-mapper: clear ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("wait", "nosuch"), err: "device-mapper: waitevent ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		// V6
		{args: args("load", "test", "--table", "0 10 foo"), err: "device-mapper: reload ioctl on test  failed: Invalid argument\n" + failed, code: 1},
		{args: args("load", "test", "--table", "0 10"), err: "Invalid format on line 1 of table .\n" + failed, code: 1},
		{stdin: "0 10 zero\nbad\n", args: args("load", "test"), err: "Invalid format on line 2 of table on stdin.\n" + failed, code: 1},
		{args: args("load", "test"), err: "device-mapper: reload ioctl on test  failed: Invalid argument\n" + failed, code: 1},
		// V7
		{args: args("create", "bad1", "--table", "0 10 foo"), err: "device-mapper: reload ioctl on bad1 (253:1) failed: Invalid argument\n" + failed, code: 1},
		{args: args("ls"), out: "test\t(253:0)\n"},
		// With -v the reason dmfuse gives comes first.
		{args: args("-v", "load", "test", "--table", "0 10 foo"), err: "dmfuse: test: line 1: foo: unknown target type\n" +
			"device-mapper: reload ioctl on test  failed: Invalid argument\n" + failed, code: 1},
	})
	// V8
	file := filepath.Join(h.dir, "t.table")
	if err := os.WriteFile(file, []byte("0 10 zero\n# c\n\n  10 10 error  # comment\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.check([]vector{
		{args: args("load", "test", file)},
		{args: args("table", "--inactive", "test"), out: "0 10 zero \n10 10 error \n"},
		{args: args("info", "-c", "-o", "name,attr,tables_loaded", "test"), out: "Name             Stat Tables\ntest             LI-w Both  \n"},
		{args: args("load", "test", filepath.Join(h.dir, "nosuch")), err: "Couldn't open '" + filepath.Join(h.dir, "nosuch") + "' for reading.\n" + failed, code: 1},
		{args: args("clear", "test")},
		// V9
		{args: args("suspend", "test")},
		{args: args("suspend", "test")},
		{args: args("info", "-c", "-o", "name,attr", "test"), out: "Name             Stat\ntest             L-sw\n"},
		{args: args("-v", "resume", "test"), out: info},
	})
	// V10: the device is held open.
	h.mgr.Lookup("test").AddOpen(1)
	busy := "device-mapper: remove ioctl on test  failed: Device or resource busy\n"
	h.check([]vector{
		{args: args("remove", "test"), err: busy + failed, code: 1},
		{args: args("remove", "--retry", "test"), err: strings.Repeat(busy, 25) + failed, code: 1},
	})
	if h.slept != 24*200*time.Millisecond {
		t.Errorf("remove --retry waited %v, want 4.8s", h.slept)
	}
	h.check([]vector{
		{args: args("remove", "--deferred", "test")},
		{args: args("info", "test"), out: strings.Replace(strings.Replace(info, "ACTIVE", "ACTIVE (DEFERRED REMOVE)", 1), "Open count:        0", "Open count:        1", 1)},
		{args: args("message", "test", "0", "@cancel_deferred_remove")},
		{args: args("info", "test"), out: strings.Replace(info, "Open count:        0", "Open count:        1", 1)},
	})
	h.mgr.Lookup("test").AddOpen(-1)
	// V11
	h.check([]vector{
		{args: args("create", "nt", "--notable")},
		{args: args("remove", "-f", "nt"), err: "device-mapper: reload ioctl on nt  failed: Invalid argument\n"},
		{args: args("remove", "-f", "nosuch"), err: "device-mapper: table ioctl on nosuch  failed: No such device or address\n" +
			"device-mapper: reload ioctl on nosuch  failed: No such device or address\n" +
			"device-mapper: remove ioctl on nosuch  failed: No such device or address\n" + failed, code: 1},
		{args: args("ls"), out: "test\t(253:0)\n"},
	})
	// V12
	h.check([]vector{
		{args: args("create", "d1", "--table", "0 2048 dust "+a+" 0 512")},
		{args: args("message", "d1", "0", "addbadblock", "60")},
		{args: args("message", "d1", "0", "countbadblocks"), out: "countbadblocks: 1 badblock(s) found\n"},
		{args: args("message", "d1", "0", "listbadblocks"), out: "60\n"},
		{args: args("message", "d1", "0", "clearbadblocks"), out: "dust_clear_badblocks: badblocks cleared\n"},
		{args: args("message", "d1", "0", "listbadblocks"), out: "No blocks in badblocklist\n"},
		{args: args("message", "d1", "abc", "x"), err: "Invalid sector.\n" + failed, code: 1},
		{args: args("message", "d1", "0"), err: "No message supplied.\ndevice-mapper: message ioctl on d1  failed: Invalid argument\n" + failed, code: 1},
		// Words are joined with single spaces.
		{args: args("message", "d1", "0", "addbadblock 61"), out: ""},
		{args: args("message", "d1", "0", "queryblock", "61"), out: "dust_query_block: block 61 found in badblocklist\n"},
	})
}

// TestDmsetupVectorsParsing follows V13 to V19: paths, dispatch and option
// errors, rename, empty lists (without starting a daemon), version,
// concise create and the udev verbs.
func TestDmsetupVectorsParsing(t *testing.T) {
	h := newHarness(t)
	usageText := captureUsage()
	h.check([]vector{
		// V16, before any daemon runs.
		{args: args("ls"), out: "No devices found\n"},
		{args: args("info"), out: "No devices found\n"},
		{args: args("info", "-c"), out: "No devices found\n"},
		{args: args("table"), out: "No devices found\n"},
		{args: args("status"), out: "No devices found\n"},
		{args: args("deps"), out: "No devices found\n"},
		{args: args("ls", "--tree"), out: "No devices found\n"},
		{args: args("remove_all")},
		{args: args("info", "nosuch"), err: "Device does not exist.\n" + failed, code: 1},
		// V14
		{args: args(), err: usageText, code: 1},
		{args: args("frobnicate"), err: "Unknown command.\n" + usageText, code: 1},
		{args: args("message", "x"), err: "Incorrect number of arguments.\n" + usageText, code: 1},
		{args: args("create", "a", "b", "c"), err: "Incorrect number of arguments.\n" + usageText, code: 1},
		{args: args("rename"), err: "Incorrect number of arguments.\n" + usageText, code: 1},
		{args: args("create", "x", "--table", "0 10 zero", "--notable"), err: "--table and --notable are incompatible.\nCouldn't process command line.\n", code: 1},
		{args: args("info", "-j", "253"), err: "Please specify both major number and minor number.\nCouldn't process command line.\n", code: 1},
		{args: args("--verbose", "x", "info"), out: "No devices found\n"},
		{args: args("-h"), err: usageText},
		{args: args("help"), err: usageText},
		{args: args("--bogus", "info"), err: "dmsetup: unrecognized option '--bogus'\nCouldn't process command line.\n", code: 1},
		{args: args("-x", "info"), err: "dmsetup: invalid option -- 'x'\nCouldn't process command line.\n", code: 1},
		{args: args("info", "--table"), err: "dmsetup: option '--table' requires an argument\nCouldn't process command line.\n", code: 1},
		{args: args("-u"), err: "dmsetup: option requires an argument -- 'u'\nCouldn't process command line.\n", code: 1},
		{args: args("--ta", "x", "info"), err: "dmsetup: option '--ta' is ambiguous; possibilities: '--table' '--target'\nCouldn't process command line.\n", code: 1},
		{args: args("--force=1", "info"), err: "dmsetup: option '--force' doesn't allow an argument\nCouldn't process command line.\n", code: 1},
		{args: args("ls", "-o", "bogus,devno"), err: "Option not recognised: bogus,devno.\nCouldn't process command line.\n", code: 1},
		{args: args("ls", "--tree", "-o", "bogus"), err: "Tree option not recognised: bogus.\nCouldn't process command line.\n", code: 1},
		{args: args("info", "-o", "name"), err: "Option not recognised: name.\nCouldn't process command line.\n", code: 1},
		{args: args("create"), err: "Please provide a name for the new device.\n" + failed, code: 1},
		{args: args("load"), err: "Please specify device.\n" + failed, code: 1},
		{args: args("load", "-n", "x"), err: "--notable only available when creating new device.\n" + failed, code: 1},
		{args: args("create", "sl/ash", "--table", "0 1 zero"), err: "Name \"sl/ash\" invalid. It contains \"/\".\n" + failed, code: 1},
		{args: args("info", strings.Repeat("n", 128)), err: "Name \"" + strings.Repeat("n", 128) + "\" too long.\n" + failed, code: 1},
		{args: args("suspend"), err: "No device specified.\n" + failed, code: 1},
	})
	if h.starts != 0 {
		t.Fatalf("a command that does not create started a daemon (%d)", h.starts)
	}
	h.check([]vector{
		{args: args("--tab", "0 8 zero", "create", "t1")},
		{args: args("create", "--noudevsync", "d1", "--table", "0 8 zero")},
		// V13
		{args: args("info", "/dev/mapper/nosuch"), err: "Device /dev/mapper/nosuch not found\n" + failed, code: 1},
		{args: args("info", "mapper/nosuch"), err: "Device mapper/nosuch not found\n" + failed, code: 1},
		{args: args("info", "/dev/null"), err: "Device null not found\n" + failed, code: 1},
		// A device without a node resolves from the mapper folder's path.
		{args: args("info", "-c", "-o", "name", filepath.Join(h.devDir, "mapper", "d1")), out: "Name            \nd1              \n"},
		{args: args("info", "-c", "-o", "name", "mapper/d1"), out: "Name            \nd1              \n"},
		// V15
		{args: args("create", "lw", "--table", "0 8 zero")},
		{args: args("rename", "lw", "lw2")},
		{args: args("rename", "lw2", "d1"), err: "device-mapper: rename ioctl on lw2  failed: Device or resource busy\n" + failed, code: 1},
		{args: args("rename", "lw2", "--setuuid", "U1")},
		{args: args("rename", "lw2", "--setuuid", "U2"), err: "device-mapper: rename ioctl on lw2  failed: Invalid argument\n" + failed, code: 1},
		{args: args("rename", "lw2", "a/b"), err: "Name \"a/b\" invalid. It contains \"/\".\n" + failed, code: 1},
		{args: args("info", "-u", "U1", "-c", "-o", "name,uuid"), out: "Name             UUID                            \nlw2              U1                              \n"},
		{args: args("remove", "-u", "nosuch"), err: "device-mapper: remove ioctl on  nosuch failed: No such device or address\n" + failed, code: 1},
		{args: args("remove", "-j", "253", "-m", "9"), err: "device-mapper: remove ioctl on  (253:9) failed: No such device or address\n" + failed, code: 1},
		// V17
		{args: args("version"), out: "Library version:   1.02.213 (2026-03-13)\nDriver version:    4.50.0\n"},
		{args: args("--version"), out: "Library version:   1.02.213 (2026-03-13)\nDriver version:    4.50.0\n"},
		// V18
		{args: args("create", "--concise", "c1,,,ro,0 8 zero,8 8 error;c2,UU,7,,0 1 zero")},
		{args: args("info", "-c", "-o", "name,attr,minor,uuid", "c1", "c2"), out: "Name             Stat Min UUID                            \n" +
			"c1               L--r   3                                 \nc2               L--w   7 UU                              \n"},
		{args: args("table", "--concise", "c2", "c1"), out: "c2,UU,7,rw,0 1 zero ;c1,,3,ro,0 8 zero ,8 8 error \n"},
		{args: args("create", "--concise", "x,,;"), err: "Five comma-separated fields are required for each device\n" +
			"Parsed 3 fields: name: x uuid:  minor:  flags: (null) table: (null)\n" + failed, code: 1},
		{args: args("create", "--concise", "x,,"), err: "Incomplete entry: five comma-separated fields are required for each device\n" +
			"Parsed 3 fields: name: x uuid:  minor:  flags: (null) table: (null)\n" + failed, code: 1},
		{args: args("create", "--concise", "x\\"), err: "Backslash must be followed by another character at end of string.\n" +
			"Parsed 1 fields: name: x uuid: (null) minor: (null) flags: (null) table: (null)\n" + failed, code: 1},
		{args: args("create", "--concise", "x,,,bad,0 1 zero"), err: "Invalid flags parameter 'bad' must be 'ro' or 'rw' or empty.\n" + failed, code: 1},
		{args: args("create", "--concise", "--table", "0 1 zero", "x,,,,0 1 zero"), err: "--concise is incompatible with --[no]table, --minor, --uuid and --inactive.\n" + failed, code: 1},
		// Several names: processed in order, stopping at the first failure.
		{args: args("status", "c1", "nosuch", "c2"), out: "c1: 0 8 zero \nc1: 8 8 error \n", err: "Device does not exist.\n" + failed, code: 1},
		// V19
		{args: args("udevcookies"), out: "Cookie       Semid      Value      Last semop time           Last change time\n"},
		{args: args("udevcomplete_all", "-y"), out: "0 semaphores with keys prefixed by 3405 (0xd4d) destroyed. 0 skipped.\n"},
		{stdin: "n\n", args: args("udevcomplete_all"), out: "Do you really want to continue? [y/n]: Semaphores with keys prefixed by 3405 (0xd4d) NOT destroyed.\n",
			err: "WARNING: This operation will destroy all semaphores with keys that have a prefix 3405 (0xd4d).\n"},
		{args: args("udevcomplete", "0"), err: "Incorrect cookie value.\n" + failed, code: 1},
		{args: args("udevflags", "0x00200001"), out: "DM_UDEV_DISABLE_LIBRARY_FALLBACK_FLAG='1'\n"},
	})
	if h.starts != 1 {
		t.Errorf("daemon started %d times, want once", h.starts)
	}
}

// TestDmsetupNotRoot: a caller who is not root gets one line, and no daemon.
func TestDmsetupNotRoot(t *testing.T) {
	h := newHarness(t)
	var out, errb strings.Builder
	code := Run(&Env{Prog: "dmsetup", Args: []string{"create", "x", "--table", "0 8 zero"}, Stdin: strings.NewReader(""),
		Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" },
		Connect: func(bool) (Caller, error) { h.starts++; return nil, nil }})
	if code != 1 || out.String() != "" || errb.String() != "dmsetup: permission denied: managing dmfuse devices needs root.\n" || h.starts != 0 {
		t.Errorf("not root: exit %d, %q, %q, %d starts", code, out.String(), errb.String(), h.starts)
	}
}

// captureUsage returns the usage text.
func captureUsage() string {
	var b strings.Builder
	usage(&b)
	return b.String()
}
