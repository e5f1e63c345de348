// Command exec measures what `dmfuse exec` costs the commands it wraps and
// what device-mapper's interface costs through it:
//
//		go run ./test/bench/exec [-rounds N] [-files N] [-ioctls N] [-calls N] [-lvs N] [-out FILE]
//
//	  - open-heavy: `find TREE -type f -exec cat {} +` over -files files of
//	    1 KiB (in 100 folders on a private tmpfs), which opens every file,
//	    plain and under `dmfuse exec`, in -rounds interleaved rounds (the one
//	    that goes first alternates): median times, the median (min-max) of the
//	    per-round ratio exec/plain, and the cost per open.
//	  - one DM ioctl: DM_DEV_STATUS of one device, -ioctls times in a loop,
//	    from this program under `dmfuse exec` (open of /dev/mapper/control,
//	    then the ioctls), against the drop-in's round trip (the control
//	    socket's info request, from this program): time per call.
//	  - one command: `dmsetup info NAME`, -calls times in a shell loop, Debian's
//	    dmsetup under one `dmfuse exec` against dmfuse's drop-in linked as
//	    dmsetup: time per command, process start included.
//	  - lvm: under one `dmfuse exec`, a volume group over two loop devices
//	    (files on the tmpfs), then -lvs times `lvcreate -L 16M` (linear) and
//	    `lvcreate -V 16M -T` (thin, in a pool made once), each timed alone,
//	    and lvremove: median and range.
//
// It needs root, /dev/fuse, loop devices, Debian's dmsetup and lvm2 (it
// installs nothing). It builds dmfuse and uses a private system instance
// (DMFUSE_RUN_DIR); everything it set up is torn down on exit, on error
// and on SIGINT or SIGTERM.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/control/dmioctl"
	"github.com/dmfuse/dmfuse/test/bench/benchkit"
)

// ioctlLoopArg makes this program the ioctl loop that runs under dmfuse
// exec: ioctlLoopArg NAME N prints the nanoseconds per DM_DEV_STATUS.
const ioctlLoopArg = "__ioctl-loop"

func main() {
	if len(os.Args) == 4 && os.Args[1] == ioctlLoopArg {
		n, _ := strconv.Atoi(os.Args[3])
		ns, err := ioctlLoop(os.Args[2], n)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(ns)
		return
	}
	rounds := flag.Int("rounds", 5, "interleaved rounds of the open-heavy run")
	files := flag.Int("files", 20000, "files of the open-heavy run")
	ioctls := flag.Int("ioctls", 20000, "DM ioctls (and drop-in requests) timed")
	calls := flag.Int("calls", 200, "dmsetup info commands timed, each way")
	lvs := flag.Int("lvs", 10, "lvcreate runs of each kind")
	out := flag.String("out", "", "also write the tables to this file")
	flag.Parse()
	benchkit.Main("exec", *out, func(w io.Writer) error {
		return run(w, *rounds, *files, *ioctls, *calls, *lvs)
	})
}

// ioctlLoop opens the control node and times n DM_DEV_STATUS of name.
func ioctlLoop(name string, n int) (float64, error) {
	fd, err := unix.Open("/dev/mapper/control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 16384)
	le := binary.LittleEndian
	req := dmioctl.Ioctl(dmioctl.CmdDevStatus)
	start := time.Now()
	for i := 0; i < n; i++ {
		clear(buf[:dmioctl.HeaderSize])
		le.PutUint32(buf[0:], dmioctl.VersionMajor)
		le.PutUint32(buf[4:], 0)
		le.PutUint32(buf[12:], uint32(len(buf)))           // data_size
		le.PutUint32(buf[16:], uint32(dmioctl.HeaderSize)) // data_start
		copy(buf[48:], name)                               // name
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
			return 0, fmt.Errorf("DM_DEV_STATUS %s: %w", name, e)
		}
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n), nil
}

type bench struct {
	bin, run, work string
	env            []string
}

func (b *bench) sh(ctx context.Context, script string, underExec bool) (string, error) {
	argv := []string{"bash", "-c", script}
	if underExec {
		argv = append([]string{b.bin, "exec", "--"}, argv...)
	}
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env, c.Dir = b.env, b.work
	out, err := c.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %v\n%s", script, err, out)
	}
	return string(out), nil
}

func timed(f func() error) (time.Duration, error) {
	t0 := time.Now()
	err := f()
	return time.Since(t0), err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func run(w io.Writer, rounds, files, ioctls, calls, lvs int) error {
	ctx, cancel := benchkit.SignalContext("exec")
	defer cancel()
	var u benchkit.Undo
	defer u.Run()
	work, dmfuse, err := benchkit.BuildScratch(ctx, &u, "dmfuse-exec-bench")
	if err != nil {
		return err
	}
	b := &bench{bin: dmfuse, run: filepath.Join(work, "run"), work: work}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bin := filepath.Join(work, "bin")
	os.Mkdir(bin, 0o755)
	if err := os.Symlink(b.bin, filepath.Join(bin, "dmsetup")); err != nil {
		return err
	}
	b.env = append(os.Environ(), "DMFUSE_RUN_DIR="+b.run, "LC_ALL=C")
	tmpfs := filepath.Join(work, "tmpfs")
	if err := benchkit.MountTmpfs(&u, tmpfs, 1200<<20); err != nil {
		return err
	}
	u.Push(func() {
		stop := exec.Command(b.bin, "stop", "--force")
		stop.Env = b.env
		stop.Run()
	})
	fmt.Fprintf(w, "exec bench: kernel %s, %d CPUs, %s\n\n", benchkit.Kernel(), runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"))

	// Open-heavy.
	tree := filepath.Join(tmpfs, "tree")
	for i := 0; i < files; i++ {
		d := filepath.Join(tree, fmt.Sprintf("d%03d", i%100))
		if i < 100 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), make([]byte, 1024), 0o644); err != nil {
			return err
		}
	}
	script := "find " + tree + " -type f -exec cat {} + >/dev/null"
	if _, err := b.sh(ctx, "true", true); err != nil { // starts the daemon
		return err
	}
	var plain, wrapped, ratios []float64
	for r := 0; r < rounds; r++ {
		var p, x time.Duration
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, under := range order {
			d, err := timed(func() error { _, err := b.sh(ctx, script, under); return err })
			if err != nil {
				return err
			}
			if under {
				x = d
			} else {
				p = d
			}
		}
		plain, wrapped = append(plain, ms(p)), append(wrapped, ms(x))
		ratios = append(ratios, ms(x)/ms(p))
		fmt.Fprintf(os.Stderr, "round %d: plain %.0f ms, exec %.0f ms\n", r+1, ms(p), ms(x))
	}
	fmt.Fprintf(w, "open-heavy: %s (%d files), %d rounds\n", "find TREE -type f -exec cat {} +", files, rounds)
	fmt.Fprintf(w, "| run | median | exec/plain per round |\n|---|---|---|\n")
	fmt.Fprintf(w, "| plain | %.0f ms | |\n", benchkit.Median(plain))
	fmt.Fprintf(w, "| dmfuse exec | %.0f ms | %.2fx (%.2f-%.2f) |\n", benchkit.Median(wrapped), benchkit.Median(ratios), slices.Min(ratios), slices.Max(ratios))
	fmt.Fprintf(w, "cost per open: %.1f us\n\n", (benchkit.Median(wrapped)-benchkit.Median(plain))*1000/float64(files))

	// One ioctl, one drop-in request.
	if _, err := b.sh(ctx, `dmsetup create benchdev --table "0 8 zero"`, true); err != nil {
		return err
	}
	out, err := b.sh(ctx, fmt.Sprintf("%s %s benchdev %d", self, ioctlLoopArg, ioctls), true)
	if err != nil {
		return err
	}
	ioctlNs, err := strconv.ParseFloat(strings.TrimSpace(lastLine(out)), 64)
	if err != nil {
		return fmt.Errorf("ioctl loop: %q", out)
	}
	sock := filepath.Join(b.run, "control.sock")
	d, err := timed(func() error {
		for i := 0; i < ioctls; i++ {
			resp, err := control.Call(sock, &control.Request{Op: control.OpInfo, Name: "benchdev"})
			if err != nil {
				return err
			}
			if resp.Error != "" {
				return fmt.Errorf("info: %s", resp.Error)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	callNs := float64(d.Nanoseconds()) / float64(ioctls)
	loop := fmt.Sprintf("for i in $(seq %d); do dmsetup info benchdev >/dev/null || exit 1; done", calls)
	real, err := timed(func() error { _, err := b.sh(ctx, loop, true); return err })
	if err != nil {
		return err
	}
	drop, err := timed(func() error {
		_, err := b.sh(ctx, "PATH="+bin+":$PATH; "+loop, false)
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "one device-mapper call (info of one device)\n| way | time per call |\n|---|---|\n")
	fmt.Fprintf(w, "| DM_DEV_STATUS ioctl under dmfuse exec | %.1f us |\n", ioctlNs/1000)
	fmt.Fprintf(w, "| drop-in's control socket request | %.1f us |\n", callNs/1000)
	fmt.Fprintf(w, "| `dmsetup info` command, Debian's under dmfuse exec | %.2f ms |\n", ms(real)/float64(calls))
	fmt.Fprintf(w, "| `dmsetup info` command, dmfuse's drop-in | %.2f ms |\n\n", ms(drop)/float64(calls))
	if _, err := b.sh(ctx, "dmsetup remove benchdev", true); err != nil {
		return err
	}

	// lvm.
	var loops []string
	for i := 0; i < 2; i++ {
		img := filepath.Join(tmpfs, fmt.Sprintf("pv%d.img", i))
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			return err
		}
		if err := os.Truncate(img, 512<<20); err != nil {
			return err
		}
		l, err := benchkit.AttachLoop(ctx, &u, img)
		if err != nil {
			return err
		}
		loops = append(loops, l)
	}
	conf := filepath.Join(work, "lvm")
	os.MkdirAll(conf, 0o755)
	if err := os.WriteFile(filepath.Join(conf, "lvm.conf"), []byte(fmt.Sprintf(`devices {
	global_filter = [ "a|^%s$|", "a|^%s$|", "r|.*|" ]
	use_devicesfile = 0
}
backup {
	backup = 0
	archive = 0
}
activation {
	monitoring = 0
}
`, loops[0], loops[1])), 0o644); err != nil {
		return err
	}
	b.env = append(b.env, "LVM_SYSTEM_DIR="+conf)
	u.Push(func() {
		b.sh(context.Background(), "vgremove -ff -y benchvg >/dev/null 2>&1; pvremove -ff -y "+strings.Join(loops, " ")+" >/dev/null 2>&1", true)
	})
	lvScript := fmt.Sprintf(`set -e
pvcreate -q -y %[1]s %[2]s >/dev/null
vgcreate -q benchvg %[1]s %[2]s >/dev/null
lvcreate -q -y --type thin-pool -L 256M -n pool benchvg >/dev/null
t() { local a=$(date +%%s%%N); "$@" >/dev/null; local b=$(date +%%s%%N); echo "$1 $(( (b - a) / 1000 ))"; }
for i in $(seq %[3]d); do
	t lvcreate -q -y -L 16M -n lin$i benchvg
	t lvcreate -q -y -V 16M -T benchvg/pool -n thin$i
done
for i in $(seq %[3]d); do
	t lvremove -q -y benchvg/lin$i
	t lvremove -q -y benchvg/thin$i
done
vgremove -q -ff -y benchvg >/dev/null
pvremove -q -ff -y %[1]s %[2]s >/dev/null`, loops[0], loops[1], lvs)
	out, err = b.sh(ctx, lvScript, true)
	if err != nil {
		return err
	}
	times := map[string][]float64{}
	var n int
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		us, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		// lvcreate lines come in pairs (linear, thin), then lvremove's.
		kind := f[0]
		if n%2 == 0 {
			kind += " linear"
		} else {
			kind += " thin"
		}
		n++
		times[kind] = append(times[kind], us/1000)
	}
	fmt.Fprintf(w, "lvm under dmfuse exec, %d of each (loop devices over tmpfs files)\n| command | median | min | max |\n|---|---|---|---|\n", lvs)
	for _, k := range []string{"lvcreate linear", "lvcreate thin", "lvremove linear", "lvremove thin"} {
		v := times[k]
		if len(v) == 0 {
			return fmt.Errorf("no %s times in\n%s", k, out)
		}
		fmt.Fprintf(w, "| %s | %.0f ms | %.0f ms | %.0f ms |\n", k, benchkit.Median(v), slices.Min(v), slices.Max(v))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
