// Package fault holds dmfuse's fault target: seeded rules that select I/O
// and act on it, and performance models of real disks and cloud volumes,
// over any device.
//
//	<dev> <offset> [<option>...] [rule <selector>... <action>]...
//
// The options (config.go) set the seed, the performance model (model.go,
// dist.go, presets.go), the throttle group and the fault atlas; each rule
// (rule.go) is selectors that must all hold and one action. For each I/O
// the engine (engine.go) looks at the rules in order, fires those that
// match up to the first that ends the I/O, logs each fault (log.go), waits
// what the stalls, delays and model give on the delay targets' scheduler
// (delay.Queue), then carries the I/O out as the actions changed it,
// keeping what stale reads, phantom writes, lying flushes and latent
// sectors need (stores.go).
//
// Everything drawn is a function of the seed, a stream key and a count
// (rng.go): a rule's draws of its own name and match number, the model's
// of the I/O's index. The same table, seed and I/O sequence therefore give
// the same faults whatever the timing, the transport or the number of
// CPUs, and an event log replays a run (replay=PATH).
//
// Messages change the rules and answer once the change is in force (so a
// test knows a fault is armed); the status counts each rule's matches and
// firings. Device (api.go) is the same engine over any stack.BlockDevice,
// for tests in process. The user's reference, with every word's syntax
// and the presets' sources, is docs/faults.md.
package fault
