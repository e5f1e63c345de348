package stack

import (
	"errors"
	"fmt"
	"io"
	"sync"
)

// SharedSet holds the objects that the targets of one Manager share, such as
// the delay scheduler or a thin pool's table: each is made once, by the first
// constructor that asks for it, and lives until the Manager closes the set.
// Constructors reach it through Ctor.Shared. A nil set shares nothing: Get
// makes a new object on every call.
type SharedSet struct {
	mu     sync.Mutex
	byKey  map[any]any
	order  []any // the objects in the order they were made
	closed bool
}

// Get returns the object kept under key, calling create to make it if there
// is none yet. key must be comparable; a package uses an unexported type of
// its own so that keys of different packages never collide. An error of
// create is returned and nothing is kept. create runs with the set locked: it
// must not call Get.
func (s *SharedSet) Get(key any, create func() (any, error)) (any, error) {
	if s == nil {
		return create()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.byKey[key]; ok {
		return v, nil
	}
	if s.closed {
		return nil, errors.New("shared objects: the manager is closed")
	}
	v, err := create()
	if err != nil {
		return nil, err
	}
	if s.byKey == nil {
		s.byKey = map[any]any{}
	}
	s.byKey[key] = v
	s.order = append(s.order, v)
	return v, nil
}

// Close closes the objects that implement io.Closer, the last made first,
// and returns their errors joined. Get fails after Close.
func (s *SharedSet) Close() error {
	s.mu.Lock()
	objs := s.order
	s.byKey, s.order, s.closed = nil, nil, true
	s.mu.Unlock()
	var errs []error
	for i := len(objs) - 1; i >= 0; i-- {
		if c, ok := objs[i].(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing %T: %w", objs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}
