package dmsetup

// The udev cookie verbs. dmfuse makes /dev/mapper links itself, so cookies
// are accepted and reported as dmsetup does with no udev running.

import (
	"fmt"
	"strconv"
)

func (r *run) udevCookies(_ []string, _ bool) bool {
	r.outf("Cookie       Semid      Value      Last semop time           Last change time\n")
	return true
}

func (r *run) udevCompleteAll(args []string, _ bool) bool {
	age := 0
	if len(args) == 1 {
		n, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil {
			r.errf("Failed to read age_in_minutes parameter.")
			return false
		}
		age = int(n)
	}
	if !r.o.on("yes") {
		older := ""
		if age > 0 {
			older = fmt.Sprintf("older than %d minutes ", age)
		}
		r.errf("WARNING: This operation will destroy all semaphores %swith keys that have a prefix 3405 (0xd4d).", older)
		if !r.yes("Do you really want to continue? [y/n]: ") {
			r.outf("Semaphores with keys prefixed by 3405 (0xd4d) NOT destroyed.\n")
			return true
		}
	}
	r.outf("0 semaphores with keys prefixed by 3405 (0xd4d) destroyed. 0 skipped.\n")
	return true
}

// yes asks prompt until the answer line is y or n, as dmsetup's
// _yes_no_prompt; end of input is no.
func (r *run) yes(prompt string) bool {
	buf := make([]byte, 1)
	ans := byte(0)
	r.outf("%s", prompt)
	for {
		n, _ := r.env.Stdin.Read(buf)
		if n == 0 {
			r.outf("\n")
			return false
		}
		c := buf[0] | 0x20
		if c == 'y' || c == 'n' {
			ans = c
		}
		if buf[0] == '\n' {
			if ans != 0 {
				return ans == 'y'
			}
			r.outf("%s", prompt)
		}
	}
}

func (r *run) udevComplete(args []string, _ bool) bool {
	if _, ok := cookieValue(args[0]); !ok {
		r.errf("Incorrect cookie value.")
		return false
	}
	return true
}

func (r *run) udevFlags(args []string, _ bool) bool {
	cookie, ok := cookieValue(args[0])
	if !ok {
		r.errf("Incorrect cookie value.")
		return false
	}
	names := []string{"DISABLE_DM_RULES", "DISABLE_SUBSYSTEM_RULES", "DISABLE_DISK_RULES", "DISABLE_OTHER_RULES",
		"LOW_PRIORITY", "DISABLE_LIBRARY_FALLBACK", "PRIMARY_SOURCE"}
	flags := cookie >> 16
	for i := 0; i < 16; i++ {
		if flags&(1<<i) == 0 {
			continue
		}
		switch {
		case i < 8 && i < len(names):
			r.outf("DM_UDEV_%s_FLAG='1'\n", names[i])
		case i < 8:
			r.outf("DM_UDEV_FLAG%d='1'\n", i)
		default:
			r.outf("DM_SUBSYSTEM_UDEV_FLAG%d='1'\n", i-8)
		}
	}
	return true
}

func (r *run) udevCreateCookie(_ []string, _ bool) bool { return true }

func (r *run) udevReleaseCookie(args []string, _ bool) bool {
	c := first(args)
	if c == "" {
		c = r.env.Getenv("DM_UDEV_COOKIE")
	}
	if c == "" {
		r.errf("No udev transaction cookie given.")
		return false
	}
	if _, ok := cookieValue(c); !ok {
		r.errf("Incorrect cookie value.")
		return false
	}
	return true
}
