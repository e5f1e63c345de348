package thin

import (
	"fmt"
	"syscall"

	"github.com/dmfuse/dmfuse/thin/metadata"
)

// openMetadata opens the on-disk metadata store.
var openMetadata OpenFunc = func(metadata.Device, metadata.Options) (metadata.Store, error) {
	return nil, fmt.Errorf("the thin metadata format is not built in: %w", syscall.ENOSYS)
}

// PoolType and Type are the thin-pool and thin target types over the
// kernel's on-disk metadata format.
var PoolType, Type = NewTypes(func(d metadata.Device, o metadata.Options) (metadata.Store, error) {
	return openMetadata(d, o)
})
