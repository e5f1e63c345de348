package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/control/dmsetup"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/targets"
)

// runDmsetup runs dmsetup's command line against the system instance and
// returns the exit status. prog is the name getopt's messages use.
func runDmsetup(prog string, args []string) int {
	wd, err := os.Getwd()
	if err != nil {
		wd = "/"
	}
	sys := systemInstance()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	offline := control.NewServer(ctx, stack.NewManager(stack.ManagerOptions{Registry: targets.Registry(), Context: ctx}))
	defer offline.Close()
	width := 0
	if ws, err := unix.IoctlGetWinsize(1, unix.TIOCGWINSZ); err == nil {
		width = int(ws.Col)
	}
	env := &dmsetup.Env{
		Prog: prog, Args: args, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Getenv: os.Getenv, Dir: wd,
		Connect: func(start bool) (dmsetup.Caller, error) {
			c, err := sys.connect(start, func(msg string) { fmt.Fprintln(os.Stderr, msg) })
			if c == nil || err != nil {
				return nil, err
			}
			return c, nil
		},
		Offline: dmsetup.CallerFunc(func(req *control.Request) (*control.Response, error) {
			return offline.Handle(ctx, req), nil
		}),
		Sleep:     time.Sleep,
		Root:      os.Geteuid() == 0,
		TermWidth: width,
	}
	return dmsetup.Run(env)
}

// DmsetupCmd is `dmfuse dmsetup ARGS...`; main runs it before kong parses,
// so that ARGS are dmsetup's, not dmfuse's.
type DmsetupCmd struct {
	Args []string `arg:"" optional:"" passthrough:"" help:"dmsetup's command line."`
}

// Run runs dmsetup's command line.
func (c *DmsetupCmd) Run() error {
	os.Exit(runDmsetup("dmsetup", c.Args))
	return nil
}

// InstallCmd is `dmfuse install [DIR]`.
type InstallCmd struct {
	Force bool   `help:"Replace a dmsetup that is not a link to this dmfuse."`
	Dir   string `arg:"" optional:"" default:"/usr/local/sbin" help:"Folder to put the dmsetup link in (default: /usr/local/sbin, ahead of /usr/sbin on root's PATH)." type:"path"`
}

// Run makes DIR/dmsetup a symbolic link to this binary.
func (c *InstallCmd) Run() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	link := filepath.Join(c.Dir, "dmsetup")
	if old, err := os.Readlink(link); err == nil && old == self {
		fmt.Printf("%s -> %s (already there)\n", link, self)
		return nil
	}
	if _, err := os.Lstat(link); err == nil {
		if !c.Force {
			return fmt.Errorf("%s exists and is not a link to %s (use --force to replace it)", link, self)
		}
		if err := os.Remove(link); err != nil {
			return err
		}
	}
	if err := os.Symlink(self, link); err != nil {
		return err
	}
	fmt.Printf("%s -> %s\n", link, self)
	return nil
}
