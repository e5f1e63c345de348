package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDMStatsMount drives dm-stats on a real mount with `dmfuse message`:
// regions are created and listed, O_DIRECT I/O on the device file is counted
// in the areas it overlaps (a read across an area boundary in both), empty
// flushes are not counted, bad messages fail with the kernel's errors, and
// regions go away with their device.
func TestDMStatsMount(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "lin.img")
	sparseFile(t, img, 2048*sector)
	d := startDaemon(t, dir, fmt.Sprintf("lin,,,rw,0 2048 linear %s 0;", img))
	msg := func(name string, words ...string) string {
		t.Helper()
		return d.must(append([]string{"message", name, "0"}, words...)...)
	}
	if out := msg("lin", "@stats_create", "-", "/4"); out != "0\n" {
		t.Fatalf("@stats_create: %q", out)
	}
	if out := msg("lin", "@stats_create", "0+100", "30", "2", "precise_timestamps", "histogram:1000000,2000000", "myprog", "myaux"); out != "1\n" {
		t.Fatalf("@stats_create: %q", out)
	}
	want := "0: 0+2048 512 - -\n1: 0+100 30 myprog myaux precise_timestamps histogram:1000000,2000000\n"
	if out := msg("lin", "@stats_list"); out != want {
		t.Errorf("@stats_list: %q, want %q", out, want)
	}

	f, err := os.OpenFile(d.path("lin"), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for _, off := range []int64{0, 508 * sector} {
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(buf, 1024*sector); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// Columns 1 to 9 (reads, merged, sectors, ms, writes, merged, sectors,
	// ms, in flight) without the times, which depend on the clock.
	out := msg("lin", "@stats_print", "0")
	var got []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		fs := strings.Fields(l)
		if len(fs) != 14 {
			t.Fatalf("@stats_print line %q: %d fields, want 14", l, len(fs))
		}
		got = append(got, strings.Join([]string{fs[0], fs[1], fs[3], fs[5], fs[7], fs[9]}, " "))
	}
	wantAreas := []string{"0+512 2 12 0 0 0", "512+512 1 4 0 0 0", "1024+512 0 0 1 8 0", "1536+512 0 0 0 0 0"}
	if strings.Join(got, "|") != strings.Join(wantAreas, "|") {
		t.Errorf("@stats_print 0 (start+step reads sectors writes sectors inflight):\n%s\nwant\n%s\nfull:\n%s",
			strings.Join(got, "\n"), strings.Join(wantAreas, "\n"), out)
	}
	if out := msg("lin", "@stats_print", "1", "0", "1"); !strings.HasPrefix(out, "0+30 1 ") || strings.Count(out, ":") != 2 {
		t.Errorf("@stats_print 1 0 1: %q", out)
	}
	msg("lin", "@stats_print_clear", "0", "-", "1")
	if out := msg("lin", "@stats_print", "0", "0", "2"); !strings.HasPrefix(out, "0+512 0 0 0 0 0 0 0 0 0 0 0 0 0\n512+512 1 ") {
		t.Errorf("after @stats_print_clear 0 - 1: %q", out)
	}

	for _, c := range []struct{ words, errs string }{
		{"@stats_create 10+0 1", "Invalid parameters for message @stats_create"},
		{"@stats_create - 0", "Invalid parameters for message @stats_create"},
		{"@stats_create - 1 1 histogram:5,4", "Invalid parameters for message @stats_create"},
		{"@stats_delete 7", "no such file or directory"},
		{"@stats_print 0 1", "Invalid parameters for message @stats_print"},
		{"@stats_bogus", "Unsupported message sent to DM core"},
	} {
		args := append([]string{"message", "lin", "0"}, strings.Fields(c.words)...)
		if _, errs, code := d.dmfuse("/", "", args...); code == 0 || !strings.Contains(errs, c.errs) {
			t.Errorf("%s: exit %d, stderr %q; want a failure with %q", c.words, code, errs, c.errs)
		}
	}
	if out := msg("lin", "@stats_list"); out != want {
		t.Errorf("failed messages changed the regions: %q", out)
	}

	d.must("create", "scratch", "--table", "0 64 zero")
	if out := msg("scratch", "@stats_create", "-", "1"); out != "0\n" {
		t.Fatalf("@stats_create on scratch: %q", out)
	}
	d.must("remove", "scratch")
	d.must("create", "scratch", "--table", "0 64 zero")
	if out := msg("scratch", "@stats_list"); out != "" {
		t.Errorf("regions survived their device: %q", out)
	}
	msg("lin", "@stats_delete", "0")
	msg("lin", "@stats_delete", "1")
	if out := msg("lin", "@stats_list"); out != "" {
		t.Errorf("@stats_list after deleting both: %q", out)
	}
}
