package stacktest

import (
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/internal/memdev"
	"github.com/dmfuse/dmfuse/stack"
)

// MemDevice is an in-memory stack.BlockDevice. An I/O that does not lie
// wholly inside it fails with EIO, as one past the end of a block device
// does; it counts the flushes that reach it (Flushes); Bytes gives its
// contents.
type MemDevice = memdev.Device

var _ stack.BlockDevice = (*MemDevice)(nil)

// NewMemDevice returns a zero-filled memory device of size bytes that tables
// and status print as name.
func NewMemDevice(name string, size int64) *MemDevice { return memdev.New(name, size) }

// majMin is how the manager tells a MAJOR:MINOR argument.
var majMin = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)

// Opener resolves the device arguments of tables from a map of names to
// devices, in place of the files and mapped devices a Manager opens: set
// Manager.Open, BuildOptions.Open or Ctor.Open to its Open method. The map
// is only read, so one Opener may serve concurrent builds.
type Opener map[string]stack.BlockDevice

// Open returns the device called arg. A name the map does not hold fails
// with the *stack.ArgError the manager's own lookup gives for a device that
// does not exist ("Device lookup failed", as dm_get_device failing makes the
// dm targets say): "no such mapped device" for a device-mapper name or
// MAJOR:MINOR of dmfuse's major, the errno of the failed open (ENOENT) for a
// path or another MAJOR:MINOR.
func (o Opener) Open(arg string) (stack.BlockDevice, error) {
	if d, ok := o[arg]; ok {
		return d, nil
	}
	mapped := !strings.Contains(arg, "/")
	if mm := majMin.FindStringSubmatch(arg); mm != nil {
		maj, err := strconv.ParseUint(mm[1], 10, 32)
		mapped = err == nil && maj == stack.DefaultMajor
	}
	if mapped {
		return nil, stack.Errorf("Device lookup failed: %s: no such mapped device", arg)
	}
	return nil, stack.Errorf("Device lookup failed: %s: %v", arg, syscall.ENOENT)
}
