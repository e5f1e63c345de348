package thin

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"sync"

	"github.com/dmfuse/dmfuse/thin/metadata"
)

// memStore is an in-memory metadata.Store that follows the API's contract:
// a committed and a current state, blocks freed in a transaction free only
// after the commit, sharing by time as the kernel has it (a mapping is
// shared when its device was snapshotted after the mapping was made), and
// opens that make delete refuse. Its committed states live in memCommitted
// under an id written to the device's first block, so that a pool opened
// again over the same device finds them.
type memStore struct {
	mu         sync.Mutex
	id         uint64
	dev        metadata.Device
	bs         uint32
	cur, com   *memState
	readOnly   bool
	needsCheck bool
	changed    bool
	devChanged map[uint32]bool
	opens      map[uint32]int
	// fail makes the named method fail once with the error.
	fail    map[string]error
	commits int
}

type memState struct {
	trans    uint64
	time     uint32
	devs     map[uint32]*memDev
	refs     []uint32 // per data block
	metaSnap uint64
	metaN    uint64
}

type memDev struct {
	maps             map[uint64]memMap
	created, snapped uint32
}

type memMap struct {
	d    uint64
	time uint32
}

func (s *memState) clone() *memState {
	c := *s
	c.refs = append([]uint32(nil), s.refs...)
	c.devs = make(map[uint32]*memDev, len(s.devs))
	for id, d := range s.devs {
		c.devs[id] = &memDev{maps: maps.Clone(d.maps), created: d.created, snapped: d.snapped}
	}
	return &c
}

var memCommitted = struct {
	sync.Mutex
	next   uint64
	states map[uint64]*memState
	check  map[uint64]bool
}{states: map[uint64]*memState{}, check: map[uint64]bool{}}

const memMagic = "memstore"

func openMemStore(dev metadata.Device, o metadata.Options) (*memStore, error) {
	b := make([]byte, 4096)
	if _, err := dev.ReadAt(context.Background(), b, 0); err != nil {
		return nil, err
	}
	s := &memStore{dev: dev, bs: o.DataBlockSize, readOnly: o.ReadOnly, devChanged: map[uint32]bool{}, opens: map[uint32]int{}, fail: map[string]error{}}
	memCommitted.Lock()
	defer memCommitted.Unlock()
	switch {
	case bytes.Equal(b, make([]byte, 4096)):
		if !o.Format {
			return nil, metadata.ErrReadOnly
		}
		memCommitted.next++
		s.id = memCommitted.next
		copy(b, memMagic)
		binary.LittleEndian.PutUint64(b[8:], s.id)
		binary.LittleEndian.PutUint32(b[16:], o.DataBlockSize)
		if _, err := dev.WriteAt(context.Background(), b, 0); err != nil {
			return nil, err
		}
		s.com = &memState{devs: map[uint32]*memDev{}, metaN: uint64(dev.Size() / 4096)}
		memCommitted.states[s.id] = s.com
	case string(b[:8]) == memMagic:
		s.id = binary.LittleEndian.Uint64(b[8:])
		if bs := binary.LittleEndian.Uint32(b[16:]); bs != o.DataBlockSize {
			return nil, fmt.Errorf("changing the data block size (from %d to %d) is not supported", bs, o.DataBlockSize)
		}
		s.com = memCommitted.states[s.id]
		s.needsCheck = memCommitted.check[s.id]
		if s.com == nil {
			return nil, metadata.ErrCorrupt
		}
	default:
		return nil, fmt.Errorf("bad magic: %w", metadata.ErrCorrupt)
	}
	s.cur = s.com.clone()
	return s, nil
}

func (s *memStore) failing(op string) error {
	if err := s.fail[op]; err != nil {
		delete(s.fail, op)
		return err
	}
	return nil
}

// write checks that the store may change and marks the transaction.
func (s *memStore) write(op string) error {
	if s.readOnly {
		return metadata.ErrReadOnly
	}
	if err := s.failing(op); err != nil {
		return err
	}
	s.changed = true
	return nil
}

func (s *memStore) CreateThin(id uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("CreateThin"); err != nil {
		return err
	}
	if s.cur.devs[id] != nil || s.opens[id] > 0 {
		return metadata.ErrExists
	}
	s.cur.devs[id] = &memDev{maps: map[uint64]memMap{}, created: s.cur.time, snapped: s.cur.time}
	return nil
}

func (s *memStore) CreateSnap(id, origin uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("CreateSnap"); err != nil {
		return err
	}
	if s.cur.devs[id] != nil {
		return metadata.ErrExists
	}
	o := s.cur.devs[origin]
	if o == nil {
		return metadata.ErrNoDevice
	}
	s.cur.time++
	o.snapped = s.cur.time
	for _, m := range o.maps {
		s.cur.refs[m.d]++
	}
	s.cur.devs[id] = &memDev{maps: maps.Clone(o.maps), created: s.cur.time, snapped: s.cur.time}
	return nil
}

func (s *memStore) DeleteThin(id uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("DeleteThin"); err != nil {
		return err
	}
	d := s.cur.devs[id]
	if d == nil {
		return metadata.ErrNoDevice
	}
	if s.opens[id] > 0 {
		return metadata.ErrBusy
	}
	for _, m := range d.maps {
		s.cur.refs[m.d]--
	}
	delete(s.cur.devs, id)
	return nil
}

func (s *memStore) TransactionID() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.trans
}

func (s *memStore) SetTransactionID(old, nw uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("SetTransactionID"); err != nil {
		return err
	}
	if s.cur.trans != old {
		return fmt.Errorf("mismatched transaction id")
	}
	s.cur.trans = nw
	return nil
}

func (s *memStore) ReserveMetadataSnap() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("ReserveMetadataSnap"); err != nil {
		return err
	}
	if s.cur.metaSnap != 0 {
		return metadata.ErrBusy
	}
	s.cur.metaSnap = 7
	return nil
}

func (s *memStore) ReleaseMetadataSnap() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("ReleaseMetadataSnap"); err != nil {
		return err
	}
	if s.cur.metaSnap == 0 {
		return fmt.Errorf("no metadata snapshot")
	}
	s.cur.metaSnap = 0
	return nil
}

func (s *memStore) MetadataSnap() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.metaSnap
}

func (s *memStore) OpenThin(id uint32) (metadata.Thin, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur.devs[id] == nil {
		return nil, metadata.ErrNoDevice
	}
	s.opens[id]++
	return &memThin{s: s, id: id}, nil
}

// freeLocked reports whether data block b may be allocated: free now and
// in the committed state.
func (s *memStore) freeLocked(b uint64) bool {
	return s.cur.refs[b] == 0 && (b >= uint64(len(s.com.refs)) || s.com.refs[b] == 0)
}

func (s *memStore) AllocDataBlock() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("AllocDataBlock"); err != nil {
		return 0, err
	}
	for b := range s.cur.refs {
		if s.freeLocked(uint64(b)) {
			s.cur.refs[b] = 1
			return uint64(b), nil
		}
	}
	return 0, metadata.ErrNoSpace
}

func (s *memStore) IncDataRange(b, e uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("IncDataRange"); err != nil {
		return err
	}
	for ; b < e; b++ {
		s.cur.refs[b]++
	}
	return nil
}

func (s *memStore) DecDataRange(b, e uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("DecDataRange"); err != nil {
		return err
	}
	for ; b < e; b++ {
		if s.cur.refs[b] == 0 {
			return fmt.Errorf("block %d: reference count below 0: %w", b, metadata.ErrCorrupt)
		}
		s.cur.refs[b]--
	}
	return nil
}

func (s *memStore) BlockIsShared(b uint64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.refs[b] > 1, nil
}

func (s *memStore) FreeDataBlocks() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := uint64(0)
	for b := range s.cur.refs {
		if s.freeLocked(uint64(b)) {
			n++
		}
	}
	return n, nil
}

func (s *memStore) DataBlocks() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return uint64(len(s.cur.refs)), nil
}

// memMetaUsed is what the fake counts as used metadata blocks: a base
// and one block per 100 mappings.
func (s *memStore) memMetaUsed() uint64 {
	n := uint64(0)
	for _, d := range s.cur.devs {
		n += uint64(len(d.maps))
	}
	return 10 + n/100
}

func (s *memStore) FreeMetadataBlocks() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.metaN - min(s.cur.metaN, s.memMetaUsed()), nil
}

func (s *memStore) MetadataBlocks() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.metaN, nil
}

func (s *memStore) ResizeData(n uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("ResizeData"); err != nil {
		return err
	}
	if n < uint64(len(s.cur.refs)) {
		return fmt.Errorf("cannot reduce size of space map")
	}
	s.cur.refs = append(s.cur.refs, make([]uint32, n-uint64(len(s.cur.refs)))...)
	return nil
}

func (s *memStore) ResizeMetadata(n uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write("ResizeMetadata"); err != nil {
		return err
	}
	if n < s.cur.metaN {
		return fmt.Errorf("cannot reduce size of space map")
	}
	s.cur.metaN = n
	return nil
}

func (s *memStore) Changed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *memStore) Commit() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readOnly {
		return metadata.ErrReadOnly
	}
	if err := s.failing("Commit"); err != nil {
		return err
	}
	s.com = s.cur.clone()
	memCommitted.Lock()
	memCommitted.states[s.id] = s.com
	memCommitted.Unlock()
	s.changed = false
	clear(s.devChanged)
	s.commits++
	return nil
}

func (s *memStore) Abort() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failing("Abort"); err != nil {
		return err
	}
	s.cur = s.com.clone()
	s.changed = false
	clear(s.devChanged)
	return nil
}

func (s *memStore) NeedsCheck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.needsCheck
}

func (s *memStore) SetNeedsCheck() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failing("SetNeedsCheck"); err != nil {
		return err
	}
	s.needsCheck = true
	memCommitted.Lock()
	memCommitted.check[s.id] = true
	memCommitted.Unlock()
	return nil
}

func (s *memStore) SetReadOnly() {
	s.mu.Lock()
	s.readOnly = true
	s.mu.Unlock()
}

func (s *memStore) SetReadWrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readOnly = false
	return nil
}

func (s *memStore) Close() error { return nil }

// memThin is one open device of a memStore.
type memThin struct {
	s      *memStore
	id     uint32
	closed bool
}

func (t *memThin) ID() uint32 { return t.id }

func (t *memThin) dev() *memDev { return t.s.cur.devs[t.id] }

func (t *memThin) Find(v uint64) (uint64, bool, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	d := t.dev()
	if d == nil {
		return 0, false, metadata.ErrNoDevice
	}
	m, ok := d.maps[v]
	if !ok {
		return 0, false, metadata.ErrNotFound
	}
	return m.d, d.snapped > m.time, nil
}

func (t *memThin) FindMappedRange(begin, end uint64) (vb, db, n uint64, shared bool, err error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	d := t.dev()
	if d == nil {
		return 0, 0, 0, false, metadata.ErrNoDevice
	}
	for v := begin; v < end; v++ {
		m, ok := d.maps[v]
		if !ok {
			continue
		}
		vb, db, n, shared = v, m.d, 1, d.snapped > m.time
		for w := v + 1; w < end; w++ {
			x, ok := d.maps[w]
			if !ok || x.d != db+n || (d.snapped > x.time) != shared {
				break
			}
			n++
		}
		return vb, db, n, shared, nil
	}
	return 0, 0, 0, false, metadata.ErrNotFound
}

func (t *memThin) Insert(v, b uint64) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if err := t.s.write("Insert"); err != nil {
		return err
	}
	d := t.dev()
	if old, ok := d.maps[v]; ok && old.d != b {
		t.s.cur.refs[old.d]--
	}
	d.maps[v] = memMap{d: b, time: t.s.cur.time}
	t.s.devChanged[t.id] = true
	return nil
}

func (t *memThin) Remove(v uint64) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if err := t.s.write("Remove"); err != nil {
		return err
	}
	d := t.dev()
	m, ok := d.maps[v]
	if !ok {
		return metadata.ErrNotFound
	}
	t.s.cur.refs[m.d]--
	delete(d.maps, v)
	t.s.devChanged[t.id] = true
	return nil
}

func (t *memThin) RemoveRange(b, e uint64) error {
	for v := b; v < e; v++ {
		if err := t.Remove(v); err != nil && err != metadata.ErrNotFound {
			return err
		}
	}
	return nil
}

func (t *memThin) HighestMapped() (uint64, bool, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	hi, ok := uint64(0), false
	for v := range t.dev().maps {
		if !ok || v > hi {
			hi, ok = v, true
		}
	}
	return hi, ok, nil
}

func (t *memThin) MappedCount() (uint64, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	return uint64(len(t.dev().maps)), nil
}

func (t *memThin) Changed() bool {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	return t.s.devChanged[t.id]
}

func (t *memThin) Close() error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if !t.closed {
		t.closed = true
		t.s.opens[t.id]--
	}
	return nil
}

var _ metadata.Store = (*memStore)(nil)
