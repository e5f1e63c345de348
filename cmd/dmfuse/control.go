package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/dmfuse/dmfuse/control"
)

// The client verbs: each builds one request, sends it to the daemon's
// control socket and prints the answer as dmsetup would.

// controlPath finds the daemon's control socket: --control, else the default
// socket of --mount (or DMFUSE_MOUNT), else the system instance's if it runs.
func (g *Globals) controlPath() (string, error) {
	if g.Control != "" {
		return g.Control, nil
	}
	if g.Mount == "" {
		if sys := systemInstance(); sys.running() {
			return sys.socket(), nil
		}
		return "", errors.New("no daemon given: use --mount MOUNTPOINT, set DMFUSE_MOUNT or use --control SOCKET")
	}
	return control.DefaultPath(g.Mount)
}

// call sends req and prints its output; an invalid request (control.Call
// checks it) or a failed command is returned as an error carrying the
// one-line reason.
func (g *Globals) call(req *control.Request) error {
	path, err := g.controlPath()
	if err != nil {
		return err
	}
	resp, err := control.Call(path, req)
	if err != nil {
		return err
	}
	os.Stdout.WriteString(resp.Output)
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	return nil
}

// tableText reads a table from --table, a file or stdin, as dmsetup does.
func tableText(inline *string, file string) (string, error) {
	switch {
	case inline != nil && file != "":
		return "", errors.New("give the table as --table TEXT or as TABLEFILE, not both")
	case inline != nil:
		return *inline, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("table file: %w", err)
		}
		return string(b), nil
	}
	b, err := io.ReadAll(io.LimitReader(os.Stdin, control.MaxRequestSize))
	if err != nil {
		return "", fmt.Errorf("reading the table from stdin: %w", err)
	}
	return string(b), nil
}

// workDir is the client's working directory, sent with tables so that
// relative paths in them resolve where the user typed them.
func workDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	return wd, nil
}

// CreateCmd is `dmfuse create`.
type CreateCmd struct {
	UUID     string  `name:"uuid" help:"UUID of the new device." placeholder:"UUID"`
	ReadOnly bool    `name:"readonly" help:"Create a read-only device."`
	NoTable  bool    `name:"notable" help:"Create the device without a table."`
	Table    *string `help:"Table text (lines separated by newlines)." placeholder:"TEXT"`

	Name      string `arg:"" help:"Device name."`
	TableFile string `arg:"" optional:"" help:"File holding the table (default: --table, else stdin)." placeholder:"TABLEFILE"`
}

// Run creates the device and, unless --notable, loads and resumes its table;
// on any failure nothing is left. With --notable, stdin is not read; a table
// given besides is sent too, for the request's validation to refuse.
func (c *CreateCmd) Run(g *Globals) error {
	req := &control.Request{Op: control.OpCreate, Name: c.Name, UUID: c.UUID, ReadOnly: c.ReadOnly, NoTable: c.NoTable}
	if c.NoTable && c.Table == nil && c.TableFile == "" {
		return g.call(req)
	}
	text, err := tableText(c.Table, c.TableFile)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	if req.Dir, err = workDir(); err != nil {
		return err
	}
	req.Table = text
	return g.call(req)
}

// LoadCmd is `dmfuse load` (alias reload).
type LoadCmd struct {
	Table *string `help:"Table text (lines separated by newlines)." placeholder:"TEXT"`

	Name      string `arg:"" help:"Device name."`
	TableFile string `arg:"" optional:"" help:"File holding the table (default: --table, else stdin)." placeholder:"TABLEFILE"`
}

// Run builds the table and puts it in the device's inactive slot.
func (c *LoadCmd) Run(g *Globals) error {
	text, err := tableText(c.Table, c.TableFile)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	wd, err := workDir()
	if err != nil {
		return err
	}
	return g.call(&control.Request{Op: control.OpLoad, Name: c.Name, Table: text, Dir: wd})
}

// ClearCmd is `dmfuse clear`.
type ClearCmd struct {
	Name string `arg:"" help:"Device name."`
}

// Run destroys the device's inactive table.
func (c *ClearCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpClear, Name: c.Name})
}

// SuspendCmd is `dmfuse suspend`.
type SuspendCmd struct {
	NoFlush bool   `name:"noflush" help:"Keep queued I/O queued instead of failing it."`
	Name    string `arg:"" help:"Device name."`
}

// Run holds new I/O and waits for the I/O in flight.
func (c *SuspendCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpSuspend, Name: c.Name, NoFlush: c.NoFlush})
}

// ResumeCmd is `dmfuse resume`.
type ResumeCmd struct {
	Name string `arg:"" help:"Device name."`
}

// Run makes the inactive table live (if any) and releases held I/O.
func (c *ResumeCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpResume, Name: c.Name})
}

// RemoveCmd is `dmfuse remove`.
type RemoveCmd struct {
	Force bool   `help:"First replace the table with an error table of the same size."`
	Name  string `arg:"" help:"Device name."`
}

// Run removes the device.
func (c *RemoveCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpRemove, Name: c.Name, Force: c.Force})
}

// RenameCmd is `dmfuse rename`.
type RenameCmd struct {
	SetUUID string `name:"setuuid" help:"Set the device's uuid (only if it has none) instead of renaming it." placeholder:"UUID"`
	Name    string `arg:"" help:"Device name."`
	NewName string `arg:"" optional:"" help:"New device name."`
}

// Run renames the device or sets its uuid.
func (c *RenameCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpRename, Name: c.Name, NewName: c.NewName, UUID: c.SetUUID})
}

// MessageCmd is `dmfuse message`.
type MessageCmd struct {
	Name   string   `arg:"" help:"Device name."`
	Sector string   `arg:"" help:"A sector inside the target to send the message to (0 for single-target tables)."`
	Words  []string `arg:"" passthrough:"" help:"The message; words starting with @ go to the core (@stats_...)."`
}

// Run sends the message and prints the response (with a final newline).
func (c *MessageCmd) Run(g *Globals) error {
	sector, err := strconv.ParseUint(c.Sector, 10, 64)
	if err != nil {
		return fmt.Errorf("%s: invalid sector %q", c.Name, c.Sector)
	}
	return g.call(&control.Request{Op: control.OpMessage, Name: c.Name, Sector: sector, Args: c.Words})
}

// TableCmd is `dmfuse table`.
type TableCmd struct {
	Inactive bool   `help:"Print the inactive table."`
	Name     string `arg:"" optional:"" help:"Device name (default: every device, lines prefixed NAME: )."`
}

// Run prints the table in reloadable form.
func (c *TableCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpTable, Name: c.Name, Inactive: c.Inactive})
}

// StatusCmd is `dmfuse status`.
type StatusCmd struct {
	Inactive bool   `help:"Print the inactive table's status."`
	NoFlush  bool   `name:"noflush" help:"Do not commit or flush first (a thin pool's status commits its metadata otherwise), as dmsetup status --noflush."`
	Name     string `arg:"" optional:"" help:"Device name (default: every device, lines prefixed NAME: )."`
}

// Run prints each target's status.
func (c *StatusCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpStatus, Name: c.Name, Inactive: c.Inactive, NoFlush: c.NoFlush})
}

// InfoCmd is `dmfuse info`.
type InfoCmd struct {
	Name string `arg:"" optional:"" help:"Device name (default: every device)."`
}

// Run prints the info block.
func (c *InfoCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpInfo, Name: c.Name})
}

// LsCmd is `dmfuse ls`.
type LsCmd struct{}

// Run lists the devices.
func (c *LsCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpList})
}

// TargetsCmd is `dmfuse targets`.
type TargetsCmd struct{}

// Run lists the target types and their versions.
func (c *TargetsCmd) Run(g *Globals) error {
	return g.call(&control.Request{Op: control.OpTargets})
}
