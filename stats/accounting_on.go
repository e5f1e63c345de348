//go:build !noaccounting

package stats

// Accounting is true in every normal build. Builds with the noaccounting tag
// turn every counter update into a no-op; they exist only to measure what
// accounting costs (go run ./test/bench/acct).
const Accounting = true
