// Command dmfuse is a userspace device-mapper: `dmfuse mount` serves mapped
// devices as files on a FUSE mount, and the other verbs manage the devices of
// a running daemon the way dmsetup does.
package main

import (
	"fmt"
	"os"

	"github.com/alecthomas/kong"
)

// Globals are the flags every verb accepts, before or after the verb.
type Globals struct {
	Mount   string `help:"Mount point of the daemon to talk to." env:"DMFUSE_MOUNT" placeholder:"MOUNTPOINT"`
	Control string `help:"Control socket of the daemon to talk to (default: derived from --mount)." placeholder:"SOCKET"`
}

// CLI is the command line of dmfuse.
type CLI struct {
	Globals

	MountCmd  MountCmd  `cmd:"" name:"mount" help:"Mount dmfuse and serve mapped devices until SIGINT/SIGTERM or umount."`
	IostatCmd IostatCmd `cmd:"" name:"iostat" help:"Print per-device I/O rates from stats/diskstats, like iostat -x."`
}

func main() {
	var cli CLI
	ctx := kong.Parse(&cli,
		kong.Name("dmfuse"),
		kong.Description("A userspace device-mapper on FUSE."),
		kong.UsageOnError(),
		kong.Bind(&cli.Globals),
	)
	if err := ctx.Run(&cli.Globals); err != nil {
		fmt.Fprintf(os.Stderr, "dmfuse: %v\n", err)
		os.Exit(1)
	}
}
