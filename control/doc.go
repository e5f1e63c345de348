// Package control is the control socket of a dmfuse daemon: the wire
// protocol, the validation of requests, the server that runs them on the
// devices of a stack.Manager, the client, and where sockets live.
//
// # Protocol
//
// A client connects to the daemon's control socket (a Unix stream socket),
// writes one request, a JSON object (Request) on a single line ended by '\n',
// and reads one response, a JSON object (Response) on a single line ended by
// '\n'; then the daemon closes the connection. A request is at most
// MaxRequestSize bytes including the newline. A request that is not complete
// when the client closes its end or goes quiet for RequestTimeout (no final
// newline) is dropped without effect; a request that is malformed, too large
// or invalid gets an error response and changes nothing. Once a complete
// request has been read, it runs to its end even if the client goes away,
// except wait, which blocks until a device event and ends (EINTR) when the
// client hangs up or the server closes. The output of report is a JSON array
// of DeviceReport, for clients that format column reports themselves.
//
//	{"op":"create","name":"d1","table":"0 2048 linear ./a.img 0","dir":"/home/me"}
//	{"op":"message","name":"d1","sector":0,"args":["addbadblock","60"]}
//	{"op":"table","inactive":true}
//	-> {"output":"..."}              on success; the client prints output as it is
//	-> {"error":"d1: line 1: linear: Invalid argument count","errno":"EINVAL"}
//
// Op is one of create, load, clear, suspend, resume, remove, remove_all,
// rename, message, table, status, info, ls, targets, wait, deps, report,
// stop, supervise and about; the other fields are name, new_name, uuid
// (create, and rename's --setuuid), table, dir (absolute; relative paths in
// the table resolve against it), notable, readonly, minor, noflush,
// nolockfs, force, deferred, inactive, concise, target, event_nr, format,
// sector, args, readahead (create and resume: as dmsetup's --readahead) and
// fd.
// supervise hands the system instance the seccomp listener of a program
// `dmfuse exec` runs (descriptor fd of the client's process, which the
// daemon takes with pidfd_getfd; package control/dmexec). One table
// (ops) lists the fields each operation takes and its handler, which calls
// one stack.Manager method, with the flags as stack.Flags. stop calls the
// daemon's stop path (Server.OnStop) and answers once the daemon is sure to
// exit, or with the reason it cannot; the socket answers until the daemon
// exits. The words of a message are joined with spaces and
// split again as the kernel splits them (stack.SplitArgs: a backslash escapes
// the next character), and a response to a message that does not end in a
// newline gets one. What each operation does is stack.Manager's (see package
// stack).
//
// # Where the socket lives
//
// A daemon mounted on MOUNTPOINT listens on DefaultPath(MOUNTPOINT) unless it
// is given another path: in SocketDir (/run/dmfuse for root, else
// $XDG_RUNTIME_DIR/dmfuse, else /tmp/dmfuse-UID), the absolute mount point
// escaped as `systemd-escape --path` does (EscapePath: /tmp/my-dm gives
// tmp-my\x2ddm), then ".sock". When that path is too long for a socket address
// (107 bytes), the file name is "h-" and the first 32 hex digits of the SHA-256
// of the absolute mount point, then ".sock". Listen replaces a socket file that
// no daemon answers on (one left by a daemon that was killed) and refuses one
// that a running daemon answers on; Server.Close closes the listener, which
// removes the socket file.
//
// # Validation
//
// Request.Validate is the one check of a request's form: a known operation,
// only the fields that operation takes and those it needs, valid device
// names and uuids, UTF-8 text, an absolute working directory. The client
// (Call) runs it before it sends a request and the server (Server.Handle)
// before it runs one, so a request is checked completely before anything
// changes. What depends on the devices (a device exists, a name or uuid is
// free, a table builds, a message has words and its target takes it) is the
// stack.Manager's to check.
//
// # Access
//
// The socket file is created mode 0600 in a folder of mode 0700 (Listen), and the
// server reads each client's credentials from the kernel (SO_PEERCRED): only
// root and the daemon's own user may send commands. The server bounds the
// connections it holds open (MaxConns) and the rate it accepts them (Rate);
// a client beyond either is answered EAGAIN at once, which Call retries.
package control
