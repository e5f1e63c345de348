package dmsetup

import gnu "github.com/dmfuse/dmfuse/internal/getopt"

// The command line is scanned as dmsetup scans it: glibc's getopt_long
// (internal/getopt) with dmsetup's short and long options
// (libdm/dm-tools/dmsetup.c: _process_switches). Options and their arguments
// may come anywhere (GNU argument permutation), `--` ends them, short options
// cluster, long ones take `--name value` or `--name=value` and may be
// shortened to a unique prefix.

// shortOptions is dmsetup's getopt short option string.
const shortOptions = "cCfG:hj:m:M:no:O:rS:u:U:vy"

// shortNames maps each short option to the long option it sets.
var shortNames = map[byte]string{
	'c': "columns", 'C': "columns", 'f': "force", 'G': "gid", 'h': "help", 'j': "major", 'm': "minor",
	'M': "mode", 'n': "notable", 'o': "options", 'O': "sort", 'r': "readonly", 'S': "select",
	'u': "uuid", 'U': "uid", 'v': "verbose", 'y': "yes",
}

// longOption is one of dmsetup's long options.
type longOption struct {
	name   string
	hasArg bool
}

// getoptLongs is longOptions as a getopt_long table. Each option has a value
// of its own, as in dmsetup, so that any two options a prefix fits are
// ambiguous.
var getoptLongs = func() []gnu.Option {
	t := make([]gnu.Option, len(longOptions))
	for i, o := range longOptions {
		t[i] = gnu.Option{Name: o.name, HasArg: o.hasArg, Val: 256 + i}
	}
	return t
}()

// longOptions are dmsetup's long options, in its order (which decides the
// order of the possibilities an ambiguous prefix lists). --verbose takes an
// argument, as in dmsetup: it swallows the next word.
var longOptions = []longOption{
	{"addnodeoncreate", false}, {"addnodeonresume", false}, {"alias", true}, {"alldevices", false},
	{"allprograms", false}, {"allregions", false}, {"area", false}, {"areas", true}, {"areasize", true},
	{"bounds", true}, {"checks", false}, {"clear", false}, {"columns", false}, {"concise", false},
	{"count", true}, {"deferred", false}, {"exec", true}, {"filemap", false}, {"follow", true},
	{"force", false}, {"foreground", false}, {"gid", true}, {"group", false}, {"groupid", true},
	{"headings", true}, {"help", false}, {"histogram", false}, {"inactive", false}, {"interval", true},
	{"length", true}, {"major", true}, {"manglename", true}, {"minor", true}, {"mode", true},
	{"nameprefixes", false}, {"noflush", false}, {"nogroup", false}, {"noheadings", false},
	{"nolockfs", false}, {"nomonitor", false}, {"noopencount", false}, {"nosuffix", false},
	{"notable", false}, {"notimesuffix", false}, {"noudevrules", false}, {"noudevsync", false},
	{"options", true}, {"precise", false}, {"programid", true}, {"raw", false}, {"readahead", true},
	{"readonly", false}, {"region", false}, {"regionid", true}, {"regions", true}, {"relative", false},
	{"retry", false}, {"rows", false}, {"segments", false}, {"select", true}, {"separator", true},
	{"setuuid", false}, {"showkeys", false}, {"sort", true}, {"start", true}, {"table", true},
	{"target", true}, {"tree", false}, {"udevcookie", true}, {"uid", true}, {"unbuffered", false},
	{"units", true}, {"unquoted", false}, {"userdata", true}, {"uuid", true}, {"verbose", true},
	{"verifyudev", false}, {"version", false}, {"yes", false},
}

// option is one option as scanned: its long name and its argument.
type option struct {
	name, arg string
}

// getopt scans args (without the program name) and returns the options in
// order and the other words. A failure returns glibc's message (one line,
// prefixed with prog) and nothing else. With posix (POSIXLY_CORRECT),
// scanning stops at the first word that is not an option.
func getopt(prog string, args []string, posix bool) (opts []option, words []string, msg string) {
	p := &gnu.Parser{Prog: prog, Args: args, Shorts: shortOptions, Longs: getoptLongs, Posix: posix}
	for {
		o, ok, err := p.Next()
		if err != nil {
			return nil, nil, err.Error()
		}
		if !ok {
			return opts, p.Rest(), ""
		}
		name := shortNames[byte(o.Val)]
		if o.Long >= 0 {
			name = longOptions[o.Long].name
		}
		opts = append(opts, option{name, o.Arg})
	}
}
