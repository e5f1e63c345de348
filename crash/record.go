package crash

import (
	"errors"
	"fmt"
	"io"

	"github.com/dmfuse/dmfuse/logwrites"
)

// Write is one entry of a log that changes the device: a data write or a
// discard. Sectors count the log's units.
type Write struct {
	// Entry is the entry's index in the log.
	Entry  uint64
	Sector uint64
	Count  uint64
	Flags  uint64
	// Data is the byte offset of its data in the log (data writes only).
	Data int64
}

// Discard reports whether w is a discard (no data follows it in the log;
// what it keeps reads as zeros here).
func (w Write) Discard() bool { return w.Flags&logwrites.FlagDiscard != 0 }

// FUA reports whether w was durable when it completed.
func (w Write) FUA() bool { return w.Flags&logwrites.FlagFUA != 0 }

// Point is an entry at which a crash may be cut: a flush, a FUA write or a
// mark, with what precedes it.
type Point struct {
	// Entry is its index in the log.
	Entry uint64
	// Flags are its entry flags.
	Flags uint64
	// Mark is a mark's name.
	Mark string
	// Writes is how many writes (of Record.Writes) precede it or are it.
	Writes int
}

// Record is the index of a log: its writes in log order and its entries
// that cut points are chosen from. The data stays in the log and is read
// when a state needs it.
type Record struct {
	// Unit is the log unit in bytes (the recorded device's logical block).
	Unit int64
	// Entries is how many entries the log has.
	Entries uint64
	// Writes are the data writes and discards, in log order.
	Writes []Write
	// Points are the flush, FUA and mark entries, in log order.
	Points []Point
	// Sectors is one past the highest unit any write touches.
	Sectors uint64
	// flushAt are the flush entries, in log order.
	flushAt []flushMark
}

// flushMark says that entry Entry was a flush: every write before it in
// the log (the first Writes of them) is durable from there on.
type flushMark struct {
	Entry  uint64
	Writes int
}

// EntryError is a log that cannot be read past an entry.
type EntryError struct {
	Entry uint64
	Err   error
}

func (e *EntryError) Error() string { return fmt.Sprintf("log entry %d: %v", e.Entry, e.Err) }
func (e *EntryError) Unwrap() error { return e.Err }

// Scan reads the log in src (size bytes, negative when unknown) and
// returns its index. A truncated log, a bad magic or a malformed entry is
// an error naming the entry; nothing past it is read.
func Scan(src io.ReaderAt, size int64) (*Record, error) {
	r, err := logwrites.Open(src, size, 64<<10) // headers only: the data is skipped
	if err != nil {
		return nil, err
	}
	rec := &Record{Unit: r.SectorSize(), Entries: r.Super().NrEntries}
	for r.More() {
		idx := r.Index()
		e, err := r.Next(int(r.SectorSize()))
		if err != nil {
			return nil, &EntryError{Entry: idx, Err: err}
		}
		if e.Flags&logwrites.FlagMark != 0 {
			rec.Points = append(rec.Points, Point{Entry: e.Index, Flags: e.Flags, Mark: e.Mark(), Writes: len(rec.Writes)})
			continue
		}
		if e.Flags&logwrites.FlagFlush != 0 {
			// The flush covers every write completed before it was
			// issued: those logged before it.
			rec.flushAt = append(rec.flushAt, flushMark{Entry: e.Index, Writes: len(rec.Writes)})
		}
		if e.NrSectors != 0 {
			w := Write{Entry: e.Index, Sector: e.Sector, Count: e.NrSectors, Flags: e.Flags, Data: -1}
			if e.Sector > ^uint64(0)-e.NrSectors {
				return nil, &EntryError{Entry: idx, Err: errors.New("its sectors run past 2^64")}
			}
			if e.HasData() {
				w.Data = r.Pos()
				if err := r.SkipData(e); err != nil {
					return nil, &EntryError{Entry: idx, Err: err}
				}
				if size >= 0 && r.Pos() > size {
					return nil, &EntryError{Entry: idx, Err: fmt.Errorf("its data runs past the end of the log (byte %d of %d)", r.Pos(), size)}
				}
			}
			rec.Writes = append(rec.Writes, w)
			rec.Sectors = max(rec.Sectors, w.Sector+w.Count)
		}
		if e.Flags&(logwrites.FlagFlush|logwrites.FlagFUA) != 0 {
			rec.Points = append(rec.Points, Point{Entry: e.Index, Flags: e.Flags, Writes: len(rec.Writes)})
		}
	}
	return rec, nil
}

// durable returns how many writes a completed flush covers at the cut
// after entry cut: those logged before the last flush entry at or before
// it.
func (rec *Record) durable(cut uint64) int {
	d := 0
	for _, f := range rec.flushAt {
		if f.Entry > cut {
			break
		}
		d = f.Writes
	}
	return d
}
