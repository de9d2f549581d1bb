//go:build unix && !linux

package clustertest

import (
	"errors"
	"syscall"
)

// sysProcAttr puts a member in a process group of its own.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// procState is not available here: Stop and Cont do not wait for the
// state change.
func procState(int) (byte, error) { return 0, errors.ErrUnsupported }
