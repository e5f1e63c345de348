package persistent

import (
	"errors"
	"fmt"
)

var (
	// ErrCorrupt wraps every error that says the metadata is damaged.
	ErrCorrupt = errors.New("metadata corrupt")
	// ErrNoSpace: no free block in a space map.
	ErrNoSpace = errors.New("no free space")
	// ErrReadOnly: a write was attempted on a read-only store.
	ErrReadOnly = errors.New("metadata is read-only")
	// ErrNoMetadataSpace: no free metadata block; it wraps ErrNoSpace.
	ErrNoMetadataSpace = fmt.Errorf("metadata device: %w", ErrNoSpace)
)

// Corruptf returns an error wrapping ErrCorrupt with the formatted reason.
func Corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}
