package stats

import "syscall"

// totalRAM returns the machine's RAM in bytes, or the largest value if it
// cannot be read.
func totalRAM() uint64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return ^uint64(0)
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}
