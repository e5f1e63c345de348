// Package metadata keeps a thin pool's metadata on the kernel's on-disk
// format (drivers/md/dm-thin-metadata.c over drivers/md/persistent-data):
// a superblock, a metadata and a data space map, the two-level mapping
// btree (device id, then virtual block) and the device-details btree.
// A metadata device it writes passes thin_check and reads with thin_dump;
// one written by thin_restore opens here.
//
// The API follows dm-thin-metadata.h. One Store serves one pool; its
// methods are safe for concurrent use (a pool-wide reader/writer lock, as
// the kernel's pmd->root_lock). Changes are made in a transaction that
// Commit makes durable (the superblock written last) and Abort drops.
// Open returns the implementation, a *DiskStore.
//
// # The format
//
// The device is an array of 4 KiB blocks. Each block starts with a
// crc32c checksum of the rest of the block, XORed with a salt per kind of
// block (superblock 160774, btree node 121107, space-map bitmap 240779,
// metadata space-map index 160478), and its own location at offset 8.
//
// Block 0 is the superblock (struct thin_disk_superblock): magic
// 27022010, version 2, the needs_check flag, the pool time (raised by
// each snapshot), the user's transaction id, the held root of a metadata
// snapshot, the roots of both space maps, of the mapping tree and of the
// details tree, the data block size and the metadata size.
//
// Btree nodes have a 32-byte header (flags, location, entry count,
// capacity, value size), then the keys, then the values. Leaves of the
// top mapping level map a device id to the root of that device's tree;
// its leaves map a virtual block to data block << 24 | the pool time of
// the mapping. Details leaves hold mapped_blocks, transaction_id,
// creation_time and snapshotted_time. Every non-root node is at least a
// third full.
//
// The space maps hold a 2-bit reference count per block in bitmap blocks
// (3 meaning "see the overflow btree", which holds the full count). The
// data space map indexes its bitmaps with a btree; the metadata space map
// with one index block of at most 255 entries, which bounds the metadata
// device at 255 * 16320 blocks.
//
// # The layers
//
// The lower four are dmfuse's persistent-data library (package persistent
// and below), which any target with on-disk btrees may import.
//
//   - persistent/block, the block manager: blocks read through a bounded
//     LRU cache (Options.CacheBlocks), checked by the kind's validator on
//     read and sealed on write, each with a reader/writer lock. Dirty
//     blocks are written when they leave the cache and at a flush.
//   - persistent/tm, the transaction manager: a block committed or shared
//     (count > 1) is copied before it changes, the copy taking a new
//     block and the original losing a reference; blocks made in this
//     transaction change in place.
//   - persistent/btree: lookups, insert with the kernel's splits, remove
//     with rebalancing, and delete, which drops a shared subtree's
//     reference without descending into it. Copying a shared node adds a
//     reference to each of its children (or, in a leaf, through the
//     tree's value type: data blocks for the mapping leaves, device trees
//     for the top level), as the kernel's inc_children does.
//   - persistent/sm: the data space map, on metadata blocks through the
//     transaction manager; and the metadata space map, which counts the
//     blocks that the transaction manager allocates, its own included. It
//     keeps the counts in memory (one byte a block) and at commit moves
//     each changed bitmap and the index block to new blocks and updates
//     its overflow tree, repeating until that allocates nothing more,
//     then writes them. Both maps hand out only blocks free in the
//     current and in the last committed transaction.
//   - this package: the superblock, the devices and their details, the
//     two-level mapping tree, snapshots (a reference more on the origin's
//     tree, as dm_pool_create_snap), metadata snapshots (a copy of the
//     superblock that holds references to both trees, which thin_dump -m
//     reads) and the commit: details, data space map, metadata space map,
//     every dirty block and a flush, then the superblock and a flush.
package metadata
