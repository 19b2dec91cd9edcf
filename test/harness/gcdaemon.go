package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// GCDaemon is a galactic-gc daemon running inside a node, restartable
// after Kill or Terminate as a DaemonSet pod would be.
type GCDaemon struct {
	Node     *Node
	Interval time.Duration
	LogPath  string
	Daemon
}

// NewGCDaemon is the node's GC daemon passing every interval; Start starts it.
func (n *Node) NewGCDaemon(interval time.Duration) *GCDaemon {
	return &GCDaemon{Node: n, Interval: interval, LogPath: filepath.Join(n.Dir, "galactic-gc.log")}
}

// Start starts the process (again).
func (g *GCDaemon) Start() error {
	cmd := exec.Command("ip", "netns", "exec", g.Node.Netns.Name, filepath.Join(g.Node.env.BinDir, "galactic-gc"),
		"--config", g.Node.ConfigPath, "--interval", g.Interval.String(), "--metrics-address", "")
	cmd.Env = append(os.Environ(), g.Node.Environ()...)
	_, err := g.start("galactic-gc on "+g.Node.Name, cmd, g.LogPath)
	return err
}

// ProcStats are what /proc says about a process: resident memory, threads
// and open file descriptors.
type ProcStats struct {
	RSSKiB, Threads, FDs int
	// PeakRSSKiB is the resident set's high-water mark.
	PeakRSSKiB int
}

// ReadProcStats reads pid's ProcStats; ok is false when it is gone.
func ReadProcStats(pid int) (s ProcStats, ok bool) {
	if pid == 0 {
		return s, false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, false
	}
	for _, line := range splitLines(string(data)) {
		var v int
		if n, _ := fmt.Sscanf(line, "VmRSS: %d kB", &v); n == 1 {
			s.RSSKiB = v
		}
		if n, _ := fmt.Sscanf(line, "VmHWM: %d kB", &v); n == 1 {
			s.PeakRSSKiB = v
		}
		if n, _ := fmt.Sscanf(line, "Threads: %d", &v); n == 1 {
			s.Threads = v
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, false
	}
	s.FDs = len(fds)
	return s, true
}
