package dmexec

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// EnvMarker is set in the environment of the programs `dmfuse exec` runs
// (to the pid of the process that installed the filter): a nested `dmfuse
// exec` runs its command in the outer one's namespace and filter, and the
// dmsetup drop-in does not start a daemon under the filter.
const EnvMarker = "DMFUSE_EXEC"

// Device is a device that exists when a command starts: it gets a node in
// the command's mapper folder.
type Device struct {
	Name         string
	Major, Minor uint32
}

// Child is the set-up `dmfuse exec` makes in the process that becomes the
// command, which runs in a mount namespace of its own.
type Child struct {
	// Argv is the command.
	Argv []string
	// Major is the daemon's major, which /proc/devices names
	// device-mapper.
	Major uint32
	// DevDir is $DM_DEV_DIR, else /dev: its mapper folder holds the control
	// node and the device nodes.
	DevDir string
	// Devices are the devices that exist now.
	Devices []Device
	// Private is a folder on the host (made by the caller) over which the
	// namespace mounts a tmpfs of its own for the files it shows instead of
	// the host's (its /proc/devices).
	Private string
	// Sys, when set, is the daemon's view of sysfs with device-mapper's
	// entries (its dev/block and block folders), mounted over /sys's.
	Sys string
	// Detach are mounts of the daemon's that the namespace lets go of, so
	// that it does not keep the daemon's FUSE connections alive once the
	// daemon unmounts them (its device files' mount).
	Detach []string
	// Supervise asks the daemon to take over the filter's listener,
	// descriptor fd of this process.
	Supervise func(fd int) error `json:"-"`
}

// Run sets up the mount namespace the caller is already in (unshared when
// it was started), installs the filter and executes the command; it returns
// only on failure.
func (c *Child) Run() error {
	if len(c.Argv) == 0 {
		return errors.New("no command")
	}
	path, err := exec.LookPath(c.Argv[0])
	if err != nil {
		return err
	}
	if err := c.setupMounts(); err != nil {
		return err
	}
	env := os.Environ()
	if os.Getenv("DM_DISABLE_UDEV") == "" {
		// No udev runs in the namespace: libdevmapper makes the nodes and
		// lvm its links itself.
		env = append(env, "DM_DISABLE_UDEV=1")
	}
	env = append(env, EnvMarker+"="+strconv.Itoa(os.Getpid()))
	// The filter is the thread's; the command runs on this thread.
	runtime.LockOSThread()
	fd, err := installFilter()
	if err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	// Until the daemon holds the listener, a trapped call here would wait
	// for ever: the request goes over a socket, which is not trapped.
	if err := c.Supervise(fd); err != nil {
		return err
	}
	unix.Close(fd)
	return unix.Exec(path, c.Argv, env)
}

// setupMounts makes the namespace's mounts private from the host's (mounts
// of the host still show inside), shows a /proc/devices that names the
// daemon's major device-mapper, a mapper folder of the namespace's own with
// the control node and a node per device, and the daemon's sysfs folders.
func (c *Child) setupMounts() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	if err := unix.Mount("tmpfs", c.Private, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", c.Private, err)
	}
	devices, err := os.ReadFile("/proc/devices")
	if err != nil {
		return err
	}
	p := filepath.Join(c.Private, "devices")
	if err := os.WriteFile(p, []byte(WithDeviceMapper(string(devices), c.Major)), 0o444); err != nil {
		return err
	}
	if err := unix.Mount(p, "/proc/devices", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("/proc/devices: %w", err)
	}
	if c.DevDir == "/dev" || c.DevDir == "" {
		mapper := "/dev/mapper"
		if err := os.MkdirAll(mapper, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", mapper, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", mapper, err)
		}
		if err := unix.Mknod(filepath.Join(mapper, "control"), unix.S_IFCHR|0o600, int(unix.Mkdev(controlMajor, controlMinor))); err != nil {
			return err
		}
		for _, d := range c.Devices {
			if err := unix.Mknod(filepath.Join(mapper, d.Name), unix.S_IFBLK|0o660, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
				return err
			}
		}
	}
	if c.Sys != "" {
		for _, dir := range []string{"dev/block", "block"} {
			if err := unix.Mount(filepath.Join(c.Sys, dir), filepath.Join("/sys", dir), "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("/sys/%s: %w", dir, err)
			}
		}
	}
	for _, m := range c.Detach {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	return nil
}

// WithDeviceMapper returns the text of /proc/devices with a line that names
// block major major device-mapper, in its place in the block devices'
// list (sorted by number), as the kernel's dm-mod adds it.
func WithDeviceMapper(devices string, major uint32) string {
	head, block, ok := strings.Cut(devices, "Block devices:\n")
	if !ok {
		return devices + "\nBlock devices:\n" + fmt.Sprintf("%3d device-mapper\n", major)
	}
	line := fmt.Sprintf("%3d device-mapper", major)
	lines := strings.Split(strings.TrimSuffix(block, "\n"), "\n")
	out := make([]string, 0, len(lines)+1)
	done := false
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 2 {
			if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				if uint32(n) == major && f[1] == "device-mapper" {
					done = true
				}
				if !done && uint32(n) > major {
					out = append(out, line)
					done = true
				}
			}
		}
		out = append(out, l)
	}
	if !done {
		out = append(out, line)
	}
	return head + "Block devices:\n" + strings.Join(out, "\n") + "\n"
}
