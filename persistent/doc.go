// Package persistent is the root of dmfuse's persistent-data library: the
// layers the kernel keeps in drivers/md/persistent-data for the targets that
// keep btrees on a metadata device (thin-pool today; cache and era use the
// same layers in the kernel). A target that needs on-disk btrees imports
// these packages, never another target's.
//
// The layers, bottom up, each over the one below:
//
//   - block, the block manager (dm-block-manager.c): a metadata device is an
//     array of blocks (4 KiB for every format the kernel has) read through a
//     bounded cache, each block checked on read and sealed on write by its
//     kind's Validator (a crc32c of the rest of the block XORed with a salt,
//     and the block's own location), each with a reader/writer lock. Dirty
//     blocks are written when they leave the cache and at a flush.
//   - tm, the transaction manager (dm-transaction-manager.c): shadowing. A
//     block committed or shared (reference count above 1) is copied before it
//     changes, the copy taking a new block and the original losing a
//     reference; blocks made in this transaction change in place.
//   - btree (dm-btree.c, dm-btree-remove.c): lookups, insert with the
//     kernel's splits, remove with rebalancing, and delete, which drops a
//     shared subtree's reference without descending into it. The value type
//     of a tree says how copying a shared leaf counts references of what its
//     values point to (inc_children).
//   - sm, the space maps (dm-space-map-disk.c, dm-space-map-metadata.c): a
//     disk space map over the transaction manager for the data device, and
//     the metadata space map that counts the metadata device's own blocks.
//
// This package holds the errors the layers share: ErrCorrupt, which every
// error about damaged metadata wraps (Corruptf), ErrNoSpace and
// ErrNoMetadataSpace, and ErrReadOnly.
//
// Tests of the layers run over internal/memdev, the in-memory device all of
// dmfuse's tests share.
package persistent
