// Package stacktest holds the test doubles shared by dmfuse's packages: an
// in-memory block device (MemDevice, internal/memdev's), an Opener that
// resolves the device arguments of tables from a map, failing for a missing
// name as the Manager's own lookup does, a fault-injecting device
// (FaultDevice: rules that fail, hold and count the I/O that reaches the
// device below), and CheckTables, the golden check of table and status
// lines.
//
// The conformance suite that every target type runs is in
// targets/conformance, beside the list of types it walks.
package stacktest
