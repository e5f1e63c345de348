package control

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// maxSocketPath is the longest path a Unix socket address holds (sun_path
// minus its terminating NUL).
const maxSocketPath = 107

// SocketDir is the folder of default control sockets: /run/dmfuse for root,
// else $XDG_RUNTIME_DIR/dmfuse, else /tmp/dmfuse-UID.
func SocketDir() string {
	if os.Geteuid() == 0 {
		return "/run/dmfuse"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "dmfuse")
	}
	return "/tmp/dmfuse-" + strconv.Itoa(os.Geteuid())
}

// EscapePath escapes an absolute path into one file name the way
// `systemd-escape --path` does: the path is cleaned, the leading and trailing
// `/` are dropped (the root becomes `-`), each `/` becomes `-`, and every byte
// other than ASCII letters, digits, `:`, `_` and a `.` that is not first
// becomes `\xNN` (lower-case hex). So /tmp/my-dm becomes `tmp-my\x2ddm`.
func EscapePath(p string) string {
	p = strings.Trim(filepath.Clean(p), "/")
	if p == "" {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == ':' || c == '_' || c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}

// DefaultPath is the control socket of a daemon mounted on mountpoint:
// SocketDir()/EscapePath(abs mountpoint).sock. When that path
// is too long for a socket address, the file name is instead `h-` and the
// first 32 hex digits of the SHA-256 of the absolute mount point, then
// `.sock`.
func DefaultPath(mountpoint string) (string, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", fmt.Errorf("mount point %s: %w", mountpoint, err)
	}
	dir := SocketDir()
	p := filepath.Join(dir, EscapePath(abs)+".sock")
	if len(p) > maxSocketPath {
		sum := sha256.Sum256([]byte(abs))
		p = filepath.Join(dir, "h-"+hex.EncodeToString(sum[:16])+".sock")
	}
	return p, nil
}

// Listen creates the control socket at path, mode 0600, creating its
// folder with mode 0700 if it is missing (strictDir: and setting an existing
// one to 0700). A socket file left by a daemon that died is replaced; one
// that a running daemon answers on is refused.
func Listen(path string, strictDir bool) (*net.UnixListener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("control socket %s: path longer than %d bytes", path, maxSocketPath)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket folder %s: %w", dir, err)
	}
	if strictDir {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("control socket folder %s: %w", dir, err)
		}
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("control socket %s: exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: in use by a running dmfuse daemon", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("control socket %s: removing a stale socket: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	return ln, nil
}

// refusalRetry is how long Call keeps retrying a connection the
// daemon refused for the moment (too many connections or requests).
const refusalRetry = 10 * time.Second

// Call validates a request (Request.Validate), sends it to the daemon
// listening on the socket at path and returns its response. A failed command
// is a response with Error set, not an error; err reports an invalid request,
// which is not sent, and failures to talk to the daemon. A connection the
// daemon refuses with EAGAIN before reading the request (its connection or
// rate bounds), or whose listen queue is full, is tried again for up to 10 s.
func Call(path string, req *Request) (*Response, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	b, err := req.Encode()
	if err != nil {
		return nil, err
	}
	if len(b) > MaxRequestSize {
		return nil, fmt.Errorf("request of %d bytes is larger than the limit of %d", len(b), MaxRequestSize)
	}
	deadline := time.Now().Add(refusalRetry)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		resp, err := callOnce(path, b)
		// A full listen queue makes connect fail with EAGAIN: as good as
		// a refusal.
		again := err == nil && isRefusal(resp) || errors.Is(err, syscall.EAGAIN)
		if !again || time.Now().After(deadline) {
			return resp, err
		}
		time.Sleep(wait)
	}
}

// isRefusal reports whether resp is the daemon's refusal of a connection it
// did not serve for the moment, rather than the result of a command.
func isRefusal(r *Response) bool {
	return r.Errno == "EAGAIN" && strings.HasPrefix(r.Error, "control socket: ")
}

// callOnce makes one connection, sends the request b and reads the answer.
func callOnce(path string, b []byte) (*Response, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("control socket %s: no dmfuse daemon answers there: %w", path, cause(err))
		}
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	defer c.Close()
	_, werr := c.Write(b)
	// Read the answer even if the write failed: a daemon that refuses the
	// connection answers and closes without reading the request.
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil && werr != nil {
		return nil, fmt.Errorf("control socket %s: sending the request: %w", path, werr)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("control socket %s: the daemon closed the connection without an answer", path)
		}
		return nil, fmt.Errorf("control socket %s: reading the answer: %w", path, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, fmt.Errorf("control socket %s: malformed answer: %w", path, err)
	}
	return &resp, nil
}

// cause returns the error err wraps (for a *net.OpError, the system call's
// error without the addresses), or err itself.
func cause(err error) error {
	if e := errors.Unwrap(err); e != nil {
		return e
	}
	return err
}
