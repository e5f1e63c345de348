package crash

import (
	"bytes"
	"testing"

	"github.com/dmfuse/dmfuse/logwrites"
)

// FuzzScan: any log is indexed or refused with an error, never a panic;
// every write of an index lies within its log.
func FuzzScan(f *testing.F) {
	f.Add(buildLog([]tEntry{{Sector: 0, Count: 2, Fill: 1}, {Flags: logwrites.FlagFlush}, {Sector: 3, Count: 1, Flags: logwrites.FlagFUA, Fill: 2}}))
	f.Add(buildLog([]tEntry{{Flags: logwrites.FlagMark, Mark: "m"}, {Sector: 1, Count: 4, Flags: logwrites.FlagDiscard}}))
	f.Fuzz(func(t *testing.T, log []byte) {
		rec, err := Scan(bytes.NewReader(log), int64(len(log)))
		if err != nil {
			return
		}
		for _, w := range rec.Writes {
			if w.Data >= 0 && w.Data+int64(w.Count)*rec.Unit > int64(len(log)) {
				t.Fatalf("entry %d's data runs past the log", w.Entry)
			}
		}
		for cut := uint64(0); cut < min(rec.Entries, 4); cut++ {
			states, _ := rec.States(cut, Options{Mode: Sector, Limit: 4, Unit: 4096})
			for _, s := range states {
				if _, err := rec.Parse(rec.ID(s)); err != nil {
					t.Fatalf("%s: %v", rec.ID(s), err)
				}
			}
		}
	})
}

// FuzzParse: any id is read or refused; one that is read prints back as
// itself.
func FuzzParse(f *testing.F) {
	log := buildLog([]tEntry{{Sector: 0, Count: 8, Fill: 1}, {Flags: logwrites.FlagFlush}, {Sector: 1, Count: 4, Fill: 2}, {Sector: 9, Count: 1, Fill: 3}})
	rec, err := Scan(bytes.NewReader(log), int64(len(log)))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"3:-:old", "3:2,3:zero", "3@512:2/0-2,3:junk.5", "3@4096:2/0:old", "1:-:old"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		s, err := rec.Parse(id)
		if err != nil {
			return
		}
		if back := rec.ID(s); back != id {
			t.Fatalf("%q read back as %q", id, back)
		}
	})
}
