package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RouterConfig is the router.json a test writes for a node.
type RouterConfig struct {
	ASN                 int64             `json:"asn"`
	RouterID            string            `json:"routerID,omitempty"`
	Underlay            string            `json:"underlay"`
	ListenPort          int64             `json:"listenPort,omitempty"`
	RouteTargetASN      int64             `json:"routeTargetASN,omitempty"`
	GracefulRestart     map[string]any    `json:"gracefulRestart,omitempty"`
	WithdrawHoldSeconds *int64            `json:"withdrawHoldSeconds,omitempty"`
	StaleRoutesSeconds  *int64            `json:"staleRoutesSeconds,omitempty"`
	Peers               []RouterPeer      `json:"peers"`
	MetricsAddress      string            `json:"metricsAddress,omitempty"`
	Extra               map[string]string `json:"-"`
}

// RouterPeer is one peers entry.
type RouterPeer struct {
	Address          string `json:"address"`
	ASN              int64  `json:"asn"`
	Port             int64  `json:"port,omitempty"`
	HoldSeconds      int64  `json:"holdSeconds,omitempty"`
	KeepaliveSeconds int64  `json:"keepaliveSeconds,omitempty"`
	Password         string `json:"password,omitempty"`
}

// FabricRouterConfig peers a node at underlay with the fabric's route
// reflector, with timers short enough for tests.
func (f *Fabric) FabricRouterConfig(underlay netip.Addr) RouterConfig {
	o := f.Options
	return RouterConfig{
		ASN: o.NodeASN, Underlay: underlay.String(), ListenPort: -1, RouteTargetASN: FabricASN,
		Peers: []RouterPeer{{Address: f.RR.String(), ASN: o.ASN, Port: int64(o.Port), HoldSeconds: 9, KeepaliveSeconds: 3,
			Password: o.Password}},
		MetricsAddress: "127.0.0.1:9655",
	}
}

// Router is a galactic-router process running inside a node.
type Router struct {
	Node   *Node
	Config RouterConfig
	// ConfigPath is the router.json the process reads.
	ConfigPath string
	LogPath    string
	Args       []string
	// MemoryLimit, when set, starts the router in a memory cgroup of that
	// many bytes, as a container's limit would.
	MemoryLimit int64
	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{}
}

// RouterConfigPath is where a node's router.json goes.
func (n *Node) RouterConfigPath() string { return filepath.Join(n.Dir, "router.json") }

// StartRouter writes cfg as the node's router.json and starts
// galactic-router in the node; t's cleanup kills it.
func (n *Node) StartRouter(t testing.TB, cfg RouterConfig, args ...string) *Router {
	t.Helper()
	r, err := n.LaunchRouter(cfg, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Kill() })
	return r
}

// LaunchRouter is StartRouter outside a test; the caller kills it.
func (n *Node) LaunchRouter(cfg RouterConfig, args ...string) (*Router, error) {
	r := n.NewRouter(n.RouterConfigPath(), args...)
	r.Config = cfg
	data, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(r.ConfigPath, data, 0o644); err != nil {
		return nil, err
	}
	if err := r.Start(); err != nil {
		return nil, err
	}
	return r, nil
}

// NewRouter is a router of the node reading configPath (written by the
// caller, for example by galactic-installer); Start starts it. Config is
// left empty, so Get and Metric need MetricsAddress set.
func (n *Node) NewRouter(configPath string, args ...string) *Router {
	return &Router{Node: n, ConfigPath: configPath, LogPath: filepath.Join(n.Dir, "router.log"), Args: args, MemoryLimit: n.RouterMemoryLimit}
}

// Start starts the process (again).
func (r *Router) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return fmt.Errorf("router on %s is already running", r.Node.Name)
	}
	args := append([]string{"netns", "exec", r.Node.Netns.Name, filepath.Join(r.Node.env.BinDir, "galactic-router"), "run", "--config", r.ConfigPath}, r.Args...)
	cmd := exec.Command("ip", args...)
	cgroup := ""
	if r.MemoryLimit > 0 {
		var err error
		if cgroup, err = memoryCgroup("galactic-router-"+r.Node.Name, r.MemoryLimit); err != nil {
			return err
		}
		// The shell joins the cgroup and execs ip, which execs the router:
		// one process, limited from its first allocation.
		cmd = exec.Command("sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cgroup, "ip"}, args...)...)
	}
	cmd.Env = append(os.Environ(), r.Node.Environ()...)
	if cgroup != "" {
		// ip netns exec mounts a sysfs of the namespace over /sys, which
		// hides /sys/fs/cgroup from the router: it is told the heap limit
		// it would take from its container's limit (75% of it).
		cmd.Env = append(cmd.Env, fmt.Sprintf("GOMEMLIMIT=%d", r.MemoryLimit*75/100))
	}
	done, err := startLogged(cmd, r.LogPath)
	if err != nil {
		return err
	}
	if cgroup != "" {
		go func() { <-done; os.Remove(cgroup) }()
	}
	r.cmd, r.done = cmd, done
	return nil
}

// Pid is the running router's process ID (ip netns exec execs the
// router itself), 0 when it is stopped.
func (r *Router) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// signal sends sig and waits for the process to exit.
func (r *Router) signal(sig syscall.Signal) {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	stopProcess(cmd.Process, done, sig, 15*time.Second)
}

// Kill stops the router with SIGKILL, as a crash would.
func (r *Router) Kill() { r.signal(syscall.SIGKILL) }

// Terminate stops it with SIGTERM, as an upgrade would.
func (r *Router) Terminate() { r.signal(syscall.SIGTERM) }

// Running reports whether the process has not exited.
func (r *Router) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Log returns the router's log so far.
func (r *Router) Log() string {
	b, _ := os.ReadFile(r.LogPath)
	return string(b)
}

// Get fetches path from the router's metrics address inside the node.
func (r *Router) Get(path string) (string, error) {
	return r.Node.Get("http://" + r.Config.MetricsAddress + path)
}

// Metric returns the value of one metric line (name with its labels, as
// printed) from /metrics.
func (r *Router) Metric(name string) (float64, error) {
	body, err := r.Get("/metrics")
	if err != nil {
		return 0, err
	}
	return metricValue(body, name)
}

// LogCount is how many lines of the router's log so far contain s.
func (r *Router) LogCount(s string) int { return strings.Count(r.Log(), s) }

// Drain runs `galactic-router drain` in the node.
func (r *Router) Drain() (string, error) {
	cmd := exec.Command("ip", "netns", "exec", r.Node.Netns.Name, filepath.Join(r.Node.env.BinDir, "galactic-router"), "drain", "--config", r.ConfigPath)
	cmd.Env = append(os.Environ(), r.Node.Environ()...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// CPUTime is the CPU time (user and system) the running router has used.
func (r *Router) CPUTime() (time.Duration, error) {
	pid := r.Pid()
	if pid == 0 {
		return 0, fmt.Errorf("router on %s is not running", r.Node.Name)
	}
	return ProcessCPUTime(pid)
}

// ProcessCPUTime is the CPU time (user and system) process pid has used.
func ProcessCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	var utime, stime int64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	// USER_HZ is 100 on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
