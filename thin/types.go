package thin

import "github.com/dmfuse/dmfuse/thin/metadata"

// PoolType and Type are the thin-pool and thin target types over the
// kernel's on-disk metadata format (metadata.Open).
var PoolType, Type = NewTypes(func(d metadata.Device, o metadata.Options) (metadata.Store, error) {
	return metadata.Open(d, o)
})
