// Package powercut is dmfuse's powercut target (Type): a disk with a
// volatile write cache that a message switches off, losing exactly what a
// real power cut loses. It is a dmfuse extension; no kernel target has it.
//
// The package is written against stack's public target API only, as every
// target package is:
//
//   - powercut.go: the target type, its constructor (table syntax above it),
//     I/O entry points, messages (power_cut, power_on, dirty) and status;
//   - cache.go: the cached entries, their arrival list and buffers, and
//     their write-back (flushes, FUA writes, the destager that keeps the
//     cache under its bound);
//   - index.go: the striped chunk index that maps each cached byte to its
//     newest entry, for reads and for FUA writes that mask older entries.
package powercut
