package stack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEscapedPathsLoadAgain: every target prints its device arguments so
// that the table text loads again (the kernel's dm_split_args takes a
// backslash before a space as part of the argument), here over a backing
// file with a space in its name.
func TestEscapedPathsLoadAgain(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "a b.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	esc := strings.ReplaceAll(img, " ", `\ `)
	reg, _ := NewRegistry(Linear, Striped, Zero, Error, Flakey, Dust)
	m := NewManager(ManagerOptions{Registry: reg})
	defer m.Close()
	for _, tc := range []struct{ table, want string }{
		{`0 2048 linear ./a\ b.img 0`, "0 2048 linear " + esc + " 0\n"},
		{`0 2048 striped 2 8 ./a\ b.img 0 ./a\ b.img 1024`, "0 2048 striped 2 8 " + esc + " 0 " + esc + " 1024\n"},
		{`0 2048 flakey ./a\ b.img 0 1 0`, "0 2048 flakey " + esc + " 0 1 0 2 error_reads error_writes\n"},
		{`0 2048 dust ./a\ b.img 0 4096`, "0 2048 dust " + esc + " 0 4096\n"},
		{`0 2048 error ./a\ b.img 0`, "0 2048 error \n"},
	} {
		d, err := m.Create(CreateOptions{Name: "d", Minor: -1, Table: tc.table, Dir: dir})
		if err != nil {
			t.Errorf("%q: %v", tc.table, err)
			continue
		}
		got := d.Live().Format(StatusTable)
		if got != tc.want {
			t.Errorf("%q prints %q, want %q", tc.table, got, tc.want)
		}
		if err := m.Load("d", got, dir); err != nil {
			t.Errorf("the table %q does not load again: %v", got, err)
		}
		if err := m.Remove("d", Flags{}); err != nil {
			t.Fatal(err)
		}
	}
}
