// Package benchkit holds what dmfuse's benchmark commands share: mount
// helpers, backing files, the environment a result was measured in, and
// medians.
package benchkit

import (
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Unmount unmounts dir, lazily if a plain unmount fails.
func Unmount(dir string) {
	if err := unix.Unmount(dir, 0); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// IsMount reports whether dir is a mount point of this mount namespace.
func IsMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// Fill writes size bytes of pseudo-random data (the same every time) to a new
// file, so that reads are of real data rather than of a sparse hole.
func Fill(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(buf); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			buf[i+k] = byte(v >> (8 * k))
		}
	}
	for w := int64(0); w < size; w += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-w)]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// ModuleDir returns the root of the dmfuse module.
func ModuleDir() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run from inside the dmfuse module")
	}
	return filepath.Dir(mod), nil
}

// Kernel returns the running kernel's release.
func Kernel() string {
	var u unix.Utsname
	unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}

// FioVersion returns fio's version, without the "fio-" prefix.
func FioVersion() string {
	out, _ := exec.Command("fio", "--version").Output()
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "fio-")
}

// Median returns the median of v (0 for none); v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
