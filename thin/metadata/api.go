package metadata

import (
	"context"
	"errors"

	"github.com/dmfuse/dmfuse/persistent"
)

// Errors the Store returns. The thin target maps them to the kernel's
// errnos (ErrExists to EEXIST, ErrNoDevice to ENODATA, ErrNoSpace to
// ENOSPC, ErrReadOnly to EPERM...).
var (
	// ErrNotFound: no mapping for the virtual block.
	ErrNotFound = errors.New("no mapping")
	// ErrExists: a thin device with that id exists already.
	ErrExists = errors.New("device already exists")
	// ErrNoDevice: no thin device with that id.
	ErrNoDevice = errors.New("no such device")
	// ErrNoSpace: no free data (or metadata) block.
	ErrNoSpace = persistent.ErrNoSpace
	// ErrNoMetadataSpace: no free metadata block (the kernel's metadata
	// ENOSPC, which aborts the transaction); it wraps ErrNoSpace.
	ErrNoMetadataSpace = persistent.ErrNoMetadataSpace
	// ErrReadOnly: the store was opened or set read-only.
	ErrReadOnly = persistent.ErrReadOnly
	// ErrBusy: a thin device is open, or a metadata snapshot is
	// already held.
	ErrBusy = errors.New("device or metadata snapshot busy")
	// ErrCorrupt wraps every error that says the metadata on the device
	// is damaged (bad checksum, bad magic, a block out of range).
	ErrCorrupt = persistent.ErrCorrupt
)

// Device is the metadata device: fixed-size 4 KiB blocks read and written
// at byte offsets, and a flush that makes the writes before it durable.
// A stack.BlockDevice satisfies it.
type Device interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	// Size is the device's size in bytes.
	Size() int64
}

// Options open a Store.
type Options struct {
	// DataBlockSize is the pool's data block size in 512-byte sectors.
	DataBlockSize uint32
	// DataBlocks is the number of data blocks the data device holds.
	DataBlocks uint64
	// Format makes a new pool when the device's first 4 KiB are zero.
	// Without it such a device is refused.
	Format bool
	// ReadOnly opens without writing anything (the pool's read_only
	// feature, or a pool in read-only mode).
	ReadOnly bool
	// CacheBlocks bounds the metadata block cache (0: a default).
	CacheBlocks int
}

// Store is one pool's metadata. Open returns it.
type Store interface {
	// CreateThin adds an empty thin device (ErrExists if id is taken).
	CreateThin(id uint32) error
	// CreateSnap adds a thin device that shares every mapping of origin
	// (ErrExists, ErrNoDevice for a missing origin).
	CreateSnap(id, origin uint32) error
	// DeleteThin removes a thin device and drops its mappings' references
	// (ErrNoDevice; ErrBusy while it is open).
	DeleteThin(id uint32) error

	// TransactionID is the user's transaction id in the superblock.
	TransactionID() uint64
	// SetTransactionID sets it to new if it is old (an error otherwise).
	SetTransactionID(old, new uint64) error

	// ReserveMetadataSnap takes a metadata snapshot (ErrBusy if one is
	// held); ReleaseMetadataSnap drops it; MetadataSnap returns its block
	// (0 when none is held).
	ReserveMetadataSnap() error
	ReleaseMetadataSnap() error
	MetadataSnap() uint64

	// OpenThin opens a thin device for I/O (ErrNoDevice).
	OpenThin(id uint32) (Thin, error)

	// AllocDataBlock takes a free data block with one reference
	// (ErrNoSpace).
	AllocDataBlock() (uint64, error)
	// IncDataRange and DecDataRange change the references of data blocks
	// [begin, end).
	IncDataRange(begin, end uint64) error
	DecDataRange(begin, end uint64) error
	// BlockIsShared says whether a data block has more than one
	// reference.
	BlockIsShared(b uint64) (bool, error)

	// FreeDataBlocks, DataBlocks, FreeMetadataBlocks and MetadataBlocks
	// are the space maps' counts.
	FreeDataBlocks() (uint64, error)
	DataBlocks() (uint64, error)
	FreeMetadataBlocks() (uint64, error)
	MetadataBlocks() (uint64, error)
	// ResizeData and ResizeMetadata grow the space maps to n blocks
	// (shrinking is refused).
	ResizeData(n uint64) error
	ResizeMetadata(n uint64) error

	// Changed says whether anything changed since the last Commit.
	Changed() bool
	// Commit makes the transaction durable: every block it wrote, then
	// the superblock, each after a flush.
	Commit() error
	// Abort drops the transaction and reopens the last committed one.
	Abort() error

	// NeedsCheck and SetNeedsCheck read and set the superblock's
	// needs_check flag.
	NeedsCheck() bool
	SetNeedsCheck() error
	// SetReadOnly stops all writes (the pool's read-only mode);
	// SetReadWrite allows them again.
	SetReadOnly()
	SetReadWrite() error

	// Close commits nothing; call Commit first.
	Close() error
}

// Thin is one open thin device's mappings.
type Thin interface {
	// ID is the device's id.
	ID() uint32
	// Find returns the data block that virtual block v maps to and
	// whether it may be shared with another device (ErrNotFound).
	Find(v uint64) (data uint64, shared bool, err error)
	// FindMappedRange returns the first run of mapped blocks in
	// [begin, end) whose data blocks are consecutive: the run starts at
	// virtual block vbegin, data block dbegin, and has n blocks
	// (ErrNotFound when nothing in the range is mapped).
	FindMappedRange(begin, end uint64) (vbegin, dbegin, n uint64, shared bool, err error)
	// Insert maps v to data block d (the caller holds d's reference).
	Insert(v, d uint64) error
	// Remove unmaps v and drops its data block's reference
	// (ErrNotFound).
	Remove(v uint64) error
	// RemoveRange unmaps [begin, end) and drops the references.
	RemoveRange(begin, end uint64) error
	// HighestMapped is the highest mapped virtual block (ok false when
	// none is mapped); MappedCount the number of mapped blocks.
	HighestMapped() (v uint64, ok bool, err error)
	MappedCount() (uint64, error)
	// Changed says whether the device changed in this transaction.
	Changed() bool
	// Close releases the device.
	Close() error
}
