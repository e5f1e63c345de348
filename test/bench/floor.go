package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The floor suite measures what this machine charges for the parts of a
// FUSE round trip that no daemon can leave out, and from them the most QD1
// IOPS any FUSE daemon in a process of its own could serve, next to the
// loop device and each daemon's zero device.
//
// At QD1 a psync application sleeps in the kernel until the daemon's reply
// completes its request. Whatever the transport, the daemon is another
// process, so each I/O takes either two switches between processes on the
// application's CPU (the daemon runs there), or a wake-up of the
// application's idle CPU from the other one (the daemon runs elsewhere).
// On top of that come three system calls: the application's, the
// daemon's read of the backing file, and the daemon's call that hands the
// reply back and waits for the next request. The loop device pays neither:
// its worker is a kernel thread.
//
//	floor on one CPU     = switches(one CPU) + 2 x syscall + backing read
//	floor across CPUs    = switches(two CPUs) / 2 + 2 x syscall + backing read
//
// where switches(...) is a pipe round trip between two processes less its
// four pipe calls (timed in one thread, where they switch nothing), syscall
// is getppid(2) and backing read a 4 KiB pread(2) of the tmpfs file. The
// bound leaves out all of FUSE's and io_uring's own work (the request, the
// task work that posts it, the copies), so a real daemon is slower.

// A measurement times floorBatches batches of floorBatch round trips (or
// calls) and keeps the fastest batch: the machine's cost without the
// interruptions of other work, so that the floor is a lower bound.
const (
	floorBatches = 50
	floorBatch   = 1000
	floorIters   = floorBatches * floorBatch
)

// fastest runs f floorBatches times and returns the fastest run's time
// per call of a batch, in microseconds.
func fastest(f func()) float64 {
	best := time.Duration(1<<63 - 1)
	for range floorBatches {
		start := time.Now()
		f()
		best = min(best, time.Since(start))
	}
	return float64(best.Nanoseconds()) / 1e3 / floorBatch
}

// peerEnv names the environment variable that makes the bench binary the
// far end of a pipe round trip: its value is the CPU to run on.
const peerEnv = "DMFUSE_BENCH_PEER_CPU"

// floorCosts is one round's measurements, in microseconds.
type floorCosts struct {
	syscall, pipeOps, pread float64 // getppid; a pipe write and read in one thread; 4 KiB pread of tmpfs
	thread1, proc1, proc2   float64 // pipe round trips: threads of one process on one CPU; processes on one CPU; on two CPUs
}

// switches returns the switching cost of a round trip rt, without its four
// pipe calls.
func (f floorCosts) switches(rt float64) float64 { return rt - 2*f.pipeOps }

// oneCPU and twoCPU are the floors per I/O (see the suite's comment).
func (f floorCosts) oneCPU() float64 { return f.switches(f.proc1) + 2*f.syscall + f.pread }
func (f floorCosts) twoCPU() float64 { return f.switches(f.proc2)/2 + 2*f.syscall + f.pread }

// floorPeer runs the far end of a pipe round trip if this process was
// started as one (peerEnv), and then exits.
func floorPeer() {
	v := os.Getenv(peerEnv)
	if v == "" {
		return
	}
	cpu, err := strconv.Atoi(v)
	if err != nil {
		os.Exit(2)
	}
	runtime.LockOSThread()
	pinTo(cpu)
	echo(3, 4, floorIters)
	os.Exit(0)
}

// echo reads a byte from in and writes it to out, n times.
func echo(in, out, n int) {
	var b [1]byte
	for range n {
		if _, err := unix.Read(in, b[:]); err != nil {
			return
		}
		unix.Write(out, b[:])
	}
}

func pinTo(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	unix.SchedSetaffinity(0, &set)
}

// pinned locks the calling goroutine to its thread and binds the thread to
// cpu; the returned func puts both back.
func pinned(cpu int) (undo func()) {
	runtime.LockOSThread()
	var old unix.CPUSet
	unix.SchedGetaffinity(0, &old)
	pinTo(cpu)
	return func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// pingPong times round trips through a pair of pipes between the calling
// thread on CPU a and a peer on CPU b, a thread of this process or a process
// of its own: microseconds per round trip in the fastest batch.
func pingPong(a, b int, process bool) (float64, error) {
	in, toPeer, err := pipe()
	if err != nil {
		return 0, err
	}
	defer in.Close()
	defer toPeer.Close()
	fromPeer, out, err := pipe()
	if err != nil {
		return 0, err
	}
	defer fromPeer.Close()
	defer out.Close()
	var wait func() error
	if process {
		self, err := os.Executable()
		if err != nil {
			return 0, err
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), peerEnv+"="+strconv.Itoa(b))
		cmd.ExtraFiles = []*os.File{in, out} // its descriptors 3 and 4
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		// The peer's ends are its own now: if it ends early, reads
		// here see the end of the file instead of blocking.
		in.Close()
		out.Close()
		wait = cmd.Wait
	} else {
		done := make(chan struct{})
		go func() {
			// Locked to the end: the thread, bound to b, exits with
			// the goroutine.
			defer close(done)
			runtime.LockOSThread()
			pinTo(b)
			echo(int(in.Fd()), int(out.Fd()), floorIters)
		}()
		wait = func() error { <-done; return nil }
	}
	defer pinned(a)()
	var buf [1]byte
	w, r := int(toPeer.Fd()), int(fromPeer.Fd())
	us := fastest(func() {
		for range floorBatch {
			unix.Write(w, buf[:])
			if n, e := unix.Read(r, buf[:]); n != 1 && err == nil {
				err = fmt.Errorf("round trip: read %d bytes: %v", n, e)
			}
		}
	})
	if werr := wait(); err == nil {
		err = werr
	}
	return us, err
}

// pipe returns a pipe whose ends block: os.NewFile leaves a blocking
// descriptor so, and Fd returns it as it is.
func pipe() (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(p[0]), "pipe"), os.NewFile(uintptr(p[1]), "pipe"), nil
}

// callCosts times getppid(2), a pipe write and read in one thread, and a
// 4 KiB pread(2) of file at offsets spread over size bytes, on CPU 0.
func callCosts(file string, size int64) (sys, pipeOps, pread float64, err error) {
	defer pinned(0)()
	per := func(f func(i int)) float64 {
		return fastest(func() {
			for i := range floorBatch {
				f(i)
			}
		})
	}
	sys = per(func(int) { unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0) })
	pr, pw, err := pipe()
	if err != nil {
		return
	}
	var b [1]byte
	r, w := int(pr.Fd()), int(pw.Fd())
	pipeOps = per(func(int) { unix.Write(w, b[:]); unix.Read(r, b[:]) })
	pr.Close()
	pw.Close()
	fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	blocks, n := size/4096, int64(0)
	pread = per(func(int) { n++; unix.Pread(fd, buf, (n*7919%blocks)*4096) })
	return
}

// floor measures the machine's costs and QD1 on the loop device and on each
// daemon's zero device, in interleaved rounds.
func (b *ubench) floor(ctx context.Context) error {
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("floor: needs 2 CPUs, have %d", runtime.NumCPU())
	}
	var costs []floorCosts
	ts := []target{{name: "loop", dev: b.loop}}
	for _, c := range b.configs {
		ts = append(ts, target{c.name, c, c.dev("zero")})
	}
	qd1 := []job{jobNamed("randread"), jobNamed("randwrite")}
	res := map[string]map[string][]urun{}
	for _, j := range qd1 {
		res[j.name] = map[string][]urun{}
	}
	logf("floor: %d rounds of round trips and %d fio runs", b.rounds, b.rounds*len(qd1)*len(ts))
	for r := range b.rounds {
		var f floorCosts
		var err error
		if f.syscall, f.pipeOps, f.pread, err = callCosts(b.lin, b.size); err == nil {
			if f.thread1, err = pingPong(0, 0, false); err == nil {
				if f.proc1, err = pingPong(0, 0, true); err == nil {
					f.proc2, err = pingPong(0, 1, true)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		costs = append(costs, f)
		for _, j := range qd1 {
			for _, t := range rotate(ts, r) {
				run, err := b.fio(ctx, j, t.c, t.dev, b.runtime)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", j.name, t.name, err)
				}
				res[j.name][t.name] = append(res[j.name][t.name], run)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}

	med := func(g func(floorCosts) float64) float64 { return medOf(costs, g) }
	w := &b.w
	fmt.Fprintf(w, "### The floor of a QD1 round trip on this machine\n\nWhat any FUSE daemon in a process of its own pays per QD1 I/O at least, whatever its transport (see test/bench/floor.go): two switches between processes on the application's CPU, or a wake-up of it from the other CPU, plus three system calls (the application's, the backing read, the reply), leaving out FUSE's and io_uring's own work. Each figure is the fastest of %d batches of %d round trips or calls (pinned with sched_setaffinity), in us; medians of %d rounds.\n\n", floorBatches, floorBatch, b.rounds)
	table(w, []string{"getppid", "pipe write + read, one thread", "4 KiB pread of the tmpfs file", "round trip: threads, one CPU", "round trip: processes, one CPU", "round trip: processes, two CPUs", "floor on one CPU", "floor across CPUs"})
	floor := med(func(f floorCosts) float64 { return min(f.oneCPU(), f.twoCPU()) })
	fmt.Fprintf(w, "| %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n\n",
		med(func(f floorCosts) float64 { return f.syscall }), med(func(f floorCosts) float64 { return f.pipeOps }),
		med(func(f floorCosts) float64 { return f.pread }), med(func(f floorCosts) float64 { return f.thread1 }),
		med(func(f floorCosts) float64 { return f.proc1 }), med(func(f floorCosts) float64 { return f.proc2 }),
		med(func(f floorCosts) float64 { return f.oneCPU() }), med(func(f floorCosts) float64 { return f.twoCPU() }))
	fmt.Fprintf(w, "The lower floor allows at most %s IOPS at QD1. Against the loop device and each daemon's zero device (no backing I/O), 4k psync QD1, medians of %d interleaved rounds; the ceiling / loop column is the most any FUSE daemon could reach against the loop device in that round (1 / floor / loop IOPS):\n\n",
		kilo(1e6/floor), b.rounds)
	head := []string{"job", "loop"}
	for _, c := range b.configs {
		head = append(head, c.name+" zero", c.name+" zero / loop")
	}
	table(w, append(head, "ceiling / loop"))
	for _, j := range qd1 {
		row := fmt.Sprintf("| %s | %s |", j.title, kilo(medOf(res[j.name]["loop"], j.value)))
		for _, c := range b.configs {
			ratios := perRound(res[j.name][c.name], res[j.name]["loop"], j.value)
			row += fmt.Sprintf(" %s | %s |", kilo(medOf(res[j.name][c.name], j.value)), ratioCell(ratios))
		}
		var ceil []float64
		for i, x := range res[j.name]["loop"] {
			ceil = append(ceil, 1e6/min(costs[i].oneCPU(), costs[i].twoCPU())/x.iops)
		}
		fmt.Fprintf(w, "%s %s |\n", row, ratioCell(ceil))
	}
	fmt.Fprintln(w)
	return nil
}
