package metadata

import (
	"encoding/xml"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The interop tests run the thin-provisioning-tools when they are
// installed. CI installs them and sets DMFUSE_REQUIRE_FUSE=1, under which a
// missing tool fails the test instead of skipping it.

func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("DMFUSE_REQUIRE_FUSE") == "1" {
			t.Fatalf("%s not installed (DMFUSE_REQUIRE_FUSE=1)", name)
		}
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

type xmlDump struct {
	Time          uint32      `xml:"time,attr"`
	Transaction   uint64      `xml:"transaction,attr"`
	DataBlockSize uint32      `xml:"data_block_size,attr"`
	NrDataBlocks  uint64      `xml:"nr_data_blocks,attr"`
	Devices       []xmlDevice `xml:"device"`
}

type xmlDevice struct {
	ID           uint32 `xml:"dev_id,attr"`
	MappedBlocks uint64 `xml:"mapped_blocks,attr"`
	Transaction  uint64 `xml:"transaction,attr"`
	CreationTime uint32 `xml:"creation_time,attr"`
	SnapTime     uint32 `xml:"snap_time,attr"`
	Singles      []struct {
		Origin uint64 `xml:"origin_block,attr"`
		Data   uint64 `xml:"data_block,attr"`
		Time   uint32 `xml:"time,attr"`
	} `xml:"single_mapping"`
	Ranges []struct {
		Origin uint64 `xml:"origin_begin,attr"`
		Data   uint64 `xml:"data_begin,attr"`
		Length uint64 `xml:"length,attr"`
		Time   uint32 `xml:"time,attr"`
	} `xml:"range_mapping"`
}

// dumpModel runs thin_dump (with args) and returns what it lists.
func dumpModel(t *testing.T, path string, args ...string) (model, xmlDump) {
	t.Helper()
	out := runTool(t, "thin_dump", append(args, path)...)
	var d xmlDump
	if err := xml.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("thin_dump output: %v\n%.2000s", err, out)
	}
	m := model{}
	for _, dev := range d.Devices {
		mp := map[uint64]uint64{}
		for _, s := range dev.Singles {
			mp[s.Origin] = s.Data
		}
		for _, r := range dev.Ranges {
			for i := uint64(0); i < r.Length; i++ {
				mp[r.Origin+i] = r.Data + i
			}
		}
		m[dev.ID] = mp
	}
	return m, d
}

func sameModel(t *testing.T, got, want model) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d devices, want %d", len(got), len(want))
	}
	for id, mp := range want {
		g, ok := got[id]
		if !ok {
			t.Fatalf("device %d missing", id)
		}
		if len(g) != len(mp) {
			t.Fatalf("device %d: %d mappings, want %d", id, len(g), len(mp))
		}
		for k, v := range mp {
			if g[k] != v {
				t.Fatalf("device %d block %d: %d, want %d", id, k, g[k], v)
			}
		}
	}
}

// TestInteropWriteCheckDump writes metadata through the Store and has
// thin_check find it clean and thin_dump list the same devices and
// mappings, across commits with snapshots, removals and deletions.
func TestInteropWriteCheckDump(t *testing.T) {
	needTool(t, "thin_check")
	dev, path := newFileDev(t, 2048)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 30000, CacheBlocks: 128})
	rng := rand.New(rand.NewSource(7))
	m := model{}
	var next uint32
	for r := 0; r < 4; r++ {
		randomOps(t, rng, p, m, 80, &next)
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
		runTool(t, "thin_check", path)
		got, d := dumpModel(t, path)
		sameModel(t, got, m)
		if d.Time != p.time || d.Transaction != p.TransactionID() || d.DataBlockSize != 128 || d.NrDataBlocks != 30000 {
			t.Fatalf("thin_dump superblock %+v", d)
		}
		for _, dev := range d.Devices {
			st, ok, err := p.device(dev.ID)
			if err != nil || !ok {
				t.Fatalf("device %d: %v", dev.ID, err)
			}
			if st.d != (deviceDetails{dev.MappedBlocks, dev.Transaction, dev.CreationTime, dev.SnapTime}) {
				t.Fatalf("device %d: details %+v, thin_dump %+v", dev.ID, st.d, dev)
			}
		}
	}
	verifyCounts(t, p)
}

// TestInteropRestoreOpen has thin_restore write metadata from XML and
// reads its mappings through Open, then changes it and checks it again.
func TestInteropRestoreOpen(t *testing.T) {
	needTool(t, "thin_restore")
	dir := t.TempDir()
	var b strings.Builder
	want := model{1: {}, 7: {}}
	fmt.Fprintf(&b, `<superblock uuid="" time="1" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="20000">`+"\n")
	fmt.Fprintf(&b, `<device dev_id="1" mapped_blocks="1500" transaction="0" creation_time="0" snap_time="1">`+"\n")
	fmt.Fprintf(&b, `<range_mapping origin_begin="0" data_begin="100" length="1000" time="0"/>`+"\n")
	for i := uint64(0); i < 1000; i++ {
		want[1][i] = 100 + i
	}
	for i := uint64(0); i < 500; i++ {
		fmt.Fprintf(&b, `<single_mapping origin_block="%d" data_block="%d" time="1"/>`+"\n", 5000+3*i, 3000+2*i)
		want[1][5000+3*i] = 3000 + 2*i
	}
	b.WriteString("</device>\n")
	fmt.Fprintf(&b, `<device dev_id="7" mapped_blocks="10" transaction="2" creation_time="1" snap_time="1">`+"\n")
	fmt.Fprintf(&b, `<range_mapping origin_begin="40" data_begin="100" length="10" time="0"/>`+"\n")
	for i := uint64(0); i < 10; i++ {
		want[7][40+i] = 100 + i
	}
	b.WriteString("</device>\n</superblock>\n")
	xmlPath := filepath.Join(dir, "in.xml")
	if err := os.WriteFile(xmlPath, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	metaPath := filepath.Join(dir, "meta")
	if err := os.WriteFile(metaPath, make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "thin_restore", "-i", xmlPath, "-o", metaPath)
	f, err := os.OpenFile(metaPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := mustOpen(t, fileDev{f}, Options{DataBlockSize: 128})
	if p.TransactionID() != 3 {
		t.Errorf("transaction id %d, want 3", p.TransactionID())
	}
	checkModel(t, p, want)
	if n, _ := p.DataBlocks(); n != 20000 {
		t.Errorf("%d data blocks, want 20000", n)
	}
	if free, _ := p.FreeDataBlocks(); free != 20000-1500 {
		t.Errorf("%d free data blocks, want %d", free, 20000-1500)
	}
	verifyCounts(t, p)
	th, err := p.OpenThin(7)
	if err != nil {
		t.Fatal(err)
	}
	if _, shared, err := th.Find(40); err != nil || !shared {
		t.Errorf("block 40 of device 7: shared %v, %v; want shared", shared, err)
	}
	d, err := p.AllocDataBlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Insert(40, d); err != nil {
		t.Fatal(err)
	}
	want[7][40] = d
	th.Close()
	if err := p.DeleteThin(1); err != nil {
		t.Fatal(err)
	}
	delete(want, 1)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	runTool(t, "thin_check", metaPath)
	got, _ := dumpModel(t, metaPath)
	sameModel(t, got, want)
}

// TestInteropMetadataSnap takes a metadata snapshot and has thin_dump -m
// list the mappings of the moment it was taken, while the live pool
// moves on; after the release thin_check is clean again.
func TestInteropMetadataSnap(t *testing.T) {
	needTool(t, "thin_dump")
	dev, path := newFileDev(t, 2048)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 30000})
	rng := rand.New(rand.NewSource(3))
	m := model{}
	var next uint32
	randomOps(t, rng, p, m, 60, &next)
	if err := p.ReserveMetadataSnap(); err != nil {
		t.Fatal(err)
	}
	if err := p.ReserveMetadataSnap(); err == nil {
		t.Fatal("second ReserveMetadataSnap succeeded")
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	snap := m.clone()
	held := p.MetadataSnap()
	if held == 0 {
		t.Fatal("no held root after ReserveMetadataSnap")
	}
	verifyCounts(t, p)
	randomOps(t, rng, p, m, 60, &next)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	runTool(t, "thin_check", path)
	got, _ := dumpModel(t, path, "-m")
	sameModel(t, got, snap)
	got, _ = dumpModel(t, path, fmt.Sprintf("--metadata-snap=%d", held))
	sameModel(t, got, snap)
	live, _ := dumpModel(t, path)
	sameModel(t, live, m)
	if err := p.ReleaseMetadataSnap(); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if p.MetadataSnap() != 0 {
		t.Fatal("held root after release")
	}
	verifyCounts(t, p)
	runTool(t, "thin_check", path)
}

// TestInteropManyDevices makes the top level of the mapping tree and the
// details tree several levels deep (hundreds of devices, snapshots of
// snapshots), deletes a third of them, and checks with the tools.
func TestInteropManyDevices(t *testing.T) {
	needTool(t, "thin_check")
	dev, path := newFileDev(t, 4096)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 100000, CacheBlocks: 64})
	m := model{}
	rng := rand.New(rand.NewSource(17))
	for id := uint32(0); id < 700; id++ {
		if id%3 == 0 || id < 3 {
			if err := p.CreateThin(id); err != nil {
				t.Fatal(err)
			}
			m[id] = map[uint64]uint64{}
		} else {
			origin := uint32(rng.Intn(int(id)))
			for m[origin] == nil {
				origin = uint32(rng.Intn(int(id)))
			}
			if err := p.CreateSnap(id, origin); err != nil {
				t.Fatal(err)
			}
			m[id] = map[uint64]uint64{}
			for k, v := range m[origin] {
				m[id][k] = v
			}
		}
		th := mustThin(t, p, id)
		for j := 0; j < 10; j++ {
			d, err := p.AllocDataBlock()
			if err != nil {
				t.Fatal(err)
			}
			v := uint64(rng.Intn(600))
			if err := th.Insert(v, d); err != nil {
				t.Fatal(err)
			}
			m[id][v] = d
		}
		if err := th.Close(); err != nil {
			t.Fatal(err)
		}
		if id%100 == 99 {
			if err := p.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for id := uint32(0); id < 700; id += 3 {
		if err := p.DeleteThin(id); err != nil {
			t.Fatal(err)
		}
		delete(m, id)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	verifyCounts(t, p)
	runTool(t, "thin_check", path)
	got, _ := dumpModel(t, path)
	sameModel(t, got, m)
}
