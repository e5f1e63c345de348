package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dmfuse/dmfuse/control"
	"github.com/dmfuse/dmfuse/fs/export"
)

// nobody is the uid and gid the peer-credential test runs its client as.
const nobody = 65534

// publicDir returns a new folder that every user may enter, with a copy of
// the dmfuse binary in it that every user may run; it is removed at cleanup.
func publicDir(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "dmfuse-public-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dmfuseBin)
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "dmfuse")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// asNobody runs the dmfuse binary bin as uid/gid 65534 and returns its
// stderr and exit code.
func asNobody(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if err == nil {
		return errb.String(), 0
	}
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("running %s as nobody: %v", bin, err)
	}
	return errb.String(), ee.ExitCode()
}

// TestControlSocketPeerCredentials checks that a client of another uid
// cannot send commands: the socket's mode keeps it from connecting, and
// when the mode lets it connect, the daemon reads its credentials
// (SO_PEERCRED) and refuses it.
func TestControlSocketPeerCredentials(t *testing.T) {
	requireFUSE(t)
	pub, bin := publicDir(t)
	sock := filepath.Join(pub, "ctl.sock")
	d := startDaemon(t, t.TempDir(), "z,,,rw,0 8 zero\n", "--control", sock)
	if st, err := os.Stat(sock); err != nil || st.Mode() != os.ModeSocket|0o600 {
		t.Fatalf("socket: %v, %v; want mode 0600", st, err)
	}
	defSock, err := control.DefaultPath(d.mnt)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Dir(defSock)); err != nil || st.Mode() != os.ModeDir|0o700 {
		t.Errorf("default socket folder: %v, %v; want mode 0700", st, err)
	}

	// Mode 0600: nobody cannot even connect.
	errs, code := asNobody(t, bin, "--control", sock, "create", "evil", "--table", "0 8 zero")
	if code == 0 || !strings.Contains(errs, "permission denied") {
		t.Errorf("create as nobody through a 0600 socket: exit %d, %q", code, errs)
	}

	// A socket whose mode lets anyone connect: the daemon refuses the peer.
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"create", "evil", "--table", "0 8 zero"}, {"ls"}, {"remove", "z"}} {
		errs, code := asNobody(t, bin, append([]string{"--control", sock}, args...)...)
		if code != 1 || !strings.Contains(errs, "uid 65534 may not send commands") {
			t.Errorf("%s as nobody through a 0666 socket: exit %d, %q", args[0], code, errs)
		}
	}
	out, err := exec.Command(dmfuseBin, "--control", sock, "ls").CombinedOutput()
	if err != nil || string(out) != fmt.Sprintf("z\t(%d:0)\n", export.FreeMajor()) {
		t.Errorf("ls as root after the refused commands: %q, %v", out, err)
	}
}

// rawCall sends payload on a new connection to the socket and returns the
// answer line decoded ("" error and errno if the daemon closed without one).
func rawCall(t *testing.T, sock string, payload []byte) control.Response {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write(payload)
	c.SetReadDeadline(time.Now().Add(time.Minute))
	var r control.Response
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err == io.EOF && len(line) == 0 {
		return r
	}
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("answer %q: %v", line, err)
	}
	return r
}

// TestControlSocketBounds checks the control socket's bounds: clients that
// send nothing, half a request or close their end early hold only their own
// connection; an oversized request is refused; connections beyond
// control.MaxConns and requests beyond control.Rate per second are refused
// with EAGAIN; I/O and well-behaved clients go on meanwhile.
func TestControlSocketBounds(t *testing.T) {
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "a.img"), 1<<20)
	d := startDaemon(t, dir, "lin,,,rw,0 2048 linear ./a.img 0\n")
	sock, err := control.DefaultPath(d.mnt)
	if err != nil {
		t.Fatal(err)
	}
	ls := func(what string) {
		t.Helper()
		resp, err := control.Call(sock, &control.Request{Op: control.OpList})
		if err != nil || resp.Error != "" || resp.Output != fmt.Sprintf("lin\t(%d:0)\n", export.FreeMajor()) {
			t.Fatalf("ls %s: %+v, %v", what, resp, err)
		}
	}

	// Stalled clients: silent, half a request, half a request then EOF.
	var stalled []net.Conn
	defer func() {
		for _, c := range stalled {
			c.Close()
		}
	}()
	for i := range 30 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
		switch i % 3 {
		case 1:
			c.Write([]byte(`{"op":"create","name":"half`))
		case 2:
			c.Write([]byte(`{"op":"remove","name":"lin"`))
			c.(*net.UnixConn).CloseWrite()
		}
	}
	ls("beside 30 stalled clients")
	buf := make([]byte, 4096)
	if err := os.WriteFile(d.path("lin"), bytes.Repeat([]byte{7}, 4096), 0); err != nil {
		t.Fatalf("write beside stalled clients: %v", err)
	}
	f, err := os.Open(d.path("lin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, 0); err != nil || buf[0] != 7 {
		t.Errorf("read beside stalled clients: %v", err)
	}
	f.Close()

	// A complete request followed by EOF is answered; a half-closed one
	// (above) was dropped without effect: lin is still there.
	if r := rawCall(t, sock, []byte("{\"op\":\"targets\"}\n")); r.Error != "" || !strings.Contains(r.Output, "linear") {
		t.Errorf("targets: %+v", r)
	}

	// Oversized: refused after MaxRequestSize bytes, without a newline.
	big := bytes.Repeat([]byte{'x'}, control.MaxRequestSize+1)
	if r := rawCall(t, sock, big); r.Errno != "EINVAL" || !strings.Contains(r.Error, "request larger than") {
		t.Errorf("oversized request: %+v", r)
	}

	// Connection bound: with control.MaxConns silent clients, the next one
	// is refused at once; control.Call waits until a slot frees.
	for _, c := range stalled {
		c.Close()
	}
	stalled = nil
	for len(stalled) < control.MaxConns {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
	}
	// The daemon registers connections as it accepts them, and drops the
	// closed ones above when it reads their end: until then some of the new
	// ones are refused (and closed) instead. So each probe that is still
	// served adds a silent client, until the daemon holds MaxConns of them
	// and refuses the probe.
	var r control.Response
	for {
		if r = rawCall(t, sock, []byte("{\"op\":\"ls\"}\n")); r.Errno != "" || len(stalled) >= 4*control.MaxConns {
			break
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
	}
	if r.Errno != "EAGAIN" || !strings.Contains(r.Error, "too many connections") {
		t.Errorf("a connection beside %d silent clients: %+v, want a refusal", len(stalled), r)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ls("while the connection bound is reached")
	}()
	time.Sleep(50 * time.Millisecond)
	for _, c := range stalled {
		c.Close()
	}
	stalled = nil
	<-done

	// Rate bound: of a burst of requests, no more are served than the
	// bucket holds plus what refills while the burst lasts.
	const burst = 3 * control.Rate
	var mu sync.Mutex
	served, refused := 0, 0
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for range burst / 8 {
				r := rawCall(t, sock, []byte("{\"op\":\"ls\"}\n"))
				mu.Lock()
				switch {
				case r.Error == "" && r.Output != "":
					served++
				case r.Errno == "EAGAIN" && strings.Contains(r.Error, "requests per second"):
					refused++
				case r.Errno == "EAGAIN" && strings.Contains(r.Error, "too many connections"):
					refused++
				default:
					t.Errorf("worker %d: %+v", w, r)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit := control.Rate + int(elapsed.Seconds()*control.Rate) + 1
	t.Logf("burst of %d requests in %v: %d served, %d refused (bound %d)", burst, elapsed, served, refused, limit)
	if served > limit {
		t.Errorf("%d requests served in %v, more than the bound of %d", served, elapsed, limit)
	}
	if served+refused != burst {
		t.Errorf("%d served + %d refused != %d", served, refused, burst)
	}
	ls("after the burst") // control.Call retries refusals
}
