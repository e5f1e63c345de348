package thin

import (
	"context"
	"log"
)

// ctxT is the context of an I/O.
type ctxT = context.Context

// bg is the context of I/O the pool makes on its own (commits).
var bg = context.Background()

// stackLog logs what the kernel logs with DMWARN and DMINFO outside a pool.
func stackLog(format string, a ...any) { log.Printf("thin: "+format, a...) }
