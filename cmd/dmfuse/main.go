// Command dmfuse is a userspace device-mapper: `dmfuse mount` serves mapped
// devices as files on a FUSE mount, and the other verbs manage the devices of
// a running daemon the way dmsetup does.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/alecthomas/kong"
)

// Globals are the flags every verb accepts, before or after the verb.
type Globals struct {
	Mount   string `help:"Mount point of the daemon to talk to." env:"DMFUSE_MOUNT" placeholder:"MOUNTPOINT"`
	Control string `help:"Control socket: the one mount serves, or the one the other verbs talk to (default: derived from the mount point)." placeholder:"SOCKET"`
}

// CLI is the command line of dmfuse.
type CLI struct {
	Globals

	MountCmd  MountCmd  `cmd:"" name:"mount" help:"Mount dmfuse and serve mapped devices until SIGINT/SIGTERM or umount."`
	IostatCmd IostatCmd `cmd:"" name:"iostat" help:"Print per-device I/O rates from stats/diskstats, like iostat -x."`

	Create  CreateCmd  `cmd:"" help:"Create a device (table from --table, TABLEFILE or stdin; --notable for none)."`
	Load    LoadCmd    `cmd:"" aliases:"reload" help:"Load a table into a device's inactive slot."`
	Clear   ClearCmd   `cmd:"" help:"Destroy a device's inactive table."`
	Suspend SuspendCmd `cmd:"" help:"Hold new I/O on a device and wait for the I/O in flight."`
	Resume  ResumeCmd  `cmd:"" help:"Make the inactive table live (if any) and release held I/O."`
	Remove  RemoveCmd  `cmd:"" help:"Remove a device."`
	Rename  RenameCmd  `cmd:"" help:"Rename a device, or set its uuid with --setuuid."`
	Message MessageCmd `cmd:"" help:"Send a message to the target covering SECTOR."`
	Table   TableCmd   `cmd:"" help:"Print tables in reloadable form."`
	Status  StatusCmd  `cmd:"" help:"Print the targets' status."`
	Info    InfoCmd    `cmd:"" help:"Print device information."`
	Ls      LsCmd      `cmd:"" name:"ls" help:"List devices."`
	Targets TargetsCmd `cmd:"" help:"List target types and their versions."`

	ReplayLog ReplayLogCmd `cmd:"" name:"replay-log" passthrough:"" help:"Replay a log of the log-writes target onto a device (xfstests' replay-log; also the binary's behaviour under that name)."`
	Crash     CrashCmd     `cmd:"" help:"Check every state a power cut may leave at the cuts of a log-writes log (flushes, FUA writes, marks): lost and torn writes since the last flush, enumerated or sampled, each state checked by a command and reported by an id that rebuilds it."`
	Dmsetup   DmsetupCmd   `cmd:"" help:"Run dmsetup's command line against the system instance (also when dmfuse is invoked as dmsetup)."`
	Install   InstallCmd   `cmd:"" help:"Link DIR/dmsetup to dmfuse, so that scripts running dmsetup drive dmfuse."`
	Daemon    DaemonCmd    `cmd:"" help:"Serve the system instance (dmsetup starts it when a command needs it)."`
	Stop      StopCmd      `cmd:"" help:"Stop the system instance, or the daemon of --mount or --control, once none of its devices is in use (--force: whatever uses them)."`
	Exec      ExecCmd      `cmd:"" help:"Run a command with device-mapper as the kernel offers it (/dev/mapper/control, DM ioctls), served by the system instance: lvm2, cryptsetup, kpartx and the real dmsetup run unchanged."`
}

func main() {
	// Run as replay-log or dmsetup (a link named so), the binary is that
	// program alone, with its own command line rules, scanned before kong
	// sees it.
	switch filepath.Base(os.Args[0]) {
	case "replay-log":
		os.Exit(replayLog(os.Args, os.Stdout, os.Stderr))
	case "dmsetup":
		os.Exit(runDmsetup(os.Args[0], os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "dmsetup" {
		os.Exit(runDmsetup("dmsetup", os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == execChildArg {
		os.Exit(runExecChild())
	}
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
