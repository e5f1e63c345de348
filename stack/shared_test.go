package stack

import (
	"errors"
	"strings"
	"testing"
)

// closer records the order of Close calls.
type closer struct {
	name  string
	log   *[]string
	error error
}

func (c *closer) Close() error { *c.log = append(*c.log, c.name); return c.error }

// TestSharedSet: Get makes an object once per key, keeps nothing when create
// fails, closes the objects last made first with their errors joined, and
// fails after Close; a nil set makes a new object every time.
func TestSharedSet(t *testing.T) {
	var s SharedSet
	var log []string
	made := 0
	mk := func(name string, err error) func() (any, error) {
		return func() (any, error) { made++; return &closer{name: name, log: &log, error: err}, nil }
	}
	type keyA struct{}
	type keyB struct{}
	a1, err := s.Get(keyA{}, mk("a", nil))
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := s.Get(keyA{}, mk("a2", nil))
	if a1 != a2 || made != 1 {
		t.Fatalf("second Get made a new object (%d made)", made)
	}
	if _, err := s.Get(keyB{}, func() (any, error) { return nil, errors.New("no") }); err == nil {
		t.Fatal("a failing create returned no error")
	}
	if _, err := s.Get(keyB{}, mk("b", errors.New("b failed"))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("plain", func() (any, error) { return 7, nil }); err != nil { // not a Closer
		t.Fatal(err)
	}
	err = s.Close()
	if got := strings.Join(log, ","); got != "b,a" {
		t.Errorf("closed %q, want b,a", got)
	}
	if err == nil || !strings.Contains(err.Error(), "b failed") {
		t.Errorf("Close returned %v, want b's error", err)
	}
	if _, err := s.Get(keyA{}, mk("late", nil)); err == nil {
		t.Error("Get after Close succeeded")
	}

	var none *SharedSet
	n1, _ := none.Get(keyA{}, mk("n", nil))
	n2, _ := none.Get(keyA{}, mk("n", nil))
	if n1 == n2 {
		t.Error("a nil set shared an object")
	}
}
