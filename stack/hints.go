package stack

import (
	"context"
	"time"

	"github.com/dmfuse/dmfuse/internal/hints"
)

// Waiting tells the transport of the request ctx belongs to that the request
// is about to wait for longer than a round trip (see hints.Waiting). Targets
// call it just before blocking, and only on paths that block.
func Waiting(ctx context.Context) { hints.Waiting(ctx) }

// ContinueLead is the longest a request may take to complete after it calls
// Continuing.
const ContinueLead = hints.ContinueLead

// Continuing tells the transport of the request ctx belongs to that the
// request, which called Waiting, will complete within ContinueLead (see
// hints.Continuing).
func Continuing(ctx context.Context) { hints.Continuing(ctx) }

// Expecting tells the transport of the request ctx belongs to that the
// request, which waits, expects to complete d from now (see hints.Expecting).
func Expecting(ctx context.Context, d time.Duration) { hints.Expecting(ctx, d) }
