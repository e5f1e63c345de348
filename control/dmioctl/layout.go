package dmioctl

import (
	"bytes"
	"encoding/binary"
)

// The interface version this package answers with: what Linux 6.16 and later
// report (include/uapi/linux/dm-ioctl.h: DM_VERSION_MAJOR, _MINOR,
// _PATCHLEVEL, "-ioctl (2025-04-28)").
const (
	VersionMajor = 4
	VersionMinor = 50
	VersionPatch = 0
)

// Sizes and offsets of struct dm_ioctl and the structures that follow it in
// the data area (include/uapi/linux/dm-ioctl.h), on every architecture
// Linux builds dm for: the fields are naturally aligned and the u64s sit at
// 8-byte offsets.
const (
	// HeaderSize is sizeof(struct dm_ioctl).
	HeaderSize = 312
	// minDataSize is offsetof(struct dm_ioctl, data): what every command
	// copies in, and what a command that outputs nothing copies back.
	minDataSize = 305
	// NameLen and UUIDLen are the sizes of the name and uuid fields, NUL
	// included.
	NameLen = 128
	UUIDLen = 129
	// MaxTypeName is the size of a target spec's type field.
	MaxTypeName = 16
	// maxDataSize is DM_MAX_TARGETS * DM_MAX_TARGET_PARAMS, the largest
	// data_size the kernel takes.
	maxDataSize = 1048576 * 1024

	offVersion     = 0
	offDataSize    = 12
	offDataStart   = 16
	offTargetCount = 20
	offOpenCount   = 24
	offFlags       = 28
	offEventNr     = 32
	offDev         = 40
	offName        = 48
	offUUID        = offName + NameLen // 176

	// specSize is sizeof(struct dm_target_spec): sector_start, length,
	// status, next, target_type[16].
	specSize       = 40
	specOffStart   = 0
	specOffLength  = 8
	specOffStatus  = 16
	specOffNext    = 20
	specOffType    = 24
	depsHeaderSize = 8  // struct dm_target_deps: count, padding
	nameListHeader = 12 // struct dm_name_list: dev, next
	versionsHeader = 16 // struct dm_target_versions: next, version[3]
	msgHeaderSize  = 8  // struct dm_target_msg: sector
)

// Type is DM_IOCTL, the ioctl type of every device-mapper command.
const Type = 0xfd

// Command numbers (the _IOC_NR of each ioctl).
const (
	CmdVersion = iota
	CmdRemoveAll
	CmdListDevices
	CmdDevCreate
	CmdDevRemove
	CmdDevRename
	CmdDevSuspend
	CmdDevStatus
	CmdDevWait
	CmdTableLoad
	CmdTableClear
	CmdTableDeps
	CmdTableStatus
	CmdListVersions
	CmdTargetMsg
	CmdDevSetGeometry
	CmdDevArmPoll
	CmdGetTargetVersion
	// CmdMpathProbePaths is a block device ioctl of multipath devices; the
	// control node refuses it as an unknown command.
	CmdMpathProbePaths
)

// Ioctl returns the ioctl number of command nr: _IOWR(DM_IOCTL, nr, struct
// dm_ioctl).
func Ioctl(nr uint32) uint32 {
	const iocWrite, iocRead = 1, 2
	return (iocRead|iocWrite)<<30 | HeaderSize<<16 | Type<<8 | nr
}

// Flags of dm_ioctl.flags.
const (
	FlagReadOnly        = 1 << 0
	FlagSuspend         = 1 << 1
	FlagPersistentDev   = 1 << 3
	FlagStatusTable     = 1 << 4
	FlagActivePresent   = 1 << 5
	FlagInactivePresent = 1 << 6
	FlagBufferFull      = 1 << 8
	FlagSkipBdget       = 1 << 9
	FlagSkipLockFS      = 1 << 10
	FlagNoFlush         = 1 << 11
	FlagQueryInactive   = 1 << 12
	FlagUeventGenerated = 1 << 13
	FlagUUID            = 1 << 14
	FlagSecureData      = 1 << 15
	FlagDataOut         = 1 << 16
	FlagDeferredRemove  = 1 << 17
	FlagInternalSuspend = 1 << 18
	FlagIMAMeasurement  = 1 << 19
)

// Flags of a dm_name_list entry (after its event number).
const (
	NameListHasUUID        = 1
	NameListDoesntHaveUUID = 2
)

var le = binary.LittleEndian

// param is one ioctl's buffer as the kernel holds it: the caller's bytes, of
// data_size (or, for a command that takes no data, minDataSize), which the
// command changes in place and of which the first dataSize() bytes go back.
type param struct {
	b []byte
}

func (p param) u32(off int) uint32       { return le.Uint32(p.b[off:]) }
func (p param) setU32(off int, v uint32) { le.PutUint32(p.b[off:], v) }

func (p param) flags() uint32        { return p.u32(offFlags) }
func (p param) setFlags(f uint32)    { p.setU32(offFlags, f) }
func (p param) orFlags(f uint32)     { p.setFlags(p.flags() | f) }
func (p param) clearFlags(f uint32)  { p.setFlags(p.flags() &^ f) }
func (p param) has(f uint32) bool    { return p.flags()&f != 0 }
func (p param) dataSize() uint32     { return p.u32(offDataSize) }
func (p param) setDataSize(v uint32) { p.setU32(offDataSize, v) }
func (p param) dataStart() uint32    { return p.u32(offDataStart) }
func (p param) eventNr() uint32      { return p.u32(offEventNr) }
func (p param) dev() uint64          { return le.Uint64(p.b[offDev:]) }
func (p param) setDev(v uint64)      { le.PutUint64(p.b[offDev:], v) }
func (p param) targetCount() uint32  { return p.u32(offTargetCount) }
func (p param) name() string         { return cstring(p.b[offName : offName+NameLen]) }
func (p param) uuid() string         { return cstring(p.b[offUUID : offUUID+UUIDLen]) }
func (p param) setName(s string)     { putCString(p.b[offName:offName+NameLen], s) }
func (p param) setUUID(s string)     { putCString(p.b[offUUID:offUUID+UUIDLen], s) }

// cstring returns b up to its first NUL (all of b if there is none).
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

// putCString writes s into b NUL-terminated and padded with NULs, cut to
// fit (strscpy_pad).
func putCString(b []byte, s string) {
	if len(s) > len(b)-1 {
		s = s[:len(b)-1]
	}
	n := copy(b, s)
	clear(b[n:])
}

// align8 rounds n up to a multiple of 8 (the kernel's align_val).
func align8(n int) int { return (n + 7) &^ 7 }

// EncodeDev is the kernel's huge_encode_dev of major:minor (new_encode_dev:
// the low 8 bits of the minor, the major, then the rest of the minor).
func EncodeDev(major, minor uint32) uint64 {
	return uint64(minor&0xff | major<<8 | (minor&^0xff)<<12)
}

// DecodeDev is the kernel's huge_decode_dev (new_decode_dev of the low 32
// bits).
func DecodeDev(dev uint64) (major, minor uint32) {
	d := uint32(dev)
	return (d & 0xfff00) >> 8, d&0xff | (d>>12)&0xfff00
}
