package main

import (
	"os"
	"sync"
)

// kernelLog returns what logs a line the kernel's device-mapper would log
// (DMERR, DMWARN): to the kernel log through /dev/kmsg, where dmesg shows
// it, and to the daemon's log through logf.
func kernelLog(logf func(string, ...any)) func(line string) {
	var mu sync.Mutex
	var kmsg *os.File
	var tried bool
	return func(line string) {
		logf("%s", line)
		mu.Lock()
		defer mu.Unlock()
		if !tried {
			tried = true
			kmsg, _ = os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
		}
		if kmsg != nil {
			// <3>: KERN_ERR, DMERR's level.
			kmsg.Write([]byte("<3>" + line + "\n"))
		}
	}
}
