package dmsetup

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/internal/golden"
)

// TestDmsetupTranscript runs the verbs around stacked devices (ls --tree, deps,
// column fields, --target, -v, wipe_table, remove_all) and compares the
// session with testdata/transcript.golden. Paths of the test's folder show
// as DIR.
func TestDmsetupTranscript(t *testing.T) {
	h := newHarness(t)
	h.env["LANG"] = "C.UTF-8"
	tr := &transcript{h: h}
	tr.step("", "create", "base", "--table", "0 8192 zero")
	tr.step("", "create", "low", "--table", "0 4096 linear base 0\n4096 4096 error")
	tr.step("0 2048 linear low 0\n2048 2048 linear 253:0 2048\n", "create", "mid")
	tr.step("", "create", "top", "-u", "LVM-top", "--table", "0 1024 linear mid 0")
	tr.step("", "create", "solo", "--table", "0 8 zero")
	tr.step("", "ls", "--tree")
	tr.step("", "ls", "--tree", "-o", "ascii,blkdevname,active,open,rw,uuid,notrunc")
	tr.step("", "ls", "--tree", "-o", "inverted,ascii")
	tr.step("", "ls", "-o", "blkdevname")
	tr.step("", "ls", "--target", "zero")
	tr.step("", "deps")
	tr.step("", "deps", "-o", "devname", "mid", "low")
	tr.step("", "info", "-c", "-o", "name,device_count,devs_used,devnos_used,names_using_dev,device_ref_count,subsystem")
	tr.step("", "info", "-c", "-O", "-minor", "-o", "name,minor,devno,suspended,readonly,tables_loaded")
	tr.step("", "info", "-c", "-o", "+bogus")
	tr.step("", "table", "--target", "linear")
	tr.step("", "status", "-v", "mid", "solo")
	tr.step("", "table", "--concise")
	tr.step("", "remove", "low")
	tr.step("", "remove", "--deferred", "low")
	tr.step("", "info", "low")
	tr.step("", "wipe_table", "solo")
	tr.step("", "table", "solo")
	tr.step("", "wait", "solo", "1")
	tr.step("", "rename", "solo", "solo2")
	tr.step("", "-v", "wait", "solo2", "0")
	tr.step("", "rename", "solo2", "solo")
	tr.step("", "suspend", "-v", "solo")
	tr.step("", "resume", "solo", "--nolockfs", "--noflush")
	tr.step("", "remove_all")
	tr.step("", "ls")
	tr.step("", "targets")
	tr.step("", "target-version", "zero")
	tr.step("", "mangle")
	tr.step("", "mknodes")
	tr.step("", "splitname", "a-b")
	got := strings.ReplaceAll(tr.b.String(), h.dir, "DIR")
	golden.Check(t, filepath.Join("testdata", "transcript.golden"), []byte(got))
}
