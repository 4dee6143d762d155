package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// socketDirPrefix names the folders that hold a serve's instance sockets: the prefix, the
// serve's PID, a dash, a random suffix.
const socketDirPrefix = "voxmux-sockets-"

// makeSocketDir makes this serve's socket folder, first removing those of serves that are gone
// (killed with SIGKILL, which leaves no chance to clean up).
func makeSocketDir(log *slog.Logger) (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), socketDirPrefix+"*"))
	for _, d := range old {
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), socketDirPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			if os.RemoveAll(d) == nil {
				log.Info("removed the socket folder of a serve that is gone", "dir", d, "pid", pid)
			}
		}
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", socketDirPrefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("instance socket folder: %w", err)
	}
	return dir, nil
}
