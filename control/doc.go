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
