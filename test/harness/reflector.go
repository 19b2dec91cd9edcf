package harness

import (
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

// ReflectorAddr is where StartReflector puts galactic's reflector on the
// fabric (FRR holds 192.0.2.1, gobgpd 192.0.2.2).
var ReflectorAddr = netip.MustParseAddr("192.0.2.3")

// joinBridge connects ns to the fabric's bridge with a veth (host is the
// fabric end's name, ul0 the namespace's) and gives ns addr/24.
func (f *Fabric) joinBridge(ns *Netns, host string, addr netip.Addr) error {
	for _, s := range [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", "ul0", "netns", ns.Name},
		{"ip", "link", "set", host, "netns", f.Netns.Name},
		{"ip", "-n", f.Netns.Name, "link", "set", host, "master", "br0", "up"},
		{"ip", "-n", ns.Name, "addr", "add", addr.String() + "/24", "dev", "ul0"},
		{"ip", "-n", ns.Name, "link", "set", "ul0", "up"},
		{"ip", "-n", ns.Name, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v %s", s, err, out)
		}
	}
	return nil
}

// Reflector is galactic-router in role reflector, in a namespace of its
// own on the fabric bridge.
type Reflector struct {
	Netns   *Netns
	Addr    netip.Addr
	Config  config.File
	LogPath string
	bin     string
	conf    string
	Daemon
}

// FabricReflectorConfig is a reflector at ReflectorAddr in the fabric's
// AS that accepts every node of the fabric's /24.
func (f *Fabric) FabricReflectorConfig() config.File {
	return config.File{Role: new(config.RoleReflector), ASN: new(f.Options.ASN), Underlay: ReflectorAddr.String(),
		ClientRanges: []string{"192.0.2.0/24"}, MetricsAddress: new("127.0.0.1:9656")}
}

// StartReflector runs env's galactic-router with cfg at cfg's underlay
// (default ReflectorAddr); t's cleanup kills it.
func (f *Fabric) StartReflector(t testing.TB, env *Env, cfg config.File) *Reflector {
	t.Helper()
	r, err := f.LaunchReflector(env.BinDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// LaunchReflector is StartReflector outside a test, with the binaries in
// binDir; the caller closes it.
func (f *Fabric) LaunchReflector(binDir string, cfg config.File) (*Reflector, error) {
	addr := ReflectorAddr
	if cfg.Underlay != "" {
		addr = netip.MustParseAddr(cfg.Underlay)
	}
	ns, err := CreateNetns("r")
	if err != nil {
		return nil, err
	}
	r := &Reflector{Netns: ns, Addr: addr, Config: cfg, bin: filepath.Join(binDir, "galactic-router"),
		conf: filepath.Join(f.dir, "reflector.json"), LogPath: filepath.Join(f.dir, "reflector.log")}
	if err := f.joinBridge(r.Netns, fmt.Sprintf("fr%d", os.Getpid()%100000), addr); err != nil {
		r.Close()
		return nil, err
	}
	if err := writeRouterConfig(r.conf, cfg); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.Start(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close kills the reflector and deletes its namespace.
func (r *Reflector) Close() {
	r.Kill()
	r.Netns.Delete()
}

// RouterConfig is a node's router.json peering with this reflector
// instead of FRR.
func (r *Reflector) RouterConfig(f *Fabric, underlay netip.Addr) config.File {
	c := f.FabricRouterConfig(underlay)
	c.Peers[0].Address, c.Peers[0].ASN, c.Peers[0].Port = r.Addr.String(), r.Config.ASN, nil
	return c
}

// Start starts the process (again, after Kill).
func (r *Reflector) Start() error {
	cmd := exec.Command("ip", "netns", "exec", r.Netns.Name, r.bin, "run", "--config", r.conf)
	_, err := r.start("the reflector", cmd, r.LogPath)
	return err
}

// CPUTime is the CPU time (user and system) the running reflector has
// used.
func (r *Reflector) CPUTime() (time.Duration, error) {
	pid := r.Pid()
	if pid == 0 {
		return 0, fmt.Errorf("the reflector is not running")
	}
	return ProcessCPUTime(pid)
}

// Log is the reflector's log so far.
func (r *Reflector) Log() string {
	b, _ := os.ReadFile(r.LogPath)
	return string(b)
}

// Metric is one metric line's value (name with its labels, as printed).
func (r *Reflector) Metric(name string) (float64, error) {
	body, err := r.Netns.Get("http://" + metricsAddress(r.Config) + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, body)
	}
	return metricValue(body, name)
}

// metricValue finds one metric line in a Prometheus text page.
func metricValue(body, name string) (float64, error) {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+" ") {
			var v float64
			_, err := fmt.Sscan(strings.TrimPrefix(line, name+" "), &v)
			return v, err
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}
