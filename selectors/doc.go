// Package selectors implements device-mapper's multipath path selectors:
// round-robin, queue-length, service-time and historical-service-time (HST),
// with the kernel's arguments, algorithms, fixed-point arithmetic, comparison
// order and status strings (drivers/md/dm-ps-round-robin.c,
// dm-ps-queue-length.c, dm-ps-service-time.c and
// dm-ps-historical-service-time.c). The multipath target owns the priority
// groups and paths; a selector only sees opaque *Path values.
//
// # Use
//
//	typ, _ := selectors.Lookup("historical-service-time")
//	sel, err := typ.New(groupArgs, nil) // nil: the system clock; errors are *ArgError (EINVAL)
//	err = sel.AddPath(p, perPathArgs)
//	p := sel.SelectPath(nbytes)                           // nil: no usable path
//	if tr, ok := sel.(selectors.IOTracker); ok {
//		start := clock.Nanotime()                         // taken at map time
//		tr.StartIO(p, nbytes)
//		// ... the I/O ...
//		tr.EndIO(p, nbytes, start)
//	}
//
// Status(nil, t) is the group-level string and Status(p, t) the per-path
// string, each field followed by one space, exactly as dm-mpath splices them
// into `table` and `status` output; Type.TableArgs and Type.InfoArgs are the
// per-path field counts printed before the paths.
//
// All methods are safe for concurrent use. Like the kernel, each selector
// keeps its valid and failed paths on intrusive lists under one mutex (the
// kernel's spinlock); queue-length and service-time count in flight with
// atomics, HST keeps a mutex per path. Select, StartIO and EndIO allocate
// nothing; per-path state hangs off the Path, so there is no map lookup.
//
// # Kernel details kept on purpose
//
//   - Numbers are read as the kernel's sscanf("%u%c"): decimal only, no sign,
//     leading white space skipped, wrap-around on overflow ("4294967297" is 1).
//   - repeat_count > 1 is clamped to 1 (round-robin, queue-length,
//     service-time); HST accepts any value and prints "0".
//   - service-time compares with size_t arithmetic, shifts both sizes right
//     by 7 once either reaches SIZE_MAX>>7, and tests the sign of the
//     difference after truncation to a C int, as st_compare_load does; its
//     in-flight byte count is a 32-bit atomic like atomic_t.
//   - HST: 64 weight buckets of 2^24 ns, w[i] = base^(i+1) by square-and-
//     multiply with rounding (base 972: 972, 923, 876, 832, 790, ...,
//     w[10] = 578, w[62] = 39, w[63] = 0), u64 EMA with rounding, hst >> 10
//     when either outstanding count reaches 1024, comparisons with the C
//     signedness of hst_compare.
//   - Group args errors carry the kernel's ti->error text "path selector
//     constructor failed"; per-path arg errors "<name> ps: <reason>"
//     (ArgError.Kernel), and the message adds the arg and why.
//
// Deviations: failing a failed path, or reinstating a valid one, is a no-op
// (dm-mpath never does either; the kernel selectors would corrupt their
// lists and HST's valid_count). io-affinity is not implemented.
//
// # The clock, and why HST needs nanoseconds
//
// Time is an injected clock.Clock of monotonic nanoseconds. clock.System has the
// origin of the kernel's ktime_get_ns() (CLOCK_MONOTONIC); clock.Manual is for
// tests and simulations. dmfuse's multipath is bio-based, and bio-mode
// dm-mpath before 5.19 gave HST a start stamp of jiffies_to_nsecs(jiffies):
// one-jiffy resolution and, worse, another clock domain
// (jiffies_to_usecs returns an unsigned int, so the value wraps every 2^32 us
// and, on a machine up more than five minutes, lies at least 300 s behind
// ktime_get_ns()). HST then replaces every start by the path's last finish,
// so each sample is "time since this path last completed": busy fast paths
// measure their true service time, but an idle slow path's first sample
// includes its whole idle spell, its estimate grows, it is probed ever more
// rarely, and it starves.
//
// sim_test.go replays the dm-devel experiment of May 2022 in a deterministic
// discrete-event simulation on a manual clock (10 paths of unequal cost, a
// closed workload of depth 64) with each selector, HST with the nanosecond
// clock, with a 1 ms clock and with pre-5.19 jiffies stamps. It asserts that
// HST on nanoseconds stays within 0.03 of the throughput-proportional share
// on every path, and that the jiffies stamps starve every slow path (the
// dm-devel thread's "HST (orig)" result). A merely coarse clock is not the problem: the
// damage comes from the stamp living in another clock domain. The shares of
// every leg (TestSimulation, TestSimulationSweep) are in docs/benchmarks.md,
// "Multipath selectors".
package selectors
