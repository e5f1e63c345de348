package logwrites

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// TestReplayLibrary drives the replay-log engine as a library, on a log the
// target wrote: it counts the entries, finds a mark, and replays up to the
// mark onto a file, which then holds what the data device held at the mark
// and nothing written after it.
func TestReplayLibrary(t *testing.T) {
	data, logd := stacktest.NewMemDevice("data", 1<<20), stacktest.NewMemDevice("log", 1<<20)
	l := newTestLogWrites(t, data, logd)
	lwWrite(t, l, lwCtx, 0, 'a', 4096)
	lwWrite(t, l, lwCtx, 8192, 'b', 4096)
	lwFlush(t, l)
	lwMark(t, l, "one")
	atMark := bytes.Clone(data.Bytes())
	lwWrite(t, l, lwCtx, 0, 'c', 4096)
	lwFlush(t, l)
	l.Close()
	dir := t.TempDir()
	logPath, target := filepath.Join(dir, "log"), filepath.Join(dir, "target")
	if err := os.WriteFile(logPath, logd.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(o ReplayOptions) (string, string, int) {
		t.Helper()
		o.Prog, o.Usage, o.Log = "replay-log", "usage\n", logPath
		if o.EndSector == 0 {
			o.EndSector = 1<<64 - 1
		}
		var out, errs strings.Builder
		status := Replay(o, &out, &errs)
		return out.String(), errs.String(), status
	}
	// write, write, flush, mark, write, flush, and the end mark of the
	// teardown.
	if out, errs, status := run(ReplayOptions{NumEntries: true}); out != "7\n" || errs != "" || status != 0 {
		t.Errorf("--num-entries: %q, %q, status %d; want 7", out, errs, status)
	}
	mark := "one"
	if out, _, status := run(ReplayOptions{Find: true, EndMark: &mark, StopFlags: FlagMark}); out != "3@21\n" || status != 0 {
		t.Errorf("--find --end-mark one: %q, status %d; want entry 3, after log unit 20", out, status)
	}
	if out, errs, status := run(ReplayOptions{Replay: target, HasReplay: true, EndMark: &mark, StopFlags: FlagMark}); out != "" || errs != "" || status != 0 {
		t.Fatalf("replay to the mark: %q, %q, status %d", out, errs, status)
	}
	got, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, atMark) {
		t.Error("the replayed file differs from the data device at the mark")
	}
	if out, errs, status := run(ReplayOptions{Fsck: "true", HasFsck: true}); status != 1 || errs != "usage\n" || out != "" {
		t.Errorf("--fsck without --check: %q, %q, status %d; want the usage and status 1", out, errs, status)
	}
}
