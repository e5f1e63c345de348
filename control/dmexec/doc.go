// Package dmexec gives the programs `dmfuse exec` runs the kernel's
// device-mapper interface, served by the daemon's devices.
package dmexec
