package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// GCDaemon is a galactic-gc daemon running inside a node, restartable
// after Kill or Terminate as a DaemonSet pod would be.
type GCDaemon struct {
	Node     *Node
	Interval time.Duration
	LogPath  string
	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
}

// NewGCDaemon is the node's GC daemon passing every interval; Start starts it.
func (n *Node) NewGCDaemon(interval time.Duration) *GCDaemon {
	return &GCDaemon{Node: n, Interval: interval, LogPath: filepath.Join(n.Dir, "galactic-gc.log")}
}

// Start starts the process (again).
func (g *GCDaemon) Start() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd != nil {
		return fmt.Errorf("galactic-gc on %s is already running", g.Node.Name)
	}
	cmd := exec.Command("ip", "netns", "exec", g.Node.Netns.Name, filepath.Join(g.Node.env.BinDir, "galactic-gc"),
		"--config", g.Node.ConfigPath, "--interval", g.Interval.String(), "--metrics-address", "")
	cmd.Env = append(os.Environ(), g.Node.Environ()...)
	done, err := startLogged(cmd, g.LogPath)
	if err != nil {
		return err
	}
	g.cmd, g.done = cmd, done
	return nil
}

// Pid is the daemon's process ID (ip netns exec execs galactic-gc itself),
// 0 when it is stopped.
func (g *GCDaemon) Pid() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

func (g *GCDaemon) signal(sig syscall.Signal) {
	g.mu.Lock()
	cmd, done := g.cmd, g.done
	g.cmd = nil
	g.mu.Unlock()
	if cmd != nil {
		stopProcess(cmd.Process, done, sig, 15*time.Second)
	}
}

// Kill stops the daemon with SIGKILL, as a crash would.
func (g *GCDaemon) Kill() { g.signal(syscall.SIGKILL) }

// Terminate stops it with SIGTERM, as a rollout would.
func (g *GCDaemon) Terminate() { g.signal(syscall.SIGTERM) }

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
