package targets

import (
	"context"
	"fmt"

	"github.com/dmfuse/dmfuse/stack"
	th "github.com/dmfuse/dmfuse/thin"
)

// thin is thin device 1 of a pool built below each segment: the pool keeps
// its metadata on the segment's second device and its data on the
// segment's device, which holds exactly the segment's blocks.
var thin = Entry{Type: th.Type, Case: Case{
	Params: func(s Segment) string { return s.Below + " 1" },
	Aux:    4 << 20,
	Uses:   []*stack.TargetType{th.PoolType},
	Below: func(m *stack.Manager, s Segment) (string, error) {
		pool := fmt.Sprintf("pool%d", s.Index)
		table := fmt.Sprintf("0 %d thin-pool %s %s 128 0", s.Sectors, s.Aux, s.Dev)
		d, err := m.Create(stack.CreateOptions{Name: pool, Minor: -1, Table: table})
		if err != nil {
			return "", err
		}
		if _, err := m.Message(context.Background(), pool, 0, []string{"create_thin", "1"}); err != nil {
			return "", err
		}
		// By number, as the thin line prints its pool.
		return d.DevNo(), nil
	},
	// What thin device 1 holds, read through a second activation of it
	// (thin_ctr allows several, as dm_pool_open_thin_device counts them).
	Stored: func(m *stack.Manager, s Segment, n int64) ([]byte, error) {
		view := fmt.Sprintf("view%d", s.Index)
		d, err := m.Create(stack.CreateOptions{Name: view, Minor: -1, Table: fmt.Sprintf("0 %d thin %s 1", n/stack.SectorSize, s.Below)})
		if err != nil {
			return nil, err
		}
		defer m.Remove(view, stack.Flags{})
		p := make([]byte, n)
		if _, err := d.ReadAt(context.Background(), p, 0); err != nil {
			return nil, err
		}
		return p, nil
	},
}}
