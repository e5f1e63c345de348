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
// request has been read, it runs to its end even if the client goes away.
// Requests are checked completely (operation, fields allowed for it, names,
// UTF-8) before anything changes.
//
// # Access
//
// The socket file is created mode 0600 in a folder of mode 0700 (Listen), and the
// server reads each client's credentials from the kernel (SO_PEERCRED): only
// root and the daemon's own user may send commands. The server bounds the
// connections it holds open (MaxConns) and the rate it accepts them (Rate);
// a client beyond either is answered EAGAIN at once, which Call retries.
package control
