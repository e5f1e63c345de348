// Package snapshot holds device-mapper's snapshot targets: snapshot,
// snapshot-origin and snapshot-merge (drivers/md/dm-snap.c), with the
// persistent exception store on the kernel's on-disk format
// (dm-snap-persistent.c) and the transient one (dm-snap-transient.c).
//
//	<origin>                                          snapshot-origin
//	<origin> <COW> <P|PO|N> <chunk> [<#f> <f>...]     snapshot
//	<origin> <COW> <P|PO> <chunk> [<#f> <f>...]       snapshot-merge
//
// A snapshot reads its origin as it was when the snapshot was first
// resumed: every write through a snapshot-origin (or a snapshot-merge) of
// the same origin device first copies the chunks it changes into each
// valid, active snapshot that has not copied them, and a write to the
// snapshot goes to its COW device, after a copy of the rest of the chunk
// unless it covers it. The snapshots of one origin are found by the device
// their origin argument names (stack.DeviceKey: however it is named), in a
// registry per Manager, largest chunk first, as the kernel's _origins.
//
// # The persistent store
//
// Chunk 0 of the COW device is the header (magic "SnAp", valid, version 1,
// chunk size), chunk 1 + i*(E+1) is metadata area i, E = chunk bytes / 16
// entries of (old chunk, new chunk) little-endian, and the E chunks after
// an area hold the data its entries point at. A table loaded over a COW
// whose magic is 0 formats it then (header, area 0 zeroed), even if it is
// never resumed. Exceptions are committed in the order their chunks were
// allocated: an area is written, after a flush and with FUA, when no
// allocated exception is outstanding or when it is full (the next area
// zeroed first), and only then do the writes that waited for the exception
// go on. A crash loses only exceptions whose writes had not completed, and
// a COW written by dmfuse is what the kernel would have written; ReadStore
// reads one as the kernel reads it. On-disk chunk sizes win over the
// table's.
//
// # States
//
// A full COW invalidates a P or N snapshot at the write that needs a chunk
// (status Invalid, the header rewritten with valid 0, a table event; reads
// and writes fail with EIO, an empty flush passes, origin writes no longer
// copy into it); a PO snapshot shows Overflow instead (its writes fail, its
// reads work) until an origin write needs a chunk, which invalidates it. A
// copy or store error invalidates. Status lines are the kernel's:
// Invalid, Merge failed, Overflow, or <allocated>/<COW sectors> <metadata
// sectors>, where a persistent store counts every chunk below the next
// free one, header and areas included.
//
// # Reloads and handover
//
// A snapshot table loaded over the COW device of a live snapshot becomes a
// handover destination: it reads nothing (its table shows chunk size 0)
// and, when resumed, takes the live snapshot's exceptions and store (the
// store's type and chunk size; only the O is its own) while the origin's
// writes are held, and the live one becomes invalid. Its resume fails with
// "Unable to perform snapshot handover until source is suspended." while
// the live one's device runs; a third table on the COW is refused ("Snapshot
// cow pairing for exception table handover failed"); a source destroyed
// first leaves the destination invalid ("Cancelling snapshot handover.").
// So `dmsetup reload` and resume of a snapshot keep its exceptions, a
// transient store's too.
//
// # Merging
//
// snapshot-merge, loaded into the origin's device over a live snapshot of
// the same COW (what lvconvert --merge does), takes its store over at
// resume and copies the COW's chunks back into the origin in the
// background: the last run of consecutive exceptions first, the other
// snapshots of the origin copying the range out before it changes, writes to
// the chunks of the step held until it is done, the origin flushed, then
// the entries zeroed on the COW (flush and FUA). The status counts down
// until allocated equals metadata. A suspend stops the merge after its step;
// a resume, or a fresh load after a restart, goes on from what the COW
// still lists. A copy, flush or store error stops it with Merge failed.
// Reads see the merged view at once: chunks still listed read from the COW.
//
// # Where dmfuse differs
//
// The kernel cuts origin writes at the smallest chunk of the snapshots
// registered when the origin was last resumed; dmfuse takes it at each
// write, so a snapshot added without resuming the origin cannot lose data.
// A handover holds the origin's writes with a lock instead of an internal
// suspend of the origin's device. The exception table lives in memory, as
// the kernel's does, about 48 bytes per exception, reported to the daemon's
// memory plan (Ctor.Memory) so that it is counted beside the request
// buffers. The devices' logical block size is taken to be 512 bytes.
package snapshot
