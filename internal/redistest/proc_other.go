//go:build !linux

package redistest

import "os/exec"

// setProcAttr has nothing to set outside Linux: servers are stopped by t.Cleanup or Main.
func setProcAttr(*exec.Cmd) {}
