package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill redis-server when the test binary dies, so that a crashed or
// interrupted test run leaves no servers behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
