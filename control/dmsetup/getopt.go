package dmsetup

import (
	"fmt"
	"strings"
)

// The command line is scanned as dmsetup scans it: glibc's getopt_long with
// dmsetup's short and long options (libdm/dm-tools/dmsetup.c:
// _process_switches). Options and their arguments may come anywhere (GNU
// argument permutation), `--` ends them, short options cluster, long ones
// take `--name value` or `--name=value` and may be shortened to a unique
// prefix.

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
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return opts, append(words, args[i+1:]...), ""
		case strings.HasPrefix(a, "--"):
			body := a[2:]
			name, val, hasVal := strings.Cut(body, "=")
			o, m := findLong(prog, name, body)
			if m != "" {
				return nil, nil, m
			}
			switch {
			case !o.hasArg && hasVal:
				return nil, nil, fmt.Sprintf("%s: option '--%s' doesn't allow an argument", prog, o.name)
			case o.hasArg && !hasVal:
				if i+1 >= len(args) {
					return nil, nil, fmt.Sprintf("%s: option '--%s' requires an argument", prog, o.name)
				}
				i++
				val = args[i]
			}
			opts = append(opts, option{o.name, val})
		case len(a) > 1 && a[0] == '-':
			for j := 1; j < len(a); j++ {
				c := a[j]
				k := strings.IndexByte(shortOptions, c)
				if c == ':' || k < 0 {
					return nil, nil, fmt.Sprintf("%s: invalid option -- '%c'", prog, c)
				}
				if k+1 < len(shortOptions) && shortOptions[k+1] == ':' {
					val := a[j+1:]
					if val == "" {
						if i+1 >= len(args) {
							return nil, nil, fmt.Sprintf("%s: option requires an argument -- '%c'", prog, c)
						}
						i++
						val = args[i]
					}
					opts = append(opts, option{shortNames[c], val})
					break
				}
				opts = append(opts, option{shortNames[c], ""})
			}
		default:
			if posix {
				return opts, append(words, args[i:]...), ""
			}
			words = append(words, a)
		}
	}
	return opts, words, ""
}

// findLong finds the long option called name or of which name is a unique
// prefix, as getopt_long does: an exact match wins; several prefix matches
// that differ are ambiguous. body is the word after `--`, for messages.
func findLong(prog, name, body string) (longOption, string) {
	var matches []longOption
	for _, o := range longOptions {
		if o.name == name {
			return o, ""
		}
		if strings.HasPrefix(o.name, name) {
			matches = append(matches, o)
		}
	}
	switch {
	case len(matches) == 1:
		return matches[0], ""
	case len(matches) == 0 || name == "":
		return longOption{}, fmt.Sprintf("%s: unrecognized option '--%s'", prog, body)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: option '--%s' is ambiguous; possibilities:", prog, body)
	for _, o := range matches {
		fmt.Fprintf(&b, " '--%s'", o.name)
	}
	return longOption{}, b.String()
}
