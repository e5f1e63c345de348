package dmsetup

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// tableSource reads the table of create and load as dmsetup's _parse_file:
// --table (whatever FILE says), else FILE, else stdin. It returns the table
// text, one target per line as the daemon parses it, and the number of
// targets; ok is false after a message (a line that does not parse, a file
// that cannot be opened).
func (r *run) tableSource(file string) (text string, targets int, ok bool) {
	if r.o.on("table") {
		return r.parseLines(r.o.val("table"), "")
	}
	var in io.Reader = r.env.Stdin
	src := "on stdin"
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			r.errf("Couldn't open '%s' for reading.", file)
			return "", 0, false
		}
		defer f.Close()
		in, src = f, file
	}
	b, err := io.ReadAll(bufio.NewReader(in))
	if err != nil {
		r.errf("Read from stdin aborted: %v", err)
		return "", 0, false
	}
	return r.parseLines(strings.TrimSuffix(string(b), "\n"), src)
}

// parseLines parses table text line by line as dmsetup's _parse_line: each
// line is trimmed; empty lines and lines starting with `#` are skipped;
// the rest must start with start, length and type ("Invalid format on line
// N of table SRC." otherwise, N counting every line), and a `#` in the
// parameters starts a comment.
func (r *run) parseLines(text, src string) (string, int, bool) {
	var b strings.Builder
	n := 0
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		start, rest, ok1 := scanU64(line)
		length, rest, ok2 := scanU64(rest)
		typ, params := scanWord(rest)
		if !ok1 || !ok2 || typ == "" {
			r.errf("Invalid format on line %d of table %s.", i+1, src)
			return "", 0, false
		}
		if k := strings.IndexByte(params, '#'); k >= 0 {
			params = params[:k]
		}
		fmt.Fprintf(&b, "%d %d %s %s\n", start, length, typ, params)
		n++
	}
	return b.String(), n, true
}

// scanU64 reads an unsigned decimal after blanks, as sscanf's %llu.
func scanU64(s string) (uint64, string, bool) {
	s = strings.TrimLeft(s, " \t\n\r\v\f")
	i := 0
	if i < len(s) && s[i] == '+' {
		i++
	}
	j := i
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	v, err := strconv.ParseUint(s[i:j], 10, 64)
	if err != nil {
		return 0, s, false
	}
	return v, s[j:], true
}

// scanWord reads a word after blanks (sscanf's %s) and returns it and what
// follows it after the blanks that follow (%n after " ").
func scanWord(s string) (string, string) {
	s = strings.TrimLeft(s, " \t\n\r\v\f")
	i := strings.IndexAny(s, " \t\n\r\v\f")
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimLeft(s[i:], " \t\n\r\v\f")
}
