package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dmfuse exec end to end: the real dmsetup, lvm2, cryptsetup and kpartx
// (Debian's packages) run under `dmfuse exec` against a private system
// instance, as on a kernel with device-mapper.

// execEnv is a dmsetupEnv whose commands run under dmfuse exec, with an
// lvm configuration of their own: lvm sees only the test's loop devices and
// keeps its backups in the test's folder.
type execEnv struct {
	*dmsetupEnv
	lvmDir string
}

func newExecEnv(t *testing.T, tools ...string) *execEnv {
	t.Helper()
	requireTool(t, append([]string{"bash"}, tools...)...)
	e := &execEnv{dmsetupEnv: newDmsetupEnv(t)}
	e.lvmDir = filepath.Join(e.dir, "lvm")
	if err := os.MkdirAll(e.lvmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.lvmFilter()
	// The real dmsetup, not the drop-in the env puts first on PATH.
	path := strings.TrimPrefix(os.Getenv("PATH"), filepath.Join(e.dir, "bin")+":")
	e.env = append(e.env, "LVM_SYSTEM_DIR="+e.lvmDir, "PATH=/usr/sbin:/sbin:"+path)
	return e
}

// lvmFilter writes an lvm.conf that accepts only the given devices (none:
// no PV at all) and no devices file.
func (e *execEnv) lvmFilter(devs ...string) {
	var accept []string
	for _, d := range devs {
		accept = append(accept, fmt.Sprintf(`"a|^%s$|"`, d))
	}
	accept = append(accept, `"r|.*|"`)
	conf := fmt.Sprintf(`devices {
	global_filter = [ %s ]
	use_devicesfile = 0
	obtain_device_list_from_udev = 0
}
backup {
	backup_dir = "%s/backup"
	archive_dir = "%s/archive"
}
`, strings.Join(accept, ", "), e.lvmDir, e.lvmDir)
	if err := os.WriteFile(filepath.Join(e.lvmDir, "lvm.conf"), []byte(conf), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// exec runs script with bash under dmfuse exec and returns its output and
// exit status.
func (e *execEnv) exec(script string) (string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, dmfuseBin, "exec", "--", "bash", "-c", script)
	cmd.Env, cmd.Dir = e.env, e.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("dmfuse exec: %v", err)
	}
	if ctx.Err() != nil {
		e.t.Fatalf("dmfuse exec timed out:\n%s", &out)
	}
	return out.String(), code
}

// mustExec runs script and fails the test unless it exits 0.
func (e *execEnv) mustExec(script string) string {
	e.t.Helper()
	out, code := e.exec(script)
	if code != 0 {
		e.t.Fatalf("exit %d from\n%s\noutput:\n%s", code, script, out)
	}
	return out
}

// TestExecDmsetup: the real dmsetup (libdevmapper's, over DM ioctls) drives
// devices under dmfuse exec, and prints what the drop-in prints for the
// same devices: both talk to the same daemon.
func TestExecDmsetup(t *testing.T) {
	e := newExecEnv(t, "/usr/sbin/dmsetup")
	lo := e.loop("lo", 32<<20)
	a, b := e.name("a"), e.name("b")
	e.mustExec(fmt.Sprintf(`set -e
dmsetup create %[1]s -u U-%[1]s --readahead +8 --table "0 8192 linear %[3]s 0
8192 8192 zero"
dmsetup create %[2]s --table "0 4096 linear /dev/mapper/%[1]s 100"
dmsetup message %[1]s 0 @stats_create - /2
dmsetup suspend %[2]s
dmsetup load %[2]s --table "0 4096 linear /dev/mapper/%[1]s 200"
dmsetup resume %[2]s --readahead 1001
dmsetup mknodes`, a, b, lo))
	for _, args := range [][]string{
		{"table", a}, {"table", b}, {"status", a}, {"status", b}, {"info", a}, {"info", b},
		{"info", "-c", a}, {"info", "-c", "-o", "name,major,minor,attr,open,segments,events,uuid,read_ahead", b},
		{"deps", b}, {"deps", "-o", "devname", b}, {"ls", "--target", "zero"}, {"table", "--target", "zero"},
		{"message", a, "0", "@stats_list"}, {"status", "--target", "linear"}, {"targets"},
	} {
		// Run both in the same namespace, so that node paths look alike.
		script := "dmsetup " + strings.Join(quoteAll(args), " ") + "; echo \"exit $?\"; echo ===; " +
			"PATH=" + filepath.Join(e.dir, "bin") + ":$PATH dmsetup " + strings.Join(quoteAll(args), " ") + "; echo \"exit $?\""
		out := e.mustExec(script)
		real, dropIn, _ := strings.Cut(out, "===\n")
		if real != dropIn {
			t.Errorf("dmsetup %s:\nreal dmsetup:\n%s\ndrop-in:\n%s", strings.Join(args, " "), real, dropIn)
		}
	}
	// Read-ahead: the default, kept by +8, and 1001 sectors set in KiB
	// through sysfs, which the kernel rounds down to pages.
	if out := e.mustExec("dmsetup info -c --noheadings -o read_ahead " + a + " " + b); out != "256\n1000\n" {
		t.Errorf("read-ahead: %q", out)
	}
	// Numbers are the devices' own, fixed at create, and names resolve.
	if out := e.mustExec("dmsetup info -c --noheadings -o major,minor " + a); strings.TrimSpace(out) != e.devNo(a) {
		t.Errorf("numbers: real %q, drop-in %q", out, e.devNo(a))
	}
	// A refused table: the real dmsetup's line, and the kernel's reason in
	// the daemon's log (and the kernel log).
	out, code := e.exec(fmt.Sprintf(`dmsetup create %s --table "0 10 linear /nosuch 0"`, e.name("bad")))
	if code == 0 || !strings.Contains(out, "device-mapper: reload ioctl on "+e.name("bad")) {
		t.Errorf("a refused table: exit %d:\n%s", code, out)
	}
	if log, _ := os.ReadFile(filepath.Join(e.run, "daemon.log")); !strings.Contains(string(log), ": linear: Device lookup failed: /nosuch") ||
		!strings.Contains(string(log), "device-mapper: ioctl: error adding target to table") {
		t.Errorf("the kernel's lines are not in the daemon's log:\n%s", log)
	}
	e.mustExec(fmt.Sprintf("dmsetup remove %s && dmsetup remove %s", b, a))
	if out := e.must("ls"); strings.Contains(out, a) {
		t.Errorf("left after remove: %s", out)
	}
}

// realDmsetupTest runs the drop-in's end-to-end tests with Debian's dmsetup
// under dmfuse exec as dmsetup (newDmsetupEnv sets it up for its subtests).
const realDmsetupTest = "TestRealDmsetup"

// TestRealDmsetup: the drop-in's end-to-end tests pass with the real
// dmsetup in its place, the rest of each test (mount, fsck, dd on
// /dev/mapper/NAME) running outside dmfuse exec as before. Left out: the
// tests of the drop-in's own mechanics (starting the daemon, a daemon that
// dies, its descriptors, the host's /dev/mapper links, which the real
// dmsetup sees only as its private mapper folder and dm-N names) and of
// the names and input the drop-in refuses beyond what dm refuses.
func TestRealDmsetup(t *testing.T) {
	requireTool(t, "/usr/sbin/dmsetup")
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"FlakeyCycle", TestDmsetupFlakeyCycle}, {"ErrorWrites", TestDmsetupErrorWrites}, {"Dust", TestDmsetupDust},
		{"ErrorSwap", TestDmsetupErrorSwap}, {"Stacked", TestDmsetupStacked}, {"SuspendLockFS", TestDmsetupSuspendLockFS},
		{"RemoveMounted", TestDmsetupRemoveMounted}, {"SelfReference", TestDmsetupSelfReference},
		{"Claims", TestDmsetupClaims}, {"ThawAfterUnmount", TestDmsetupThawAfterUnmount},
		{"ThinContainerd", TestThinContainerdSequence}, {"ThinXfstests", TestThinXfstestsSequence},
		{"ThinStatusNoFlush", TestThinStatusNoFlush}, {"ThinNoSpace", TestThinNoSpaceErrnoCrossingBlocks},
	} {
		t.Run(tc.name, tc.f)
	}
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}

// TestExecLVM: the lvm2 workflows on loop devices under dmfuse exec, with
// the data checked after every reactivation and after a new daemon.
func TestExecLVM(t *testing.T) {
	e := newExecEnv(t, "/usr/sbin/lvm", "mkfs.xfs", "xfs_growfs", "thin_check", "e2fsck")
	l1, l2 := e.loop("pv1", 600<<20), e.loop("pv2", 600<<20)
	e.lvmFilter(l1, l2)
	vg := strings.ReplaceAll(e.name("vg"), "-", "_")
	mnt := filepath.Join(e.dir, "mnt")
	os.MkdirAll(mnt, 0o755)
	t.Cleanup(func() {
		e.exec(fmt.Sprintf("umount %s 2>/dev/null; vgremove -ff -y %s; pvremove -ff -y %s %s", mnt, vg, l1, l2))
	})
	e.mustExec(fmt.Sprintf(`set -ex
pvcreate -y %[2]s %[3]s
vgcreate %[1]s %[2]s %[3]s
lvcreate -y -L 32M -n lin %[1]s
lvcreate -y -i2 -L 64M -n str %[1]s
mkfs.ext4 -q /dev/%[1]s/lin
mount /dev/%[1]s/lin %[4]s && echo linear-data > %[4]s/f && umount %[4]s
lvextend -r -L 48M %[1]s/lin
lvreduce -r -y -L 40M %[1]s/lin
lvcreate -y -L 320M -n xfs %[1]s
mkfs.xfs -q -f /dev/%[1]s/xfs
lvextend -r -L 400M %[1]s/xfs
lvrename %[1]s str striped
lvchange -an %[1]s/striped
lvchange -ay %[1]s/striped
lvcreate -y --type thin-pool -L 64M -n pool %[1]s
lvcreate -y -V 128M -T %[1]s/pool -n thin
mkfs.ext4 -q /dev/%[1]s/thin
mount /dev/%[1]s/thin %[4]s && echo thin-data > %[4]s/f && umount %[4]s
lvcreate -y -s %[1]s/thin -n tsnap
vgchange -an %[1]s
vgchange -ay %[1]s
mount /dev/%[1]s/lin %[4]s && cat %[4]s/f && umount %[4]s
mount /dev/%[1]s/thin %[4]s && cat %[4]s/f && umount %[4]s
lvs -o lv_name,lv_attr,lv_size,devices --noheadings %[1]s
vgs --noheadings -o vg_name,pv_count,lv_count %[1]s
pvs --noheadings -o pv_name,vg_name`, vg, l1, l2, mnt))
	// lvm ran thin_check on the pool's metadata as it activated it, and a
	// check now finds it clean.
	e.mustExec(fmt.Sprintf(`set -e; lvchange -an %[1]s/pool %[1]s/thin %[1]s/tsnap
lvchange -ay -y -K %[1]s/pool_tmeta; thin_check /dev/mapper/%[1]s-pool_tmeta; lvchange -an -y %[1]s/pool_tmeta`, vg))
	out := e.mustExec(fmt.Sprintf("lvs --noheadings -o lv_name %s", vg))
	for _, lv := range []string{"lin", "striped", "xfs", "pool", "thin", "tsnap"} {
		if !strings.Contains(out, lv) {
			t.Errorf("lvs lacks %s:\n%s", lv, out)
		}
	}
	// A new daemon: vgchange -ay brings the volumes back with their data.
	e.mustExec("vgchange -an " + vg)
	stop := exec.Command(dmfuseBin, "stop")
	stop.Env = e.env
	if out, err := stop.CombinedOutput(); err != nil {
		t.Fatalf("dmfuse stop: %v: %s", err, out)
	}
	out = e.mustExec(fmt.Sprintf(`set -e
vgchange -ay %[1]s
mount /dev/%[1]s/lin %[2]s && cat %[2]s/f && umount %[2]s
mount /dev/%[1]s/thin %[2]s && cat %[2]s/f && umount %[2]s
e2fsck -fn /dev/%[1]s/thin >/dev/null
lvremove -y %[1]s/tsnap %[1]s/thin %[1]s/pool %[1]s/lin %[1]s/striped %[1]s/xfs
vgremove -y %[1]s`, vg, mnt))
	if !strings.Contains(out, "linear-data") || !strings.Contains(out, "thin-data") {
		t.Errorf("data after a new daemon:\n%s", out)
	}
}

// TestExecLVMSnapshot: lvm's classic snapshots under dmfuse exec: lvcreate
// -s builds the kernel's stack (-real, -cow, snapshot-origin, snapshot);
// the snapshot mounts with the data of its time while the origin changes;
// lvs reports its usage as the status line gives it; lvextend grows the
// COW (a reload that hands the exceptions over); lvconvert --merge rolls
// the origin back and leaves a plain volume.
func TestExecLVMSnapshot(t *testing.T) {
	e := newExecEnv(t, "/usr/sbin/lvm")
	l1 := e.loop("pv", 300<<20)
	e.lvmFilter(l1)
	vg := strings.ReplaceAll(e.name("vg"), "-", "_")
	mnt := filepath.Join(e.dir, "mnt")
	os.MkdirAll(mnt, 0o755)
	t.Cleanup(func() {
		e.exec(fmt.Sprintf("umount %s 2>/dev/null; vgremove -ff -y %s; pvremove -ff -y %s", mnt, vg, l1))
	})
	out := e.mustExec(fmt.Sprintf(`set -ex
pvcreate -y %[2]s
vgcreate %[1]s %[2]s
lvcreate -y -L 64M -n lv %[1]s
mkfs.ext4 -q /dev/%[1]s/lv
mount /dev/%[1]s/lv %[3]s && echo before > %[3]s/f && umount %[3]s
lvcreate -y -s -L 16M -n snap %[1]s/lv
dmsetup table | sort
mount /dev/%[1]s/lv %[3]s && echo after > %[3]s/f && dd if=/dev/urandom of=%[3]s/big bs=1M count=4 status=none && umount %[3]s
echo "lvs: $(lvs --noheadings -o lv_attr,data_percent %[1]s/snap)"
echo "status: $(dmsetup status %[1]s-snap)"
mount -o ro /dev/%[1]s/snap %[3]s && cat %[3]s/f && umount %[3]s
lvextend -y -L 24M %[1]s/snap
echo "extended: $(dmsetup status %[1]s-snap)"
lvconvert --merge -i 1 %[1]s/snap
lvs --noheadings -o lv_name,lv_attr %[1]s
dmsetup table %[1]s-lv
mount /dev/%[1]s/lv %[3]s && echo "merged: $(cat %[3]s/f) $(ls %[3]s | tr '\n' ' ')" && umount %[3]s`, vg, l1, mnt))
	for _, want := range []string{
		vg + "-lv: 0 131072 snapshot-origin 240:", vg + "-lv-real: 0 131072 linear 7:", vg + "-snap-cow: 0 32768 linear 7:",
		"\nbefore\n", "Merge of snapshot into logical volume " + vg + "/lv has finished.", "\n0 131072 linear 7:",
		"merged: before f lost+found \n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// lvs's Data%% is the status line's used/total.
	var attr string
	var pct, used, total, meta float64
	lvs := lineWith(out, "lvs: ")
	st := lineWith(out, "status: ")
	if _, err := fmt.Sscanf(strings.TrimPrefix(lvs, "lvs: "), "%s %f", &attr, &pct); err != nil || !strings.HasPrefix(attr, "s") {
		t.Fatalf("lvs line %q: %v", lvs, err)
	}
	if _, err := fmt.Sscanf(st[strings.Index(st, "snapshot ")+9:], "%f/%f %f", &used, &total, &meta); err != nil {
		t.Fatalf("status line %q: %v", st, err)
	}
	if want := used * 100 / total; fmt.Sprintf("%.2f", pct) != fmt.Sprintf("%.2f", want) {
		t.Errorf("lvs Data%% %.2f, status %s gives %.2f", pct, st, want)
	}
	if ext := lineWith(out, "extended: "); !strings.Contains(ext, fmt.Sprintf("/%d ", 24<<11)) {
		t.Errorf("after lvextend of the snapshot: %q", ext)
	}
}

// lineWith returns the first line of out that starts with prefix.
func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestExecCryptsetupKpartx: cryptsetup formats, dumps and adds keys on a
// dmfuse device; open fails as on a kernel without dm-crypt; kpartx maps a
// partitioned dmfuse device's partitions and unmaps them.
func TestExecCryptsetupKpartx(t *testing.T) {
	e := newExecEnv(t, "/usr/sbin/cryptsetup", "/sbin/kpartx", "sfdisk")
	img, cimg := filepath.Join(e.dir, "disk.img"), filepath.Join(e.dir, "crypt.img")
	sparseFile(t, img, 64<<20)
	sparseFile(t, cimg, 64<<20)
	cmd := exec.Command("sfdisk", "-q", img)
	cmd.Stdin = strings.NewReader("label: dos\n,20M,L\n,20M,L\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v: %s", err, out)
	}
	c, k := e.name("crypt"), e.name("disk")
	out := e.mustExec(fmt.Sprintf(`set -e
dmsetup create %[1]s --table "0 131072 linear %[4]s 0"
dmsetup create %[2]s --table "0 131072 linear %[3]s 0"
printf secret | cryptsetup luksFormat --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -q /dev/mapper/%[1]s -
cryptsetup isLuks /dev/mapper/%[1]s && echo is-luks
printf other > k2
printf secret | cryptsetup luksAddKey --pbkdf pbkdf2 --pbkdf-force-iterations 1000 /dev/mapper/%[1]s k2 --key-file -
cryptsetup luksDump /dev/mapper/%[1]s
if printf secret | cryptsetup open /dev/mapper/%[1]s %[1]s-open --key-file -; then echo opened; else echo "open failed: $?"; fi
dmsetup ls
kpartx -a -s /dev/mapper/%[2]s
dmsetup table | grep '^%[2]s'
kpartx -d /dev/mapper/%[2]s
kpartx -a /dev/mapper/%[2]s
ls /dev/mapper
kpartx -d -s /dev/mapper/%[2]s
dmsetup remove %[1]s
dmsetup remove %[2]s
dmsetup ls`, c, k, img, cimg))
	for _, want := range []string{"is-luks", "Version:       \t2", "0: luks2", "1: luks2", "open failed: ",
		k + "1: 0 40960 linear ", k + "2: 0 40960 linear ", "\n" + k + "1\n", "No devices found"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "opened") || strings.Contains(out, c+"-open\t") {
		t.Errorf("cryptsetup open succeeded without a crypt target:\n%s", out)
	}
}

// TestExecEdges: a command killed in the middle of an ioctl leaves what the
// kernel could have left and the next command sees it; a caller without
// CAP_SYS_ADMIN is refused as the kernel refuses it (EACCES) and changes
// nothing; a nested dmfuse exec runs; a private DM_DEV_DIR holds the
// nodes.
func TestExecEdges(t *testing.T) {
	e := newExecEnv(t, "/usr/sbin/dmsetup", "setpriv")
	w := e.name("w")
	e.mustExec(fmt.Sprintf(`dmsetup create %s --table "0 8 zero"`, w))
	// dmsetup wait blocks in DM_DEV_WAIT; the command is killed there.
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, dmfuseBin, "exec", "--", "dmsetup", "wait", w, "1")
	cmd.Env = e.env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	cancel()
	cmd.Wait()
	out := e.mustExec("dmsetup info -c --noheadings -o name,events " + w)
	if strings.TrimSpace(out) != w+":0" {
		t.Errorf("after a killed wait: %q", out)
	}
	// Without CAP_SYS_ADMIN.
	out, code := e.exec(fmt.Sprintf("setpriv --inh-caps=-all --bounding-set=-sys_admin dmsetup create %s --table '0 8 zero'", e.name("nocap")))
	if code == 0 || !strings.Contains(out, "Permission denied") {
		t.Errorf("without CAP_SYS_ADMIN: exit %d:\n%s", code, out)
	}
	if strings.Contains(e.must("ls"), e.name("nocap")) {
		t.Error("a caller without CAP_SYS_ADMIN created a device")
	}
	// Nested.
	out = e.mustExec(dmfuseBin + " exec -- dmsetup info -c --noheadings -o name " + w)
	if strings.TrimSpace(out) != w {
		t.Errorf("nested: %q", out)
	}
	// A private DM_DEV_DIR, as lvm2's test suite uses.
	dev := filepath.Join(e.dir, "dev")
	os.MkdirAll(dev, 0o755)
	p := e.name("p")
	out = e.mustExec(fmt.Sprintf(`set -e; export DM_DEV_DIR=%s
dmsetup create %s --table "0 8 zero"
stat -c '%%F %%t:%%T' $DM_DEV_DIR/mapper/control $DM_DEV_DIR/mapper/%s
dmsetup remove %s`, dev, p, p, p))
	if !strings.Contains(out, "character special file a:ec") || !strings.Contains(out, "block special file f0:") {
		t.Errorf("private DM_DEV_DIR:\n%s", out)
	}
	e.mustExec("dmsetup remove " + w)
}

// TestExecOpensUnderSignals: an open the daemon answers with a descriptor
// gets that descriptor even while the daemon's threads take signals (Go
// preempts them with SIGURG). Answering with SECCOMP_ADDFD_FLAG_SEND, a
// signal during the hand-over made the caller's open return 0 (its stdin),
// and libdevmapper's version ioctl then failed with ENOTTY.
func TestExecOpensUnderSignals(t *testing.T) {
	e := newExecEnv(t, "/usr/sbin/dmsetup", "blockdev")
	z := e.name("z")
	e.mustExec(fmt.Sprintf(`dmsetup create %s --table "0 2048 zero"`, z))
	pid := e.pid()
	if pid == 0 {
		t.Fatal("no daemon pid")
	}
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		sent := 0
		for {
			select {
			case <-stop:
				done <- sent
				return
			default:
			}
			ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			for _, ent := range ents {
				if tid, err := strconv.Atoi(ent.Name()); err == nil && unix.Tgkill(pid, tid, unix.SIGURG) == nil {
					sent++
				}
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	// Each dmsetup opens the control node once, each blockdev the device's
	// node; 40 rounds failed in nearly every run before.
	out, code := e.exec(fmt.Sprintf(`for i in $(seq 40); do
	dmsetup version >/dev/null || { echo "dmsetup version failed in round $i"; exit 1; }
	[ "$(blockdev --getsize64 /dev/mapper/%s)" = 1048576 ] || { echo "blockdev failed in round $i"; exit 1; }
done`, z))
	close(stop)
	if sent := <-done; sent == 0 {
		t.Fatal("no signal reached the daemon's threads")
	}
	if code != 0 {
		t.Errorf("exit %d:\n%s", code, out)
	}
	e.mustExec("dmsetup remove " + z)
}

// TestExecStopWhileNamespaceHeld: dmfuse stop ends the daemon even while a
// command's mount namespace outlives its processes (here a descriptor of
// it held from outside), which keeps the daemon's sysfs view mounted there.
func TestExecStopWhileNamespaceHeld(t *testing.T) {
	e := newExecEnv(t, "sleep")
	cmd := exec.Command(dmfuseBin, "exec", "--", "sleep", "60")
	cmd.Env = e.env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	// The command's sleep is the wrapper's child (the process that set up
	// the namespace and became the command).
	var ns *os.File
	for deadline := time.Now().Add(10 * time.Second); ns == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ents, _ := os.ReadDir("/proc")
		for _, ent := range ents {
			st, _ := os.ReadFile("/proc/" + ent.Name() + "/stat")
			// pid (comm) state ppid ...
			if f := strings.Fields(string(st)); len(f) > 3 && f[1] == "(sleep)" && f[3] == strconv.Itoa(cmd.Process.Pid) {
				ns, _ = os.Open("/proc/" + ent.Name() + "/ns/mnt")
			}
		}
	}
	if ns == nil {
		t.Fatal("the command did not start")
	}
	defer ns.Close()
	pid := e.pid()
	stop := exec.Command(dmfuseBin, "stop")
	stop.Env = e.env
	if out, err := stop.CombinedOutput(); err != nil {
		t.Fatalf("dmfuse stop: %v\n%s", err, out)
	}
	if alive(pid) {
		t.Errorf("the daemon (pid %d) still runs after dmfuse stop", pid)
	}
	if log, _ := os.ReadFile(filepath.Join(e.run, "daemon.log")); !strings.Contains(string(log), "still mounted in a mount namespace") {
		t.Errorf("the daemon's log does not say why it stopped waiting:\n%s", log)
	}
}
