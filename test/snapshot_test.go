package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/snapshot"
)

// The snapshot targets end to end through the dmsetup drop-in, driven as
// lvm2 and dracut's live images drive the kernel's.

// snapSetup is an origin's -real device R over a sparse file, its
// snapshot-origin B, and a helper that adds snapshots as lvm does (the
// origin suspended from before the snapshot's load until after its
// resume), saving a copy of the origin as it is at each snapshot's time.
type snapSetup struct {
	*dmsetupEnv
	sectors int64
	r, b    string
}

func newSnapSetup(t *testing.T, size int64, realTable string) *snapSetup {
	e := newDmsetupEnv(t)
	if realTable == "" {
		img := filepath.Join(e.dir, "origin.img")
		sparseFile(t, img, size)
		realTable = fmt.Sprintf("0 %d linear %s 0", size/512, img)
	}
	return newSnapSetupOn(t, e, size, realTable)
}

// snap makes snapshot name over a new COW file of cowSize bytes with store
// (e.g. "P 8") and returns the copy of the origin taken while it was
// suspended for it.
func (s *snapSetup) snap(name, store string, cowSize int64) []byte {
	s.t.Helper()
	cow := filepath.Join(s.dir, name+".cow")
	sparseFile(s.t, cow, cowSize)
	s.must("suspend", s.b)
	copyAt, err := os.ReadFile("/dev/mapper/" + s.r)
	if err != nil {
		s.t.Fatal(err)
	}
	s.must("create", s.name(name), "--table", fmt.Sprintf("0 %d snapshot /dev/mapper/%s %s %s", s.sectors, s.r, cow, store))
	s.must("resume", s.b)
	return copyAt
}

func readDevice(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSnapshotExt4AndFio: an ext4 origin with two snapshots, taken while
// it was mounted and written (the suspend freezes it); each snapshot reads
// exactly the copy taken at its time and fscks clean, and mounts with the
// files of its time; a verifying fio on one snapshot's device leaves the
// origin and the other snapshot as they were.
func TestSnapshotExt4AndFio(t *testing.T) {
	requireTool(t, "fio", "e2fsck", "cp")
	s := newSnapSetup(t, 96<<20, "")
	origin := "/dev/mapper/" + s.b
	run(t, "mkfs.ext4", "-q", origin)
	mnt := s.mountDev(origin, "mnt")
	writeFile(t, filepath.Join(mnt, "first"), "first\n", true)
	copy1 := s.snap("s1", "P 8", 64<<20)
	s.mustSh(fmt.Sprintf("cp -r /usr/share/doc/fio %s/doc1 && sync", mnt))
	writeFile(t, filepath.Join(mnt, "first"), "changed\n", true)
	copy2 := s.snap("s2", "N 16", 64<<20)
	s.mustSh(fmt.Sprintf("cp -r /usr/share/doc/e2fsprogs %s/doc2 && rm -rf %s/doc1 && sync", mnt, mnt))
	run(t, "umount", mnt)
	originNow := readDevice(t, origin)
	for _, c := range []struct {
		name string
		want []byte
		file string
	}{{"s1", copy1, "first\n"}, {"s2", copy2, "changed\n"}} {
		dev := "/dev/mapper/" + s.name(c.name)
		if got := readDevice(t, dev); !bytes.Equal(got, c.want) {
			t.Errorf("%s does not read the origin as it was when it was taken", c.name)
		}
		run(t, "e2fsck", "-fn", dev)
		m := s.mountDev(dev, c.name+"-mnt")
		if b, err := os.ReadFile(filepath.Join(m, "first")); err != nil || string(b) != c.file {
			t.Errorf("%s: first reads %q, %v", c.name, b, err)
		}
		run(t, "umount", m)
	}
	st := s.must("status", s.name("s1"))
	if !strings.Contains(st, " snapshot ") || strings.Contains(st, "Invalid") {
		t.Errorf("status of s1: %q", st)
	}
	// fio writes and verifies on s2; nothing of it reaches the others (s1
	// as its mount above left it).
	s1Now := readDevice(t, "/dev/mapper/"+s.name("s1"))
	s2 := "/dev/mapper/" + s.name("s2")
	run(t, "fio", "--name=v", "--filename="+s2, "--rw=randwrite", "--bs=4k", "--size=32m", "--direct=1",
		"--ioengine=libaio", "--iodepth=8", "--verify=crc32c", "--verify_fatal=1", "--randrepeat=1", "--verify_state_save=0")
	if got := readDevice(t, origin); !bytes.Equal(got, originNow) {
		t.Error("writes to a snapshot changed the origin")
	}
	if got := readDevice(t, "/dev/mapper/"+s.name("s1")); !bytes.Equal(got, s1Now) {
		t.Error("writes to one snapshot changed another")
	}
	for _, n := range []string{"s1", "s2"} {
		s.must("remove", s.name(n))
	}
	s.must("remove", s.b)
	s.must("remove", s.r)
}

// TestSnapshotOverflow: a P snapshot whose COW fills becomes Invalid (its
// writes and reads fail, an event is raised, the header says invalid), a
// PO one shows Overflow and still reads; the origin goes on.
func TestSnapshotOverflow(t *testing.T) {
	requireTool(t, "dd")
	s := newSnapSetup(t, 16<<20, "")
	s.snap("p", "P 8", 64<<10)
	s.snap("po", "PO 8", 64<<10)
	events := strings.TrimSpace(s.must("info", "-c", "--noheadings", "-o", "events", s.name("p")))
	for _, n := range []string{"p", "po"} {
		out, code := s.sh(fmt.Sprintf("dd if=/dev/zero of=/dev/mapper/%s bs=64k count=4 oflag=direct 2>&1", s.name(n)))
		if code == 0 || !strings.Contains(out, "Input/output error") {
			t.Errorf("%s: filling the COW: exit %d, %s", n, code, out)
		}
	}
	if st := s.must("status", s.name("p")); !strings.HasSuffix(st, " snapshot Invalid\n") {
		t.Errorf("P: %q", st)
	}
	if st := s.must("status", s.name("po")); !strings.HasSuffix(st, " snapshot Overflow\n") {
		t.Errorf("PO: %q", st)
	}
	if after := strings.TrimSpace(s.must("info", "-c", "--noheadings", "-o", "events", s.name("p"))); after == events {
		t.Errorf("no event at invalidation (%s)", after)
	}
	if _, code := s.sh("dd if=/dev/mapper/" + s.name("p") + " of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null"); code == 0 {
		t.Error("an invalid snapshot reads")
	}
	s.mustSh("dd if=/dev/mapper/" + s.name("po") + " of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null")
	s.mustSh("dd if=/dev/urandom of=/dev/mapper/" + s.b + " bs=64k count=8 oflag=direct 2>/dev/null")
	st, err := snapshot.ReadStore(bytes.NewReader(readDevice(t, filepath.Join(s.dir, "p.cow"))), 64<<10)
	if err != nil || st.Valid {
		t.Errorf("the invalid snapshot's COW: %+v, %v", st, err)
	}
}

// TestSnapshotMergeAcrossRestart: lvconvert --merge's sequence through the
// drop-in, the origin written while the merge runs, the daemon stopped in
// the middle and started again with the origin loaded fresh as
// snapshot-merge: the merge goes on from the COW and leaves the origin
// holding what the snapshot held, plus the writes made during it.
func TestSnapshotMergeAcrossRestart(t *testing.T) {
	requireTool(t, "dd")
	const size = 32 << 20
	e := newDmsetupEnv(t)
	img := filepath.Join(e.dir, "origin.img")
	sparseFile(t, img, size)
	// The origin's -real device adds 2 ms to writes, so the merge takes long
	// enough to be stopped in the middle.
	slow := fmt.Sprintf("0 %d delay %s 0 0 %s 0 2", size/512, img, img)
	s := newSnapSetupOn(t, e, size, slow)
	s.mustSh(fmt.Sprintf("dd if=/dev/urandom of=/dev/mapper/%s bs=1M count=32 oflag=direct 2>/dev/null", s.b))
	s.snap("s", "P 8", 32<<20)
	// Writes to the snapshot (what the merge brings back) and to the origin
	// (what the snapshot copies out), on every other chunk.
	s.mustSh(fmt.Sprintf(`for i in $(seq 0 2 1500); do
dd if=/dev/urandom of=/dev/mapper/%s bs=4k count=1 seek=$i oflag=direct 2>/dev/null || exit 1
done
dd if=/dev/urandom of=/dev/mapper/%s bs=4k count=800 seek=1 oflag=direct 2>/dev/null`, s.name("s"), s.b))
	want := readDevice(t, "/dev/mapper/"+s.name("s"))
	cow := filepath.Join(e.dir, "s.cow")
	for _, d := range []string{s.b, s.name("s")} {
		s.must("suspend", d)
	}
	s.must("load", s.b, "--table", fmt.Sprintf("0 %d snapshot-merge /dev/mapper/%s %s P 8", s.sectors, s.r, cow))
	s.must("load", s.name("s"), "--table", fmt.Sprintf("0 %d error", s.sectors))
	s.must("resume", s.b)
	s.must("resume", s.name("s"))
	// Written while merging: a chunk the snapshot held, one it did not.
	during := bytes.Repeat([]byte{0x5a}, 4096)
	for _, blk := range []int{4, 3001} {
		s.mustSh(fmt.Sprintf("printf '%%4096s' | tr ' ' Z | dd of=/dev/mapper/%s bs=4k seek=%d count=1 oflag=direct conv=notrunc 2>/dev/null", s.b, blk))
		copy(want[blk*4096:], during)
	}
	time.Sleep(500 * time.Millisecond)
	mid := s.must("status", s.b)
	stop := exec.Command(dmfuseBin, "stop", "--force")
	stop.Env = s.env
	if out, err := stop.CombinedOutput(); err != nil {
		t.Fatalf("dmfuse stop: %v: %s", err, out)
	}
	st, err := snapshot.ReadStore(bytes.NewReader(readDevice(t, cow)), 32<<20)
	if err != nil || len(st.Exceptions) == 0 {
		t.Fatalf("the COW after the stop (status was %q): %d exceptions, %v", mid, len(st.Exceptions), err)
	}
	t.Logf("stopped with %d exceptions left (status %q)", len(st.Exceptions), strings.TrimSpace(mid))
	// A new daemon: the origin comes back as snapshot-merge over the COW.
	s.must("create", s.r, "--table", fmt.Sprintf("0 %d linear %s 0", s.sectors, img))
	s.must("create", s.b, "--table", fmt.Sprintf("0 %d snapshot-merge /dev/mapper/%s %s P 8", s.sectors, s.r, cow))
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		f := strings.Fields(s.must("status", s.b))
		if len(f) == 5 {
			if used, _, _ := strings.Cut(f[3], "/"); used == f[4] {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the merge did not finish: %v", f)
		}
	}
	if got := readDevice(t, "/dev/mapper/"+s.b); !bytes.Equal(got, want) {
		t.Error("after the merge the origin does not hold the snapshot's data and the writes made during the merge")
	}
	s.must("remove", s.b)
	s.must("remove", s.r)
}

func newSnapSetupOn(t *testing.T, e *dmsetupEnv, size int64, realTable string) *snapSetup {
	s := &snapSetup{dmsetupEnv: e, sectors: size / 512, r: e.name("r"), b: e.name("b")}
	e.must("create", s.r, "--table", realTable)
	e.must("create", s.b, "--table", fmt.Sprintf("0 %d snapshot-origin /dev/mapper/%s", s.sectors, s.r))
	return s
}

// TestSnapshotLiveOverlay: a read-only image under a writable COW file, as
// dracut's live images build it (`snapshot <base> <overlay> PO 8`, no
// snapshot-origin): the overlay mounts read-write, the image stays as it
// was, the COW file is one blkid knows as the kernel's (DM_snapshot_cow),
// and the overlay made again over the same file has the files written.
func TestSnapshotLiveOverlay(t *testing.T) {
	requireTool(t, "blkid", "losetup")
	e := newDmsetupEnv(t)
	base := filepath.Join(e.dir, "rootfs.img")
	sparseFile(t, base, 64<<20)
	run(t, "mkfs.ext4", "-q", base)
	before := readDevice(t, base)
	loop := strings.TrimSpace(run(t, "losetup", "-r", "-f", "--show", base))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	overlay := filepath.Join(e.dir, "overlay")
	sparseFile(t, overlay, 32<<20)
	live := e.name("live-rw")
	table := fmt.Sprintf("0 %d snapshot %s %s PO 8", (64<<20)/512, loop, overlay)
	e.must("create", live, "--table", table)
	mnt := e.mountDev("/dev/mapper/"+live, "live")
	writeFile(t, filepath.Join(mnt, "hello"), "from the live system\n", true)
	run(t, "umount", mnt)
	e.must("remove", live)
	if got := readDevice(t, base); !bytes.Equal(got, before) {
		t.Error("the read-only image changed")
	}
	if out := run(t, "blkid", "-p", "-o", "value", "-s", "TYPE", overlay); strings.TrimSpace(out) != "DM_snapshot_cow" {
		t.Errorf("blkid says the overlay is %q", out)
	}
	e.must("create", live, "--table", table)
	mnt = e.mountDev("/dev/mapper/"+live, "live2")
	if b, err := os.ReadFile(filepath.Join(mnt, "hello")); err != nil || string(b) != "from the live system\n" {
		t.Errorf("the overlay made again: %q, %v", b, err)
	}
	run(t, "umount", mnt)
	e.must("remove", live)
}
