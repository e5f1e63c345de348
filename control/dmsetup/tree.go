package dmsetup

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dmfuse/dmfuse/control"
)

// ls --tree, as dmsetup's _display_tree: each device that no other uses,
// with the devices it uses below it.

// treeSymbols are the line drawing characters of one style.
type treeSymbols struct {
	empty, branch, vert, last string
}

var (
	treeASCII = treeSymbols{"  ", "|-", "| ", "`-"}
	treeUTF   = treeSymbols{"  ", "\u251c\u2500", "\u2502 ", "\u2514\u2500"}
	treeVT100 = treeSymbols{"  ", "\x1b(0\x0ftq\x1b(B", "\x1b(0\x0fx\x1b(B ", "\x1b(0\x0fmq\x1b(B"}
)

type treeOptions struct {
	sym                       treeSymbols
	device, blkdevname        bool
	active, rw, open, uuid    bool
	inverted, truncate, vt100 bool
}

// defaultTree is the tree dmsetup draws without -o: device numbers, lines
// cut to the terminal, UTF-8 drawing under a UTF-8 locale.
func defaultTree() treeOptions {
	return treeOptions{sym: treeASCII, device: true, truncate: true}
}

// utf8Locale reports whether the locale's character set is UTF-8, as
// nl_langinfo(CODESET) after setlocale(LC_ALL, "").
func (r *run) utf8Locale() bool {
	for _, v := range []string{"LC_ALL", "LC_CTYPE", "LANG"} {
		if s := r.env.Getenv(v); s != "" {
			s = strings.ToLower(s)
			return strings.Contains(s, "utf-8") || strings.Contains(s, "utf8")
		}
	}
	return false
}

// processTreeOptions reads ls --tree's -o words as dmsetup's
// _process_tree_options: each a prefix of an option name.
func (r *run) processTreeOptions(s string) bool {
	if r.utf8Locale() {
		r.tree.sym = treeUTF
	}
	t := &r.tree
	names := []string{"device", "blkdevname", "nodevice", "status", "table", "active", "open", "rw", "uuid",
		"ascii", "utf", "vt100", "compact", "inverted", "notrunc"}
	for s != "" {
		tok, rest, more := strings.Cut(s, ",")
		hit := ""
		for _, n := range names {
			if strings.HasPrefix(n, tok) {
				hit = n
				break
			}
		}
		switch hit {
		case "device":
			t.device = true
		case "blkdevname":
			t.blkdevname = true
		case "nodevice":
			t.device = false
		case "status", "table", "compact":
			// Target lines are not drawn by dmsetup either; compact
			// layout is drawn as the normal one.
		case "active":
			t.active = true
		case "open":
			t.open = true
		case "rw":
			t.rw = true
		case "uuid":
			t.uuid = true
		case "ascii":
			t.sym, t.vt100 = treeASCII, false
		case "utf":
			t.sym, t.vt100 = treeUTF, false
		case "vt100":
			t.sym, t.vt100 = treeVT100, true
		case "inverted":
			t.inverted = true
		case "notrunc":
			t.truncate = false
		default:
			r.errf("Tree option not recognised: %s.", s)
			return false
		}
		if !more {
			break
		}
		s = rest
	}
	return true
}

// treeNode is a device in the tree: a mapped device, or a device it uses
// that is not one (no name).
type treeNode struct {
	key      string
	dev      *control.DeviceReport
	label    string // "(M:m)" or a file's path for devices that are not mapped
	blk      string
	children []*treeNode
	parents  int
}

func (r *run) printTree(devs []control.DeviceReport) {
	nodes := map[string]*treeNode{}
	var order []*treeNode
	get := func(key string) *treeNode {
		n := nodes[key]
		if n == nil {
			n = &treeNode{key: key}
			nodes[key] = n
			order = append(order, n)
		}
		return n
	}
	for i := range devs {
		d := &devs[i]
		n := get("dm:" + d.Name)
		n.dev, n.label, n.blk = d, fmt.Sprintf("%d:%d", d.Major, d.Minor), d.BlkDevName
	}
	for i := range devs {
		n := nodes["dm:"+devs[i].Name]
		for _, dep := range devs[i].Deps {
			var c *treeNode
			if dep.Mapped != "" {
				c = get("dm:" + dep.Mapped)
			} else {
				c = get("dev:" + depNo(dep))
				c.label, c.blk = depNo(dep), dep.BlkDevName
			}
			if r.tree.inverted {
				c.children = append(c.children, n)
				n.parents++
			} else {
				n.children = append(n.children, c)
				c.parents++
			}
		}
	}
	width := 80
	if r.env.TermWidth > 3 && !r.tree.vt100 {
		width = r.env.TermWidth - 3
	}
	more := map[int]bool{}
	var walk func(n *treeNode, depth int, last bool)
	walk = func(n *treeNode, depth int, last bool) {
		more[depth] = !last
		var b strings.Builder
		for d := 0; d < depth; d++ {
			b.WriteByte(' ')
			switch {
			case d == depth-1 && !more[depth]:
				b.WriteString(r.tree.sym.last)
			case d == depth-1:
				b.WriteString(r.tree.sym.branch)
			case more[d+1]:
				b.WriteString(r.tree.sym.vert)
			default:
				b.WriteString(r.tree.sym.empty)
			}
		}
		name := ""
		if n.dev != nil {
			name = n.dev.Name
		}
		b.WriteString(name)
		if r.tree.blkdevname && n.blk != "" {
			fmt.Fprintf(&b, " <%s>", n.blk)
		}
		if r.tree.device {
			fmt.Fprintf(&b, " (%s)", n.label)
		}
		if d := n.dev; d != nil && (r.tree.active || r.tree.rw || r.tree.open || r.tree.uuid) {
			var attrs []string
			if r.tree.active {
				attrs = append(attrs, map[bool]string{false: "ACTIVE", true: "SUSPENDED"}[d.Suspended])
			}
			if r.tree.rw {
				attrs = append(attrs, map[bool]string{false: "RW", true: "RO"}[d.ReadOnly])
			}
			if r.tree.open {
				attrs = append(attrs, num(d.Open))
			}
			if r.tree.uuid {
				attrs = append(attrs, d.UUID)
			}
			fmt.Fprintf(&b, " [%s]", strings.Join(attrs, ", "))
		}
		line := b.String()
		if name == "" && !r.tree.device && !r.tree.blkdevname {
			return
		}
		r.outf("%s\n", r.cut(line, width))
		for i, c := range n.children {
			walk(c, depth+1, i == len(n.children)-1)
		}
	}
	var roots []*treeNode
	for _, n := range order {
		if n.parents == 0 && (n.dev != nil || r.tree.inverted) {
			roots = append(roots, n)
		}
	}
	for i, n := range roots {
		walk(n, 0, i == len(roots)-1)
	}
}

// cut shortens a tree line to width as dmsetup's _out_char does: a line of
// at most width characters is printed whole, a longer one as its first
// width-1 characters and "...".
func (r *run) cut(line string, width int) string {
	if !r.tree.truncate || utf8.RuneCountInString(line) <= width {
		return line
	}
	rs := []rune(line)
	return string(rs[:width-1]) + "..."
}
