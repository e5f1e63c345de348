package metadata

import (
	"os/exec"
	"testing"
)

func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed", name)
	}
	return p
}

func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(needTool(t, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func TestInteropSmoke(t *testing.T) {
	dev, path := newFileDev(t, 1024)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 1000})
	if err := p.CreateThin(1); err != nil {
		t.Fatal(err)
	}
	th, err := p.OpenThin(1)
	if err != nil {
		t.Fatal(err)
	}
	for v := uint64(0); v < 600; v++ {
		d, err := p.AllocDataBlock()
		if err != nil {
			t.Fatal(err)
		}
		if err := th.Insert(v*3, d); err != nil {
			t.Fatal(err)
		}
	}
	th.Close()
	if err := p.CreateSnap(2, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	t.Log(runTool(t, "thin_check", path))
	out := runTool(t, "thin_dump", path)
	if len(out) > 2000 {
		out = out[:2000]
	}
	t.Log(out)
}
