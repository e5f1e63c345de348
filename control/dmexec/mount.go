package dmexec

// mount answers mount(source, target, fstype, flags, data): for now every
// mount runs as made.
func (c *call) mount(source, target, fstype, flags, data uint64) {
	c.proceed()
}
