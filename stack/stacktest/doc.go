// Package stacktest holds the test doubles shared by dmfuse's packages and a
// conformance suite that every target type runs.
//
// The doubles are an in-memory block device (MemDevice) and an Opener that resolves the device arguments of tables
// from a map, failing for a missing name as the Manager's own lookup does.
//
// The suite builds devices of a target type through a stack.Manager, over
// memory devices (Manager.Open set to an Opener) or over backing files, and
// checks what every target owes the core and the tools that read its output:
// each check of All says in its comment which device-mapper behaviour it
// pins. Cases holds, for every type dmfuse registers, the table line that
// makes it usable over memory devices and what the type does with data; a
// check that does not apply to a type is declared there, with the reason, and
// reported as skipped with that reason. A new target type needs one entry in
// Cases, and RunRegistry fails for a registered type without one. The test
// of package internal/targets runs the suite on the list of every type
// dmfuse registers:
//
//	func TestConformance(t *testing.T) {
//		reg, _ := stack.NewRegistry(targets.All()...)
//		stacktest.RunRegistry(t, reg)
//	}
package stacktest
