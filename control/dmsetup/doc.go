// Package dmsetup is dmfuse's dmsetup: the command line of lvm2's dmsetup
// (libdm/dm-tools/dmsetup.c) over a dmfuse daemon's control socket, so that
// scripts written for the kernel's device-mapper (xfstests, blktests, Go
// power-failure tests) drive dmfuse unchanged.
//
// Options are scanned as glibc's getopt_long scans them (getopt.go), verbs
// take dmsetup's argument counts, and stdout, stderr and the exit status are
// dmsetup's: the lines libdevmapper prints for a failed ioctl
// ("device-mapper: reload ioctl on NAME  failed: Invalid argument"),
// dmsetup's own ("Command failed.", "Couldn't process command line."), and
// exit status 0 or 1. The reason dmfuse gives for a failure, which the
// kernel would log, is printed only with -v.
//
// Run takes everything it touches outside itself in an Env: the command
// line, the standard streams, and how to reach the daemon. The command
// `dmfuse dmsetup` (or dmfuse invoked as dmsetup) starts the system daemon
// when a command needs one.
package dmsetup
