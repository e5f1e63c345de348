package metadata

import (
	"encoding/binary"

	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/sm"
)

var le = binary.LittleEndian

// On-disk constants of the superblock (dm-thin-metadata.c).
const (
	superblockLocation = 0
	thinVersion        = 2
	metadataBlockSize  = block.Size / 512 // in sectors
	needsCheckFlag     = 1
	maxDevID           = 1<<24 - 1
	maxTime            = 1<<24 - 1
)

// superblock is struct thin_disk_superblock.
type superblock struct {
	csum              uint32
	flags             uint32
	blocknr           uint64
	uuid              [16]byte
	magic             uint64
	version           uint32
	time              uint32
	transID           uint64
	heldRoot          uint64
	dataSM, metaSM    sm.Root
	mappingRoot       uint64
	detailsRoot       uint64
	dataBlockSize     uint32
	metadataBlockSize uint32
	metadataNrBlocks  uint64
	compat, compatRO  uint32
	incompat          uint32
}

func (s *superblock) pack(b []byte) {
	clear(b)
	le.PutUint32(b[4:], s.flags)
	le.PutUint64(b[8:], s.blocknr)
	copy(b[16:32], s.uuid[:])
	le.PutUint64(b[32:], s.magic)
	le.PutUint32(b[40:], s.version)
	le.PutUint32(b[44:], s.time)
	le.PutUint64(b[48:], s.transID)
	le.PutUint64(b[56:], s.heldRoot)
	s.dataSM.Pack(b[64:])
	s.metaSM.Pack(b[192:])
	le.PutUint64(b[320:], s.mappingRoot)
	le.PutUint64(b[328:], s.detailsRoot)
	le.PutUint32(b[336:], s.dataBlockSize)
	le.PutUint32(b[340:], s.metadataBlockSize)
	le.PutUint64(b[344:], s.metadataNrBlocks)
	le.PutUint32(b[352:], s.compat)
	le.PutUint32(b[356:], s.compatRO)
	le.PutUint32(b[360:], s.incompat)
}

func unpackSuperblock(b []byte) superblock {
	var s superblock
	s.csum = le.Uint32(b[0:])
	s.flags = le.Uint32(b[4:])
	s.blocknr = le.Uint64(b[8:])
	copy(s.uuid[:], b[16:32])
	s.magic = le.Uint64(b[32:])
	s.version = le.Uint32(b[40:])
	s.time = le.Uint32(b[44:])
	s.transID = le.Uint64(b[48:])
	s.heldRoot = le.Uint64(b[56:])
	s.dataSM = sm.UnpackRoot(b[64:])
	s.metaSM = sm.UnpackRoot(b[192:])
	s.mappingRoot = le.Uint64(b[320:])
	s.detailsRoot = le.Uint64(b[328:])
	s.dataBlockSize = le.Uint32(b[336:])
	s.metadataBlockSize = le.Uint32(b[340:])
	s.metadataNrBlocks = le.Uint64(b[344:])
	s.compat = le.Uint32(b[352:])
	s.compatRO = le.Uint32(b[356:])
	s.incompat = le.Uint32(b[360:])
	return s
}

// deviceDetails is struct disk_device_details.
type deviceDetails struct {
	mappedBlocks    uint64
	transactionID   uint64
	creationTime    uint32
	snapshottedTime uint32
}

const detailsSize = 24

func (d deviceDetails) pack(b []byte) {
	le.PutUint64(b[0:], d.mappedBlocks)
	le.PutUint64(b[8:], d.transactionID)
	le.PutUint32(b[16:], d.creationTime)
	le.PutUint32(b[20:], d.snapshottedTime)
}

func unpackDetails(b []byte) deviceDetails {
	return deviceDetails{le.Uint64(b[0:]), le.Uint64(b[8:]), le.Uint32(b[16:]), le.Uint32(b[20:])}
}

// packBlockTime and unpackBlockTime are a mapping's value: the data
// block in the upper 40 bits, the pool time of the mapping in the lower 24.
func packBlockTime(b uint64, t uint32) uint64 { return b<<24 | uint64(t) }

func unpackBlockTime(v uint64) (uint64, uint32) { return v >> 24, uint32(v & 0xffffff) }
