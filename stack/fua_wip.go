package stack

import "context"

// fuaKey is the context key of the FUA mark.
type fuaKey struct{}

// fuaBackground is WithFUA(context.Background()), built once: the fs layer
// marks its writes without an allocation per write.
var fuaBackground = context.WithValue(context.Background(), fuaKey{}, true)

// WithFUA returns ctx with the FUA mark (the kernel's REQ_FUA): a write made
// with it must be on stable media before it completes. Targets read the mark
// with FUA and pass ctx on unchanged; see Target.
func WithFUA(ctx context.Context) context.Context {
	if ctx == context.Background() {
		return fuaBackground
	}
	if FUA(ctx) {
		return ctx
	}
	return context.WithValue(ctx, fuaKey{}, true)
}

// FUA reports whether ctx carries the FUA mark of WithFUA.
func FUA(ctx context.Context) bool {
	v, _ := ctx.Value(fuaKey{}).(bool)
	return v
}
