package stack

import (
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

// ParseConcise parses devices in the `dmsetup create --concise` format:
//
//	name,uuid,minor,flags,table[,table]...[;name,...]
//
// flags is `ro` or `rw` (empty: rw); uuid and minor may be empty. An empty or
// comment-only text means no devices; `#` starts a comment only at the start
// of a line (after blanks); whitespace and newlines around `;` and `,` are
// ignored and a trailing `;` is allowed; `\` escapes the next character (`\,`
// `\;` `\\`).
func ParseConcise(text string) ([]ConfigDevice, error) {
	var devs []ConfigDevice
	var fields []string
	var cur strings.Builder
	line, devLine := 1, 0
	atLineStart := true
	flush := func() {
		fields = append(fields, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	endDevice := func() error {
		flush()
		if len(fields) == 1 && fields[0] == "" {
			fields = nil
			return nil
		}
		d, err := conciseDevice(fields, devLine)
		fields = nil
		if err != nil {
			return err
		}
		devs = append(devs, d)
		return nil
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		if atLineStart {
			if c == ' ' || c == '\t' || c == '\r' {
				continue
			}
			atLineStart = false
			if c == '#' {
				for i < len(text) && text[i] != '\n' {
					i++
				}
				line++
				atLineStart = true
				continue
			}
		}
		if devLine == 0 && !isSpace(c) && c != ';' {
			devLine = line
		}
		switch c {
		case '\\':
			if i+1 < len(text) {
				i++
				if text[i] == '\n' {
					line++
				}
				cur.WriteByte(text[i])
				continue
			}
			cur.WriteByte(c)
		case ',':
			flush()
		case ';':
			if err := endDevice(); err != nil {
				return nil, err
			}
			devLine = 0
		case '\n':
			line++
			atLineStart = true
			cur.WriteByte(' ')
		default:
			cur.WriteByte(c)
		}
	}
	if err := endDevice(); err != nil {
		return nil, err
	}
	return devs, nil
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
