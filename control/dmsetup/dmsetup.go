package dmsetup

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dmfuse/dmfuse/control"
)

// Caller sends one request to a daemon and returns its response; an error
// means the daemon could not be reached or did not answer.
type Caller interface {
	Call(req *control.Request) (*control.Response, error)
}

// CallerFunc makes a function a Caller.
type CallerFunc func(req *control.Request) (*control.Response, error)

// Call calls f.
func (f CallerFunc) Call(req *control.Request) (*control.Response, error) { return f(req) }

// Env is what one run of the command line touches outside itself.
type Env struct {
	// Prog is the name getopt's messages start with (argv[0]).
	Prog string
	// Args are the words after the program name.
	Args   []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment (DM_DEV_DIR, POSIXLY_CORRECT,
	// DM_UDEV_COOKIE).
	Getenv func(string) string
	// Dir is the working directory, against which relative paths in tables
	// resolve.
	Dir string
	// Connect returns the daemon. With start it starts one if none runs;
	// without, it returns nil and no error when none runs.
	Connect func(start bool) (Caller, error)
	// Offline answers, when no daemon runs, as a daemon without devices
	// would (so ls, targets and info work without starting one).
	Offline Caller
	// Sleep waits between the attempts of remove --retry.
	Sleep func(time.Duration)
	// Root reports whether the caller may manage devices.
	Root bool
	// TermWidth is the width of the terminal stdout writes to, 0 if it is
	// not a terminal (ls --tree cuts lines to it).
	TermWidth int
}

// Versions dmsetup prints: dmfuse answers as libdevmapper and the kernel
// interface of the baseline it follows.
const (
	LibraryVersion = "1.02.213 (2026-03-13)"
	DriverVersion  = "4.50.0"
)

// command is one verb: its argument counts (max -1: any), whether it
// repeats over several device names (2: also with --select), and its
// function.
type command struct {
	name       string
	help       string
	min, max   int
	repeatable int
	fn         func(r *run, args []string, multi bool) bool
}

// commands is dmsetup's verb table (_dmsetup_commands), in its order, which
// the usage text follows.
var commands []*command

func init() {
	commands = []*command{
		{"help", "[-c|-C|--columns]", 0, 0, 0, (*run).help},
		{"create", "<dev_name>\n" +
			"\t    [-j|--major <major> -m|--minor <minor>]\n" +
			"\t    [-U|--uid <uid>] [-G|--gid <gid>] [-M|--mode <octal_mode>]\n" +
			"\t    [-u|--uuid <uuid>] [--addnodeonresume|--addnodeoncreate]\n" +
			"\t    [--readahead {[+]<sectors>|auto|none}]\n" +
			"\t    [-n|--notable|--table {<table>|<table_file>}]\n" +
			"\tcreate --concise [<concise_device_spec_list>]", 0, 2, 0, (*run).create},
		{"remove", "[--deferred] [-f|--force] [--retry] <device>...", 0, -1, 2, (*run).remove},
		{"remove_all", "[-f|--force]", 0, 0, 0, (*run).removeAll},
		{"suspend", "[--noflush] [--nolockfs] <device>...", 0, -1, 2, (*run).suspend},
		{"resume", "[--noflush] [--nolockfs] <device>...\n" +
			"\t       [--addnodeonresume|--addnodeoncreate]\n" +
			"\t       [--readahead {[+]<sectors>|auto|none}]", 0, -1, 2, (*run).resume},
		{"load", "<device> [<table>|<table_file>]", 0, 2, 0, (*run).load},
		{"clear", "<device>", 0, -1, 2, (*run).clear},
		{"reload", "<device> [<table>|<table_file>]", 0, 2, 0, (*run).load},
		{"wipe_table", "[-f|--force] [--noflush] [--nolockfs] <device>...", 0, -1, 2, (*run).wipeTable},
		{"rename", "<device> [--setuuid] <new_name_or_uuid>", 1, 2, 0, (*run).rename},
		{"measure", "[<device>...]", 0, -1, 2, (*run).unsupported},
		{"message", "<device> <sector> <message>", 2, -1, 0, (*run).message},
		{"ls", "[--target <target_type>] [--exec <command>] [-o <options>] [--tree]", 0, 0, 0, (*run).ls},
		{"info", "[<device>...]", 0, -1, 1, (*run).info},
		{"deps", "[-o <options>] [<device>...]", 0, -1, 2, (*run).deps},
		{"stats", "<command> [<options>] [<device>...]", 1, -1, 1, (*run).unsupported},
		{"status", "[<device>...] [--noflush] [--target <target_type>]", 0, -1, 2, (*run).status},
		{"table", "[<device>...] [--concise] [--target <target_type>] [--showkeys]", 0, -1, 2, (*run).status},
		{"wait", "<device> [<event_nr>] [--noflush]", 0, 2, 0, (*run).wait},
		{"mknodes", "[<device>...]", 0, -1, 1, (*run).mknodes},
		{"mangle", "[<device>...]", 0, -1, 1, (*run).mangle},
		{"udevcreatecookie", "", 0, 0, 0, (*run).udevCreateCookie},
		{"udevreleasecookie", "[<cookie>]", 0, 1, 0, (*run).udevReleaseCookie},
		{"udevflags", "<cookie>", 1, 1, 0, (*run).udevFlags},
		{"udevcomplete", "<cookie>", 1, 1, 0, (*run).udevComplete},
		{"udevcomplete_all", "[<age_in_minutes>]", 0, 1, 0, (*run).udevCompleteAll},
		{"udevcookies", "", 0, 0, 0, (*run).udevCookies},
		{"target-version", "[<target>...]", 1, -1, 1, (*run).targetVersion},
		{"targets", "", 0, 0, 0, (*run).targets},
		{"version", "", 0, 0, 0, (*run).version},
		{"setgeometry", "<device> <cyl> <head> <sect> <start>", 5, 5, 0, (*run).unsupported},
		{"splitname", "<device> [<subsystem>]", 1, 2, 0, (*run).unsupported},
	}
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usage writes dmsetup's usage text.
func usage(w io.Writer) {
	fmt.Fprint(w, "Usage:\n\n"+
		"dmsetup\n"+
		"        [--version] [-h|--help [-c|-C|--columns]]\n"+
		"        [-v|--verbose [-v|--verbose ...]] [-f|--force]\n"+
		"        [--checks] [--manglename {none|hex|auto}]\n"+
		"        [-r|--readonly] [--noopencount] [--noflush] [--nolockfs] [--inactive]\n"+
		"        [--udevcookie <cookie>] [--noudevrules] [--noudevsync] [--verifyudev]\n"+
		"        [-y|--yes] [--readahead {[+]<sectors>|auto|none}] [--retry]\n"+
		"        [-c|-C|--columns] [-o <fields>] [-O|--sort <sort_fields>]\n"+
		"        [-S|--select <selection>] [--nameprefixes]\n"+
		"        [--noheadings|--headings none|abbrev|full|0|1|2]\n"+
		"        [--separator <separator>]\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "\t%s %s\n", c.name, c.help)
	}
	fmt.Fprint(w, "\n<device> may be device name or (if only one) -u <uuid> or -j <major> -m <minor>\n"+
		"<mangling_mode> is one of 'none', 'auto' and 'hex'.\n"+
		"<fields> are comma-separated.  Use 'help -c' for list.\n"+
		"<concise_device_specification> has single-device entries separated by semi-colons:\n"+
		"    <name>,<uuid>,<minor>,<flags>,<table>\n"+
		"        where <flags> is 'ro' or 'rw' (the default) and any of <uuid>, <minor>\n"+
		"        and <flags> may be empty. Separate extra table lines with commas.\n"+
		"    E.g.: dev1,,,,0 100 linear 253:1 0,100 100 error;dev2,,,ro,0 1 error\n"+
		"Table_file contents may be supplied on stdin.\n"+
		"Options are: devno, devname, blkdevname.\n"+
		"Tree specific options are: ascii, utf, vt100; compact, inverted, notrunc;\n"+
		"                           blkdevname, [no]device, active, open, rw and uuid.\n\n")
}

// opts are the options of one run: how often each was given and the last
// argument of each.
type opts struct {
	count map[string]int
	arg   map[string]string
}

func (o *opts) on(name string) bool    { return o.count[name] > 0 }
func (o *opts) val(name string) string { return o.arg[name] }
func (o *opts) intArg(name string) int { n, _ := atoi(o.arg[name]); return n }
func (o *opts) set(name string, n int) { o.count[name] = n }
func (o *opts) setArg(name, v string)  { o.count[name]++; o.arg[name] = v }
func (o *opts) verbose() int           { return o.count["verbose"] }

// atoi is C's atoi: leading blanks, a sign and digits; anything else ends
// the number (0 if there is none).
func atoi(s string) (int, bool) {
	s = strings.TrimLeft(s, " \t\n\r\v\f")
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	j := i
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	n, err := strconv.Atoi(s[:j])
	if err != nil {
		return 0, false
	}
	return n, j == len(s) && j > i
}

// run is one execution of the command line.
type run struct {
	env    *Env
	o      opts
	cmd    *command
	caller Caller
	devDir string
	// devName is how deps and ls name devices (-o devno|devname|blkdevname).
	devName string
	tree    treeOptions
	report  *reportSpec
	// rows gathers info -c rows until the end of the command.
	rows []control.DeviceReport
	// conciseDone is set once table --concise printed a device on the
	// current line.
	conciseDone bool
}

func (r *run) errf(format string, a ...any) {
	fmt.Fprintf(r.env.Stderr, format+"\n", a...)
}

func (r *run) outf(format string, a ...any) {
	fmt.Fprintf(r.env.Stdout, format, a...)
}

// Run runs one dmsetup command line and returns its exit status: 0 or 1,
// and 0 whatever happened for --help and --version, as dmsetup's main.
func Run(env *Env) int {
	r := &run{env: env, o: opts{count: map[string]int{}, arg: map[string]string{}}}
	code := r.main()
	if r.o.on("help") || r.o.on("version") {
		return 0
	}
	return code
}

func (r *run) main() int {
	env := r.env
	r.devDir = "/dev"
	if d := env.Getenv("DM_DEV_DIR"); d != "" {
		r.devDir = strings.TrimSuffix(d, "/")
	}
	words, ok := r.processSwitches()
	if !ok {
		r.errf("Couldn't process command line.")
		return 1
	}
	var verb string
	if len(words) > 0 {
		verb, words = words[0], words[1:]
	}
	switch {
	case r.o.on("help"):
		r.cmd = findCommand("help")
	case r.o.on("version"):
		r.cmd = findCommand("version")
	case verb == "":
		usage(env.Stderr)
		return 1
	default:
		if r.cmd = findCommand(verb); r.cmd == nil {
			r.errf("Unknown command.")
			usage(env.Stderr)
			return 1
		}
		if len(words) < r.cmd.min || r.cmd.max >= 0 && len(words) > r.cmd.max {
			r.errf("Incorrect number of arguments.")
			usage(env.Stderr)
			return 1
		}
	}
	if !r.processOptions() {
		r.errf("Couldn't process command line.")
		return 1
	}
	if r.o.on("select") && r.cmd.repeatable == 2 || r.o.on("select") && r.cmd.name == "info" {
		r.errf("--select is not supported by dmfuse's dmsetup.")
		return 1
	}
	if r.o.on("columns") && (r.cmd.name == "info" || r.cmd.name == "help") {
		if !r.reportInit() {
			return 1
		}
	}
	if r.needsDaemon() && !env.Root {
		r.errf("dmsetup: permission denied: managing dmfuse devices needs root.")
		return 1
	}
	multi := r.cmd.repeatable > 0 && len(words) != 1 &&
		(len(words) > 0 || !r.o.on("uuid") && !r.o.on("major"))
	for i := 0; ; i++ {
		var args []string
		if i < len(words) {
			args = words[i:]
		}
		if !r.cmd.fn(r, args, multi) {
			// As dmsetup: the report gathered so far is printed after
			// the failure.
			r.errf("Command failed.")
			r.flushReport()
			return 1
		}
		if r.cmd.repeatable == 0 || i+1 >= len(words) {
			break
		}
	}
	r.flushReport()
	return 0
}

// needsDaemon reports whether the verb talks to a daemon.
func (r *run) needsDaemon() bool {
	switch r.cmd.name {
	case "help", "version", "udevcreatecookie", "udevreleasecookie", "udevflags", "udevcomplete",
		"udevcomplete_all", "udevcookies", "measure", "stats", "setgeometry", "splitname":
		return false
	}
	return true
}

// connect finds the daemon when the first request is sent. Only create
// starts one when none runs; the other verbs are answered as a daemon
// without devices would answer them.
func (r *run) connect() (Caller, error) {
	if r.caller != nil {
		return r.caller, nil
	}
	c, err := r.env.Connect(r.cmd.name == "create")
	if err != nil {
		return nil, err
	}
	if c == nil {
		c = r.env.Offline
	}
	r.caller = c
	return c, nil
}

// processSwitches scans the options and checks them as dmsetup's
// _process_switches does; it returns the other words.
func (r *run) processSwitches() ([]string, bool) {
	opts, words, msg := getopt(r.env.Prog, r.env.Args, r.env.Getenv("POSIXLY_CORRECT") != "")
	if msg != "" {
		r.errf("%s", msg)
		return nil, false
	}
	for _, op := range opts {
		switch op.name {
		case "headings":
			switch strings.ToLower(op.arg) {
			case "none", "0", "abbrev", "1", "full", "2":
			default:
				r.errf("Unknown headings type.")
				return nil, false
			}
		case "interval":
			if n, _ := atoi(op.arg); n <= 0 {
				r.errf("Interval must be a positive integer.")
				return nil, false
			}
		case "count":
			if n, _ := atoi(op.arg); n < 0 {
				r.errf("Count must be zero or greater.")
				return nil, false
			}
		case "manglename":
			switch strings.ToLower(op.arg) {
			case "none", "auto", "hex":
			default:
				r.errf("Unknown name mangling mode.")
				return nil, false
			}
		case "mode":
			if v, err := strconv.ParseInt(op.arg, 8, 32); err != nil || v == 0 {
				r.errf("Invalid argument for --mode: %s. ", op.arg)
				return nil, false
			}
		case "readahead":
			if a := strings.ToLower(op.arg); a != "auto" && a != "none" {
				if n, _ := atoi(op.arg); n < -1 {
					r.errf("Negative read ahead value (%d) is not understood.", n)
					return nil, false
				}
			}
		case "udevcookie":
			if _, ok := cookieValue(op.arg); !ok {
				r.errf("Incorrect cookie value.")
			}
		}
		r.o.setArg(op.name, op.arg)
	}
	switch {
	case r.o.on("major") != r.o.on("minor"):
		r.errf("Please specify both major number and minor number.")
		return nil, false
	case r.o.on("table") && r.o.on("notable"):
		r.errf("--table and --notable are incompatible.")
		return nil, false
	case r.o.on("addnodeonresume") && r.o.on("addnodeoncreate"):
		r.errf("--addnodeonresume and --addnodeoncreate are incompatible.")
		return nil, false
	}
	return words, true
}

// processOptions reads -o for the verbs that take device name options
// (dmsetup's _process_options); tree options for ls --tree; column fields
// are read by reportInit.
func (r *run) processOptions() bool {
	r.devName = "devno"
	r.tree = defaultTree()
	switch {
	case r.o.on("tree"):
		return r.processTreeOptions(r.o.val("options"))
	case r.o.on("columns") || !r.o.on("options"):
		return true
	}
	s := r.o.val("options")
	for s != "" {
		tok, rest, more := strings.Cut(s, ",")
		switch {
		case strings.HasPrefix("devno", tok):
			r.devName = "devno"
		case strings.HasPrefix("blkdevname", tok):
			r.devName = "blkdevname"
		case strings.HasPrefix("devname", tok):
			r.devName = "devname"
		default:
			r.errf("Option not recognised: %s.", s)
			return false
		}
		if !more {
			break
		}
		s = rest
	}
	return true
}

// cookieValue parses a udev cookie as dmsetup's _get_cookie_value:
// strtoul with base 0, non-zero, at most 32 bits.
func cookieValue(s string) (uint32, bool) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil || v == 0 {
		return 0, false
	}
	return uint32(v), true
}
