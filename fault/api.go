package fault

import (
	"strings"

	"github.com/dmfuse/dmfuse/delay"
	"github.com/dmfuse/dmfuse/stack"
)

// Device is the fault target's engine over any stack.BlockDevice, for tests
// in process: the same options, rules, model, messages and event log, and
// a stack.BlockDevice itself, so it goes wherever a device does (under a
// table through a stacktest.Opener, or straight into a test).
type Device struct {
	*engine
	name string
}

var _ stack.BlockDevice = (*Device)(nil)

// NewDevice returns dev behind spec: the words a fault table line has after
// its device and offset (options, then rules), sectors numbered from 0.
// Its waits are served by s (delay.NewScheduler on a clock of the test's,
// or delay.NewRealScheduler).
func NewDevice(dev stack.BlockDevice, spec string, s *delay.Scheduler) (*Device, error) {
	cfg, err := parseConfig(stack.SplitArgs(spec), dev.Size()/sector)
	if err != nil {
		return nil, err
	}
	return &Device{engine: newEngine(cfg, dev, 0, 0, dev.Size(), s.NewQueue()), name: "fault(" + dev.Name() + ")"}, nil
}

// Size is the device's.
func (d *Device) Size() int64 { return d.size }

// Name is "fault(NAME)".
func (d *Device) Name() string { return d.name }

// Message is the target's message, words split as dmsetup splits them.
func (d *Device) Message(msg string) (string, error) {
	return d.message(stack.SplitArgs(msg))
}

// Events returns the event log, oldest first.
func (d *Device) Events() []Event { return d.log.last(0) }

// Status is the target's INFO status.
func (d *Device) Status() string { return d.status() }

// Close releases the stalls and gives up the queue.
func (d *Device) Close() error {
	d.releaseStalls()
	d.q.Close()
	return nil
}

// EventLog is the event log's text.
func (d *Device) EventLog() string {
	var b strings.Builder
	b.Write(d.log.appendText(nil, 0))
	return b.String()
}
