package stack

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ConfigDevice is one device of a concise config.
type ConfigDevice struct {
	// Line is the config line the device starts on.
	Line     int
	Name     string
	UUID     string
	Minor    int // -1: lowest free
	ReadOnly bool
	// Table is the table text, one line per table field.
	Table string
}

// The concise format of `dmsetup create --concise` and `dmsetup table
// --concise`, the one implementation of it in dmfuse: dmsetup's verbs, the
// daemon's table --concise and `dmfuse mount --config` use these.
//
//	name,uuid,minor,flags,table[,table]...[;name,...]
//
// Fields are separated by `,`, devices by `;`; the fifth and later fields
// are the lines of the table; `\` escapes the next character.

// ConciseEntry is one device of a concise text as ScanConcise reads it.
type ConciseEntry struct {
	// Line is the line the device starts on.
	Line int
	// Fields are the fields read: name, uuid, minor, flags, then one per
	// line of the table.
	Fields []string
	// Err is set on the last entry of a text that ends inside it:
	// ErrConciseBackslash or ErrConciseIncomplete.
	Err error
}

// Errors of ConciseEntry.Err.
var (
	// ErrConciseBackslash is a `\` that ends the text.
	ErrConciseBackslash = errors.New("backslash must be followed by another character at end of string")
	// ErrConciseIncomplete is a text that ends right after a separator
	// of the first five fields.
	ErrConciseIncomplete = errors.New("incomplete entry")
)

// ScanConcise reads text in the concise format as dmsetup's
// _create_concise does and calls each for every device in turn, until each
// returns false: blanks after a separator of the first five fields and
// after `;` are skipped, a `,` after the fifth field starts a new table line
// (a field of its own), and the end of the text ends the last device. An entry with Err set is
// the last one. With config, as in `dmfuse mount --config` files, a `#` at
// the start of a line (after blanks) starts a comment to the end of the line
// and a line break reads as a blank.
func ScanConcise(text string, config bool, each func(ConciseEntry) bool) {
	e := ConciseEntry{Fields: []string{""}}
	var cur strings.Builder
	line, atLineStart := 1, true
	newline := func() {
		line++
		atLineStart = true
	}
	skipSpace := func(i int) int {
		for i+1 < len(text) && isSpace(text[i+1]) {
			i++
			if text[i] == '\n' {
				newline()
			}
		}
		return i
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		if config && atLineStart {
			if c == ' ' || c == '\t' || c == '\r' {
				continue
			}
			atLineStart = false
			if c == '#' {
				for i < len(text) && text[i] != '\n' {
					i++
				}
				newline()
				continue
			}
		}
		if e.Line == 0 && !isSpace(c) && c != ';' {
			e.Line = line
		}
		if c == '\n' {
			if config {
				newline()
				c = ' '
			} else {
				atLineStart = false
			}
		}
		switch {
		case c == '\\':
			if i+1 >= len(text) {
				e.Fields[len(e.Fields)-1] = cur.String()
				e.Err = ErrConciseBackslash
				each(e)
				return
			}
			i++
			if text[i] == '\n' {
				newline()
				atLineStart = false
			}
			cur.WriteByte(text[i])
			continue
		case c == ',':
			e.Fields[len(e.Fields)-1] = cur.String()
			e.Fields = append(e.Fields, "")
			cur.Reset()
			if len(e.Fields) <= 5 {
				i = skipSpace(i)
			}
			continue
		case c == ';' || i+1 == len(text):
			if c != ';' {
				cur.WriteByte(c)
			}
			e.Fields[len(e.Fields)-1] = cur.String()
			cur.Reset()
			if !each(e) {
				return
			}
			e = ConciseEntry{Fields: []string{""}}
			i = skipSpace(i)
			continue
		}
		cur.WriteByte(c)
	}
	if cur.Len() > 0 || len(e.Fields) > 1 {
		e.Fields[len(e.Fields)-1] = cur.String()
		e.Err = ErrConciseIncomplete
		each(e)
	}
}

// ParseConcise parses the devices of a `dmfuse mount --config` file, in the
// concise format (ScanConcise with config): flags is `ro` or `rw` (empty:
// rw); uuid and minor may be empty. An empty or comment-only text means no
// devices; whitespace and newlines around `;` and `,` are ignored, and so
// is an empty device (`;;`, a trailing `;`).
func ParseConcise(text string) ([]ConfigDevice, error) {
	var devs []ConfigDevice
	var err error
	ScanConcise(text, true, func(e ConciseEntry) bool {
		if e.Err == ErrConciseBackslash {
			// A config keeps a `\` that ends the text as it is.
			e.Fields[len(e.Fields)-1] += "\\"
		}
		f := make([]string, len(e.Fields))
		for i, s := range e.Fields {
			f[i] = strings.TrimSpace(s)
		}
		if len(f) == 1 && f[0] == "" {
			return true
		}
		var d ConfigDevice
		if d, err = conciseDevice(f, e.Line); err != nil {
			return false
		}
		devs = append(devs, d)
		return true
	})
	if err != nil {
		return nil, err
	}
	return devs, nil
}

// QuoteConcise escapes `,`, `;` and `\` with a backslash, as dmsetup's
// _print_string_quoted does.
func QuoteConcise(s string) string {
	if !strings.ContainsAny(s, ",;\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == ',' || c == ';' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FormatConcise prints devices as `dmsetup table --concise` does: one line,
// devices separated by `;`, each `name,uuid,minor,rw|ro` then `,LINE` for
// each line of its table, with `,;\` escaped. A minor below 0 prints
// empty.
func FormatConcise(devs []ConfigDevice) string {
	var b strings.Builder
	for i, d := range devs {
		if i > 0 {
			b.WriteByte(';')
		}
		flags := "rw"
		if d.ReadOnly {
			flags = "ro"
		}
		minor := ""
		if d.Minor >= 0 {
			minor = strconv.Itoa(d.Minor)
		}
		fmt.Fprintf(&b, "%s,%s,%s,%s", QuoteConcise(d.Name), QuoteConcise(d.UUID), minor, flags)
		if d.Table != "" {
			for _, l := range strings.Split(strings.TrimSuffix(d.Table, "\n"), "\n") {
				b.WriteByte(',')
				b.WriteString(QuoteConcise(l))
			}
		}
	}
	b.WriteByte('\n')
	return b.String()
}

func conciseDevice(f []string, line int) (ConfigDevice, error) {
	d := ConfigDevice{Line: line, Minor: -1}
	fail := func(format string, a ...any) (ConfigDevice, error) {
		return ConfigDevice{}, fmt.Errorf("line %d: %s", line, fmt.Sprintf(format, a...))
	}
	if len(f) < 5 {
		return fail("device %q: want name,uuid,minor,flags,table[,table]...: %d fields", f[0], len(f))
	}
	d.Name, d.UUID = f[0], f[1]
	if err := ValidName(d.Name); err != nil {
		return fail("%v", err)
	}
	if err := ValidUUID(d.UUID); err != nil {
		return fail("%s: %v", d.Name, err)
	}
	if f[2] != "" {
		v, err := strconv.ParseUint(f[2], 10, 20)
		if err != nil {
			return fail("%s: invalid minor %q", d.Name, f[2])
		}
		d.Minor = int(v)
	}
	switch f[3] {
	case "", "rw":
	case "ro":
		d.ReadOnly = true
	default:
		return fail("%s: invalid flags %q: want ro or rw", d.Name, f[3])
	}
	var b strings.Builder
	for _, t := range f[4:] {
		if t == "" {
			return fail("%s: empty table line", d.Name)
		}
		b.WriteString(t)
		b.WriteByte('\n')
	}
	d.Table = b.String()
	return d, nil
}
