package cluster

import (
	"os/exec"
	"syscall"
)

// setChildAttrs makes the kernel kill a child process (a store or an etcd member) if
// this process dies without stopping it.
func setChildAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
