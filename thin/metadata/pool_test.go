package metadata

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"os/exec"
	"testing"
)

func TestAbortReturnsToCommitted(t *testing.T) {
	dev := newMemDev(2048)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 20000, CacheBlocks: 32})
	rng := rand.New(rand.NewSource(21))
	m := model{}
	var next uint32
	randomOps(t, rng, p, m, 60, &next)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	freeBefore, _ := p.FreeDataBlocks()
	var id uint32
	for id = range m {
		break
	}
	th, err := p.OpenThin(id)
	if err != nil {
		t.Fatal(err)
	}
	m2 := m.clone()
	n2 := next
	randomOps(t, rng, p, m2, 60, &n2)
	if !p.Changed() {
		t.Fatal("Changed false after changes")
	}
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
	if p.Changed() {
		t.Error("Changed after Abort")
	}
	checkModel(t, p, m)
	verifyCounts(t, p)
	if free, _ := p.FreeDataBlocks(); free != freeBefore {
		t.Errorf("free data blocks %d after abort, %d before", free, freeBefore)
	}
	// The device opened before the abort still reads.
	if n, err := th.MappedCount(); err != nil || n != uint64(len(m[id])) {
		t.Errorf("open device after abort: %d mappings, %v; want %d", n, err, len(m[id]))
	}
	th.Close()
	randomOps(t, rng, p, m, 40, &next)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	checkModel(t, p, m)
}

func TestReadOnly(t *testing.T) {
	dev := newMemDev(256)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 100})
	if err := p.CreateThin(1); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := Open(newMemDev(16), Options{Format: true, ReadOnly: true, DataBlockSize: 128}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("formatting read-only: %v", err)
	}
	img := append([]byte(nil), dev.data...)
	ro := mustOpen(t, noWriteDev{dev, t}, Options{ReadOnly: true, DataBlockSize: 128})
	th, err := ro.OpenThin(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := th.Find(0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Find: %v", err)
	}
	if err := th.Insert(0, 1); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Insert on a read-only store: %v", err)
	}
	for name, err := range map[string]error{
		"CreateThin":    ro.CreateThin(2),
		"Commit":        ro.Commit(),
		"SetNeedsCheck": ro.SetNeedsCheck(),
		"SetReadWrite":  ro.SetReadWrite(),
	} {
		if !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s on a read-only store: %v", name, err)
		}
	}
	if _, err := ro.AllocDataBlock(); !errors.Is(err, ErrReadOnly) {
		t.Errorf("AllocDataBlock on a read-only store: %v", err)
	}
	if !bytes.Equal(img, dev.data) {
		t.Error("a read-only store changed the device")
	}

	// The pool's read-only mode, and back.
	p = mustOpen(t, dev, Options{DataBlockSize: 128})
	p.SetReadOnly()
	if err := p.CreateThin(2); !errors.Is(err, ErrReadOnly) {
		t.Errorf("CreateThin in read-only mode: %v", err)
	}
	if err := p.SetReadWrite(); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(2); err != nil {
		t.Fatal(err)
	}
}

func TestNeedsCheckAndTransactionID(t *testing.T) {
	_, path := newFileDev(t, 256)
	f, _ := os.OpenFile(path, os.O_RDWR, 0)
	defer f.Close()
	p := mustOpen(t, fileDev{f}, Options{Format: true, DataBlockSize: 128, DataBlocks: 100})
	if p.TransactionID() != 0 || p.NeedsCheck() {
		t.Fatal("fresh pool: transaction id or needs_check set")
	}
	if err := p.SetTransactionID(1, 2); err == nil {
		t.Error("SetTransactionID with the wrong old id succeeded")
	}
	if err := p.SetTransactionID(0, 5); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(3); err != nil {
		t.Fatal(err)
	}
	// needs_check goes to the committed superblock at once; the
	// uncommitted changes do not.
	if err := p.SetNeedsCheck(); err != nil {
		t.Fatal(err)
	}
	q := mustOpen(t, fileDev{f}, Options{DataBlockSize: 128, ReadOnly: true})
	if !q.NeedsCheck() || q.TransactionID() != 0 {
		t.Errorf("reopened: needs_check %v, transaction id %d; want true, 0", q.NeedsCheck(), q.TransactionID())
	}
	if _, err := q.OpenThin(3); !errors.Is(err, ErrNoDevice) {
		t.Errorf("uncommitted device visible: %v", err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, fileDev{f}, Options{DataBlockSize: 128})
	if !q.NeedsCheck() || q.TransactionID() != 5 {
		t.Errorf("after commit: needs_check %v, transaction id %d; want true, 5", q.NeedsCheck(), q.TransactionID())
	}
	if _, err := exec.LookPath("thin_check"); err == nil {
		runTool(t, "thin_check", path)
	}
}

// TestGrowth grows the data space map over several bitmaps and the
// metadata device past one metadata bitmap, and checks the result.
func TestGrowth(t *testing.T) {
	dev, path := newFileDev(t, 1000)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 1000})
	if err := p.ResizeData(500); err == nil {
		t.Error("shrinking the data space map succeeded")
	}
	if err := p.ResizeData(50000); err != nil {
		t.Fatal(err)
	}
	if err := p.ResizeMetadata(20000); err == nil {
		t.Error("growing the metadata space map past the device succeeded")
	}
	if err := dev.f.Truncate(20000 * 4096); err != nil {
		t.Fatal(err)
	}
	if err := p.ResizeMetadata(20000); err != nil {
		t.Fatal(err)
	}
	if n, _ := p.MetadataBlocks(); n != 20000 {
		t.Errorf("%d metadata blocks, want 20000", n)
	}
	rng := rand.New(rand.NewSource(8))
	m := model{}
	var next uint32
	randomOps(t, rng, p, m, 40, &next)
	// Use data blocks of the new bitmaps.
	if err := p.CreateThin(1000); err != nil {
		t.Fatal(err)
	}
	m[1000] = map[uint64]uint64{}
	th, _ := p.OpenThin(1000)
	for v := uint64(10000); v < 10000+2*17000; v += 2 {
		d, err := p.AllocDataBlock()
		if err != nil {
			t.Fatal(err)
		}
		if err := th.Insert(v, d); err != nil {
			t.Fatal(err)
		}
		m[1000][v] = d
	}
	th.Close()
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	checkModel(t, p, m)
	if _, err := exec.LookPath("thin_check"); err == nil {
		runTool(t, "thin_check", path)
		got, d := dumpModel(t, path)
		sameModel(t, got, m)
		if d.NrDataBlocks != 50000 {
			t.Errorf("thin_dump: %d data blocks, want 50000", d.NrDataBlocks)
		}
	}
	p.Close()
	q := mustOpen(t, dev, Options{DataBlockSize: 128})
	if n, _ := q.MetadataBlocks(); n != 20000 {
		t.Errorf("reopened: %d metadata blocks, want 20000", n)
	}
	checkModel(t, q, m)
}

// TestLargeMetadataFormat formats a metadata device of several bitmaps.
func TestLargeMetadataFormat(t *testing.T) {
	dev, path := newFileDev(t, 40000)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 100000})
	rng := rand.New(rand.NewSource(12))
	m := model{}
	var next uint32
	randomOps(t, rng, p, m, 40, &next)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	if _, err := exec.LookPath("thin_check"); err == nil {
		runTool(t, "thin_check", path)
	}
}

// TestFormatEmptyDataThenGrow formats as the pool target does, with no
// data blocks until its first resume grows the data space map.
func TestFormatEmptyDataThenGrow(t *testing.T) {
	dev, path := newFileDev(t, 256)
	if _, err := Open(dev, Options{ReadOnly: true, DataBlockSize: 128}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only open of a zeroed device: %v, want ErrReadOnly", err)
	}
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128})
	if n, _ := p.DataBlocks(); n != 0 {
		t.Fatalf("%d data blocks, want 0", n)
	}
	if _, err := p.AllocDataBlock(); !errors.Is(err, ErrNoSpace) || errors.Is(err, ErrNoMetadataSpace) {
		t.Fatalf("alloc from no data blocks: %v, want ErrNoSpace alone", err)
	}
	if _, err := exec.LookPath("thin_check"); err == nil {
		runTool(t, "thin_check", path)
	}
	if err := p.ResizeData(100); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateThin(1); err != nil {
		t.Fatal(err)
	}
	th := mustThin(t, p, 1)
	d, err := p.AllocDataBlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Insert(9, d); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	if _, err := exec.LookPath("thin_check"); err == nil {
		runTool(t, "thin_check", path)
		got, _ := dumpModel(t, path)
		sameModel(t, got, model{1: {9: d}})
	}
}

// TestMetadataFull fills a small metadata device until a change fails
// with ErrNoSpace; Abort returns to the last commit, which thin_check
// finds clean.
func TestMetadataFull(t *testing.T) {
	dev, path := newFileDev(t, 128)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 1 << 18})
	if err := p.CreateThin(1); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	th := mustThin(t, p, 1)
	var full error
	committed := 0
	for v := uint64(0); v < 1<<19 && full == nil; v += 2 {
		d, err := p.AllocDataBlock()
		if err == nil {
			err = th.Insert(v, d)
		}
		if err == nil && v%512 == 0 {
			if err = p.Commit(); err == nil {
				committed = int(v/2) + 1
			}
		}
		full = err
	}
	if !errors.Is(full, ErrNoMetadataSpace) || !errors.Is(full, ErrNoSpace) {
		t.Fatalf("filling the metadata: %v, want ErrNoMetadataSpace", full)
	}
	if err := p.Abort(); err != nil {
		t.Fatal(err)
	}
	if n, _ := th.MappedCount(); n != uint64(committed) {
		t.Errorf("%d mappings after abort, %d committed", n, committed)
	}
	verifyCounts(t, p)
	if _, err := exec.LookPath("thin_check"); err == nil {
		runTool(t, "thin_check", path)
	}
}
