package multipath

import (
	"fmt"
	"strings"

	"github.com/dmfuse/dmfuse/selectors"
	"github.com/dmfuse/dmfuse/stack"
)

// Status implements Target (multipath_status).
func (m *multipath) Status(t stack.StatusType) string {
	st := selectors.StatusInfo
	if t == stack.StatusTable {
		st = selectors.StatusTable
	}
	var b strings.Builder
	m.mu.Lock()
	defer m.mu.Unlock()
	if t == stack.StatusInfo {
		// pg_init_count is 0: without a hardware handler pg_init never runs.
		fmt.Fprintf(&b, "2 %d 0 ", b2u(m.queueIO.Load()))
	} else {
		q := m.mu.queueIfNoPath
		nfeat := b2u(q) + 2*b2u(m.pgInitRetries > 0) + 2*b2u(m.pgInitDelaySet) + b2u(m.retainHW) + 2*b2u(m.bio)
		fmt.Fprintf(&b, "%d ", nfeat)
		if q {
			b.WriteString("queue_if_no_path ")
		}
		if m.pgInitRetries > 0 {
			fmt.Fprintf(&b, "pg_init_retries %d ", m.pgInitRetries)
		}
		if m.pgInitDelaySet {
			fmt.Fprintf(&b, "pg_init_delay_msecs %d ", m.pgInitDelay)
		}
		if m.retainHW {
			b.WriteString("retain_attached_hw_handler ")
		}
		if m.bio {
			b.WriteString("queue_mode bio ")
		}
	}
	if m.hwName == "" || t == stack.StatusInfo {
		b.WriteString("0 ")
	} else {
		fmt.Fprintf(&b, "1 %s ", stack.EscapeArg(m.hwName))
	}
	cur, next := m.currentPG.Load(), m.nextPG.Load()
	pgnum := 0
	switch {
	case cur != nil:
		pgnum = cur.num
	case next != nil:
		pgnum = next.num
	case len(m.pgs) > 0:
		pgnum = 1
	}
	fmt.Fprintf(&b, "%d %d ", len(m.pgs), pgnum)
	for _, pg := range m.pgs {
		if t == stack.StatusInfo {
			state := "E "
			switch {
			case pg.bypassed.Load():
				state = "D "
			case pg == cur:
				state = "A "
			}
			b.WriteString(state)
			b.WriteString(pg.sel.Status(nil, st))
			fmt.Fprintf(&b, "%d %d ", len(pg.paths), pg.typ.InfoArgs)
			for _, pp := range pg.paths {
				state := "F"
				if pp.active {
					state = "A"
				}
				fmt.Fprintf(&b, "%s %s %d ", stack.EscapeArg(pp.dev.Name()), state, pp.failCount)
				b.WriteString(pg.sel.Status(&pp.sp, st))
			}
			continue
		}
		b.WriteString(pg.typ.Name)
		b.WriteByte(' ')
		b.WriteString(pg.sel.Status(nil, st))
		fmt.Fprintf(&b, "%d %d ", len(pg.paths), pg.typ.TableArgs)
		for _, pp := range pg.paths {
			b.WriteString(stack.EscapeArg(pp.dev.Name()))
			b.WriteByte(' ')
			b.WriteString(pg.sel.Status(&pp.sp, st))
		}
	}
	return b.String()
}

func b2u(v bool) int {
	if v {
		return 1
	}
	return 0
}
