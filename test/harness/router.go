package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/config"
)

// FabricRouterConfig peers a node at underlay with the fabric's route
// reflector (FRR), with BGP timers short enough for tests: a node's
// router.json, galactic-router's own config type.
func (f *Fabric) FabricRouterConfig(underlay netip.Addr) config.File {
	o := f.Options
	return config.File{
		ASN: new(o.NodeASN), Underlay: underlay.String(), ListenPort: new(int64(-1)), RouteTargetASN: new(int64(FabricASN)),
		Peers: []config.PeerFile{{Address: f.RR.String(), ASN: new(o.ASN), Port: new(int64(o.Port)),
			HoldSeconds: new(int64(9)), KeepaliveSeconds: new(int64(3)), Password: o.Password}},
		MetricsAddress: new("127.0.0.1:9655"),
	}
}

// Peer is a peers entry for the BGP speaker at addr in the fabric's AS,
// with the fabric's timers.
func Peer(addr netip.Addr) config.PeerFile {
	return config.PeerFile{Address: addr.String(), ASN: new(int64(FabricASN)), HoldSeconds: new(int64(9)), KeepaliveSeconds: new(int64(3))}
}

// writeRouterConfig writes cfg as JSON, leaving out the keys it does not
// set, as a person would write the file.
func writeRouterConfig(path string, cfg config.File) error {
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	var keys any
	if err := json.Unmarshal(data, &keys); err != nil {
		return err
	}
	if data, err = json.MarshalIndent(dropUnset(keys), "", "  "); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// dropUnset removes null and empty-string values from JSON objects.
func dropUnset(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if x == nil || x == "" {
				delete(v, k)
			} else {
				v[k] = dropUnset(x)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = dropUnset(x)
		}
	}
	return v
}

// Router is a galactic-router process running inside a node.
type Router struct {
	Node   *Node
	Config config.File
	// ConfigPath is the router.json the process reads.
	ConfigPath string
	LogPath    string
	Args       []string
	// MemoryLimit, when set, starts the router in a memory cgroup of that
	// many bytes, as a container's limit would.
	MemoryLimit int64
	Daemon
}

// RouterConfigPath is where a node's router.json goes.
func (n *Node) RouterConfigPath() string { return filepath.Join(n.Dir, "router.json") }

// StartRouter writes cfg as the node's router.json and starts
// galactic-router in the node; t's cleanup kills it.
func (n *Node) StartRouter(t testing.TB, cfg config.File, args ...string) *Router {
	t.Helper()
	r, err := n.LaunchRouter(cfg, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Kill() })
	return r
}

// LaunchRouter is StartRouter outside a test; the caller kills it.
func (n *Node) LaunchRouter(cfg config.File, args ...string) (*Router, error) {
	r := n.NewRouter(n.RouterConfigPath(), args...)
	r.Config = cfg
	if err := writeRouterConfig(r.ConfigPath, cfg); err != nil {
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
	p, err := r.start("galactic-router on "+r.Node.Name, cmd, r.LogPath)
	if err != nil {
		if cgroup != "" {
			os.Remove(cgroup)
		}
		return err
	}
	if cgroup != "" {
		go func() { <-p.Done(); os.Remove(cgroup) }()
	}
	return nil
}

// Log returns the router's log so far.
func (r *Router) Log() string {
	b, _ := os.ReadFile(r.LogPath)
	return string(b)
}

// Get fetches path from the router's metrics address inside the node.
func (r *Router) Get(path string) (string, error) {
	return r.Node.Get("http://" + metricsAddress(r.Config) + path)
}

// metricsAddress is where a router with cfg serves its metrics.
func metricsAddress(cfg config.File) string {
	if cfg.MetricsAddress == nil {
		return config.DefaultMetricsAddress
	}
	return *cfg.MetricsAddress
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
