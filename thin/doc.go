// Package thin is dmfuse's thin provisioning: the thin-pool and thin
// targets of drivers/md/dm-thin.c (v1.24.0), over the pool metadata of
// package thin/metadata.
//
// # Tables
//
//	thin-pool <metadata dev> <data dev> <data block size> <low water mark> [<#features> <feature>...]
//	thin <pool dev> <dev id> [<external origin dev>]
//
// Features: skip_block_zeroing, ignore_discard, no_discard_passdown,
// read_only, error_if_no_space. Table lines print the requested features
// and end with a space; so does the pool's status line:
//
//	<transaction id> <used meta>/<total meta> <used data>/<total data> <held root|-> rw|ro|out_of_data_space ignore_discard|discard_passdown|no_discard_passdown error_if_no_space|queue_if_no_space needs_check|- <metadata low water>
//
// (Fail for a failed pool). A thin device's status is `<mapped sectors>
// <highest mapped sector>`, `-` for the highest when nothing is mapped.
// Messages to the pool: create_thin, create_snap, delete,
// set_transaction_id, reserve_metadata_snap, release_metadata_snap, with
// the kernel's argument counts and errnos.
//
// # Pool objects
//
// As in the kernel, one pool object per metadata device (kept in the
// Manager's shared set) lives as long as a pool table or a thin target
// refers to it: a reload of the pool reuses it
// (keeping its block size), and thin targets find it through the pool's
// mapped device. The pool's data size is its table's length in whole
// blocks, applied at resume (a smaller one fails the resume); the metadata
// device's size likewise.
//
// # I/O
//
// A write to an unmapped block allocates a data block, zeroes the rest of
// it (unless skip_block_zeroing or the write covers the block), copies it
// from the external origin, or copies the shared block it replaces after a
// snapshot, then maps it. Reads of unmapped blocks give zeros or the
// origin's data. Discards unmap whole blocks and pass the freed blocks down
// to the data device (unless no_discard_passdown or ignore_discard).
// Commits flush the data device first, then the metadata; they happen on a
// FLUSH or FUA to a device that changed, every second when something
// changed, after every message and on suspend. Out of data space, I/O that
// needs a block waits for no_space_timeout (60 s; SetNoSpaceTimeout sets
// it for the pools of one Manager, as the kernel's module parameter is set
// for one kernel) and then fails with ENOSPC, or fails at once with
// error_if_no_space. The pool's status commits first unless asked for with
// noflush (stack.StatusInfoNoFlush, `dmsetup status --noflush`). The
// low water mark raises a table event on the pool device once per resume.
// A metadata failure aborts the transaction, sets needs_check and makes
// the pool read-only.
package thin
