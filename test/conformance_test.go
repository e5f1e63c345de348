package test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dmfuse/dmfuse/fs"
	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/targets"
	"github.com/dmfuse/dmfuse/targets/conformance"
)

// TestConformanceThroughFUSE runs the conformance suite (targets/conformance) on
// every target type dmfuse registers with the I/O of every check going
// through the device's file on a FUSE mount of the fs layer: pread, pwrite
// and fsync as users make them, on each transport, /dev/fuse and, where the
// kernel offers it, io_uring (DMFUSE_TRANSPORT, when set, picks one).
func TestConformanceThroughFUSE(t *testing.T) {
	requireFUSE(t)
	transports := []string{fs.TransportDev, fs.TransportURing}
	if tr := os.Getenv("DMFUSE_TRANSPORT"); tr != "" {
		transports = []string{tr}
	}
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			if tr == fs.TransportURing {
				requireURing(t)
			}
			conformance.Suite{Mount: func(t testing.TB, m *stack.Manager) string {
				mnt := filepath.Join(t.TempDir(), "mnt")
				if err := os.Mkdir(mnt, 0o755); err != nil {
					t.Fatal(err)
				}
				srv, err := fs.Mount(mnt, m, fs.Options{Transport: tr})
				if err != nil {
					t.Fatalf("mount over %s: %v", tr, err)
				}
				// Registered after the manager's RemoveAll, so it runs
				// before: the mount goes first, then the devices.
				t.Cleanup(func() {
					if err := srv.Unmount(); err != nil {
						unix.Unmount(mnt, unix.MNT_DETACH)
					}
					srv.Wait()
				})
				return mnt
			}}.RunAll(t, targets.All())
		})
	}
}
