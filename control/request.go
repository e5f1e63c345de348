package control

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dmfuse/dmfuse/stack"
)

// MaxRequestSize is the largest request the daemon reads, newline included.
const MaxRequestSize = 16 << 20

// Control operations: the values of Request.Op.
const (
	OpCreate  = "create"
	OpLoad    = "load"
	OpClear   = "clear"
	OpSuspend = "suspend"
	OpResume  = "resume"
	OpRemove  = "remove"
	OpRename  = "rename"
	OpMessage = "message"
	OpTable   = "table"
	OpStatus  = "status"
	OpInfo    = "info"
	OpList    = "ls"
	OpTargets = "targets"
	// OpWait blocks until the device's event counter differs from EventNr.
	OpWait = "wait"
	// OpDeps lists the devices a table uses, as dmsetup deps prints them.
	OpDeps = "deps"
	// OpReport answers the state of devices as data: its output is a JSON
	// array of DeviceReport (ParseReport), for column reports and trees.
	OpReport = "report"
	// OpRemoveAll removes every device that is not in use.
	OpRemoveAll = "remove_all"
	// OpStop stops the daemon (`dmfuse stop`): it answers once the daemon
	// is sure to exit, or says why it cannot. With Force it tears down
	// what keeps it from stopping.
	OpStop = "stop"
	// OpSupervise hands the daemon the seccomp listener of a program that
	// `dmfuse exec` runs: the client's process (its SO_PEERCRED pid) holds
	// it as descriptor FD. Only the system instance takes it.
	OpSupervise = "supervise"
	// OpAbout answers what a client needs to know of the daemon as data:
	// its output is a JSON About.
	OpAbout = "about"
)

// Request is one control command, as the client sends it.
type Request struct {
	// Op is the command: create, load, clear, suspend, resume, remove,
	// remove_all, rename, message, table, status, info, ls, targets, wait,
	// deps, report or stop.
	Op string `json:"op"`
	// Name is the device the command acts on; table, status and info accept
	// none (every device).
	Name string `json:"name,omitempty"`
	// NewName is rename's new name.
	NewName string `json:"new_name,omitempty"`
	// UUID is create's uuid, or rename's new uuid (dmsetup's --setuuid).
	UUID string `json:"uuid,omitempty"`
	// Table is the table text of create and load.
	Table string `json:"table,omitempty"`
	// Dir is the client's working directory, against which relative paths in
	// Table resolve; it must be absolute when Table is given.
	Dir string `json:"dir,omitempty"`
	// NoTable creates a device without a table.
	NoTable bool `json:"notable,omitempty"`
	// ReadOnly creates a read-only device.
	ReadOnly bool `json:"readonly,omitempty"`
	// Minor is the minor create asks for (default: the lowest free one).
	Minor *uint32 `json:"minor,omitempty"`
	// NoFlush is suspend (or resume) --noflush, or status --noflush: the
	// targets do not commit or flush first (stack.StatusInfoNoFlush).
	NoFlush bool `json:"noflush,omitempty"`
	// NoLockFS is suspend (or resume) --nolockfs: do not freeze the file
	// system on the device's block device.
	NoLockFS bool `json:"nolockfs,omitempty"`
	// Force is remove --force, or stop --force.
	Force bool `json:"force,omitempty"`
	// Deferred is remove (or remove_all) --deferred: a device in use is
	// removed once its last user is gone.
	Deferred bool `json:"deferred,omitempty"`
	// Inactive makes table, status, info, deps and report use the
	// inactive table.
	Inactive bool `json:"inactive,omitempty"`
	// Concise is table --concise: every device on one line, in the
	// create --concise format.
	Concise bool `json:"concise,omitempty"`
	// Target makes table and status print only the lines of that target
	// type.
	Target string `json:"target,omitempty"`
	// EventNr is the event number wait waits to change from.
	EventNr uint32 `json:"event_nr,omitempty"`
	// Format is how deps names devices: devno (the default), devname or
	// blkdevname, as dmsetup deps -o.
	Format string `json:"format,omitempty"`
	// Sector selects the target a message goes to.
	Sector uint64 `json:"sector,omitempty"`
	// Args are the words of a message.
	Args []string `json:"args,omitempty"`
	// ReadAhead is create's or resume's read-ahead, as dmsetup's
	// --readahead takes it: sectors, +sectors (only if that raises it),
	// auto or -1 (leave it) or none (0).
	ReadAhead string `json:"readahead,omitempty"`
	// FD is a descriptor of the client's process (supervise).
	FD *int32 `json:"fd,omitempty"`
}

// Response is the daemon's answer to one request.
type Response struct {
	// Output is what the command prints on stdout, exactly.
	Output string `json:"output,omitempty"`
	// Error is the one-line reason a command failed, "" on success; it reads
	// "NAME: line N: TARGET: reason", the parts that apply.
	Error string `json:"error,omitempty"`
	// Errno names the errno of a failure, such as "EBUSY" or "EINVAL".
	Errno string `json:"errno,omitempty"`
}

// ErrIncompleteRequest is returned by ReadRequest when the client closed the
// connection before it sent a whole request.
var ErrIncompleteRequest = errors.New("incomplete request")

// ReadRequest reads one newline-terminated request of at most
// MaxRequestSize bytes from r and decodes it (DecodeRequest).
func ReadRequest(r io.Reader) (*Request, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, MaxRequestSize), 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(line) >= MaxRequestSize {
			return nil, fmt.Errorf("request larger than %d bytes", MaxRequestSize)
		}
		if errors.Is(err, io.EOF) {
			return nil, ErrIncompleteRequest
		}
		return nil, err
	}
	return DecodeRequest(line)
}

// DecodeRequest decodes one request line (with or without its final
// newline): one JSON object of Request's fields and nothing else. It does not
// judge the request's content; Validate does.
func DecodeRequest(line []byte) (*Request, error) {
	if len(line) > MaxRequestSize {
		return nil, fmt.Errorf("request larger than %d bytes", MaxRequestSize)
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	if bytes.IndexByte(line, '\n') >= 0 {
		return nil, errors.New("malformed request: more than one line")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var req Request
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("malformed request: %v", err)
	}
	if dec.More() {
		return nil, errors.New("malformed request: data after the JSON object")
	}
	if len(req.Args) == 0 {
		// "args":[] and no args mean the same; Encode writes neither.
		req.Args = nil
	}
	return &req, nil
}

// Validate checks a request's form, everything that can be judged without
// the devices: a known operation, only the fields that operation takes and
// those it needs, valid device names and uuids (stack.ValidName,
// stack.ValidUUID), UTF-8 text and an absolute working directory. It is the
// one place these are checked: Call runs it before sending a request and
// Server.Handle before running one. What depends on the devices (a device
// exists, a name or uuid is free, a table builds, a message has words and
// its target takes it) is the stack.Manager's to check.
func (r *Request) Validate() error {
	o, ok := ops[r.Op]
	spec := o.fields
	if !ok {
		return fmt.Errorf("unknown operation %q", r.Op)
	}
	allowed := map[string]bool{}
	for _, f := range strings.Fields(spec) {
		allowed[strings.TrimSuffix(f, "?")] = true
	}
	set := map[string]bool{
		"name": r.Name != "", "new_name": r.NewName != "", "uuid": r.UUID != "", "table": r.Table != "",
		"dir": r.Dir != "", "notable": r.NoTable, "readonly": r.ReadOnly, "noflush": r.NoFlush, "force": r.Force,
		"inactive": r.Inactive, "sector": r.Sector != 0, "args": len(r.Args) > 0,
		"nolockfs": r.NoLockFS, "deferred": r.Deferred, "concise": r.Concise, "target": r.Target != "",
		"event_nr": r.EventNr != 0, "format": r.Format != "", "minor": r.Minor != nil, "fd": r.FD != nil,
		"readahead": r.ReadAhead != "",
	}
	for _, f := range []string{"name", "new_name", "uuid", "table", "dir", "notable", "readonly", "noflush", "force", "inactive", "sector", "args",
		"nolockfs", "deferred", "concise", "target", "event_nr", "format", "minor", "fd", "readahead"} {
		if set[f] && !allowed[f] {
			return fmt.Errorf("%s: field %q does not apply", r.Op, f)
		}
	}
	if strings.Contains(" "+spec+" ", " name ") && r.Name == "" {
		return fmt.Errorf("%s: no device name", r.Op)
	}
	// The name comes first: the errors below start with it.
	if r.Name != "" {
		if err := stack.ValidName(r.Name); err != nil {
			return err
		}
	}
	texts := append([]string{r.Name, r.NewName, r.UUID, r.Table, r.Dir, r.Target}, r.Args...)
	for _, s := range texts {
		if !utf8.ValidString(s) {
			return fmt.Errorf("%s: text is not valid UTF-8", r.Op)
		}
	}
	if _, _, _, err := r.readAhead(); err != nil {
		return err
	}
	switch r.Op {
	case OpCreate:
		if r.NoTable && r.Table != "" {
			return fmt.Errorf("%s: --notable and a table exclude each other", r.Name)
		}
		if !r.NoTable && strings.TrimSpace(r.Table) == "" {
			return fmt.Errorf("%s: no table given (use --notable for a device without one)", r.Name)
		}
		if err := stack.ValidUUID(r.UUID); err != nil {
			return fmt.Errorf("%s: %v", r.Name, err)
		}
		if r.Minor != nil && *r.Minor >= 1<<20 {
			return fmt.Errorf("%s: minor %d out of range", r.Name, *r.Minor)
		}
	case OpSupervise:
		if r.FD == nil || *r.FD < 0 {
			return errors.New("supervise: no descriptor given")
		}
	case OpLoad:
		if strings.TrimSpace(r.Table) == "" {
			return fmt.Errorf("%s: no table given", r.Name)
		}
	case OpDeps:
		switch r.Format {
		case "", "devno", "devname", "blkdevname":
		default:
			return fmt.Errorf("deps: unknown format %q: want devno, devname or blkdevname", r.Format)
		}
	case OpRename:
		switch {
		case r.NewName == "" && r.UUID == "":
			return fmt.Errorf("%s: rename needs a new name or a uuid", r.Name)
		case r.NewName != "" && r.UUID != "":
			return fmt.Errorf("%s: rename takes a new name or a uuid, not both", r.Name)
		case r.NewName != "":
			if err := stack.ValidName(r.NewName); err != nil {
				return fmt.Errorf("%s: %v", r.Name, err)
			}
		default:
			if err := stack.ValidUUID(r.UUID); err != nil {
				return fmt.Errorf("%s: %v", r.Name, err)
			}
		}
	}
	if r.Dir != "" && !filepath.IsAbs(r.Dir) {
		return fmt.Errorf("%s: working directory %q is not absolute", r.Op, r.Dir)
	}
	return nil
}

// Encode returns the request as one line of JSON ended by '\n'.
func (r *Request) Encode() ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// readAhead parses ReadAhead: set reports whether to change the device's
// read-ahead, to sectors, with minimum for +N.
func (r *Request) readAhead() (set bool, sectors uint32, minimum bool, err error) {
	a := r.ReadAhead
	switch strings.ToLower(a) {
	case "", "auto", "-1": // -1 is DM_READ_AHEAD_AUTO, as dmsetup takes it
		return false, 0, false, nil
	case "none":
		return true, 0, false, nil
	}
	minimum = strings.HasPrefix(a, "+")
	n, err := strconv.ParseUint(strings.TrimPrefix(a, "+"), 10, 32)
	if err != nil {
		return false, 0, false, fmt.Errorf("%s: read-ahead %q: not a number of sectors, auto or none", r.Name, a)
	}
	return true, uint32(n), minimum, nil
}

// setReadAhead applies ReadAhead (valid: Validate checked it) to d.
func (r *Request) setReadAhead(d *stack.Device) {
	if set, sectors, minimum, _ := r.readAhead(); set {
		d.SetReadAhead(sectors, minimum)
	}
}
