package clustertest

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// sysProcAttr puts a member in a process group of its own (so a signal
// reaches whatever it starts) and has the kernel kill it if the thread
// that started it dies: a test binary that exits without its cleanups
// (a panic in a goroutine, a timeout) leaves no lockd behind. (The signal
// follows the starting OS thread, not the process: Go ends a thread only
// when a goroutine locked to it exits, which nothing in lockd's tests does.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// procState returns the state letter of /proc/<pid>/stat: 'T' stopped,
// 'R', 'S', 'D' running or sleeping, 'Z' a zombie.
func procState(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// pid (comm) S ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, errors.New("clustertest: unreadable /proc/" + strconv.Itoa(pid) + "/stat")
	}
	return b[i+2], nil
}
