package stack

import (
	"path/filepath"
	"testing"

	"github.com/dmfuse/dmfuse/internal/golden"
)

// checkGolden compares got with testdata/<name> (golden.Check).
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	golden.Check(t, filepath.Join("testdata", name), []byte(got))
}
