package ioop

import "testing"

func TestNames(t *testing.T) {
	for op, want := range map[Op]string{Read: "read", Write: "write", Flush: "flush", Discard: "discard", Zeroes: "zeroes", NumOps: "I/O"} {
		if got := op.String(); got != want {
			t.Errorf("%d prints as %q, want %q", op, got, want)
		}
	}
	if Read.IsWrite() || !Flush.IsWrite() || !Zeroes.IsWrite() {
		t.Error("IsWrite: only Read is not a write")
	}
}

func TestSet(t *testing.T) {
	s := SetOf(Write, Flush)
	if !s.Has(Write) || !s.Has(Flush) || s.Has(Read) || s.Has(NumOps) {
		t.Errorf("SetOf(Write, Flush) = %v", s)
	}
	for s, want := range map[Set]string{All: "read|write|flush|discard|zeroes", All &^ SetOf(Read): "write|flush|discard|zeroes", 0: "none"} {
		if got := s.String(); got != want {
			t.Errorf("%#x prints as %q, want %q", uint8(s), got, want)
		}
	}
}
