package harness

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/galactic-cni/galactic/pkg/settings"
)

var seq atomic.Int64

// uniqueName makes a netns name that cannot collide with another test run.
func uniqueName(kind string) string {
	return fmt.Sprintf("gx%s%d-%d", kind, os.Getpid()%100000, seq.Add(1))
}

// Netns is a named network namespace (`ip netns add`), so its path is
// /var/run/netns/<Name> and `ip netns exec` reaches it.
type Netns struct {
	Name string
	Path string
}

// NewNetns creates a network namespace with loopback up; t's cleanup
// deletes it.
func NewNetns(t testing.TB, kind string) *Netns {
	t.Helper()
	n, err := CreateNetns(kind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Delete() })
	return n
}

// CreateNetns creates a network namespace with loopback up.
func CreateNetns(kind string) (*Netns, error) {
	name := uniqueName(kind)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, out)
	}
	n := &Netns{Name: name, Path: "/var/run/netns/" + name}
	track("netns "+name, "network namespace "+name, n.Delete)
	if out, err := n.Run("ip", "link", "set", "lo", "up"); err != nil {
		n.Delete()
		return nil, fmt.Errorf("lo up in %s: %v: %s", name, err, out)
	}
	return n, nil
}

// Delete removes the namespace; deleting one that is gone is not an error.
func (n *Netns) Delete() {
	untrack("netns " + n.Name)
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
	// cnitool keeps each ADD's result in libcni's cache until the DEL: a
	// container that goes without one would leave it there.
	cached, _ := filepath.Glob(filepath.Join(cniCacheDir, "results", "*-"+ContainerID(n.Path)+"-*"))
	for _, f := range cached {
		_ = os.Remove(f)
	}
}

// cniCacheDir is where cnitool's libcni keeps results (its default).
const cniCacheDir = "/var/lib/cni"

// Run runs a command inside the namespace and returns its combined output.
func (n *Netns) Run(name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...).CombinedOutput()
	return string(out), err
}

// Node is a "node": a network namespace with its own node settings, state
// dir and CNI config dir, reaching the API server over its own loopback.
type Node struct {
	*Netns
	// Name is the Kubernetes node name.
	Name string
	// Dir is the node's root: node.json, kubeconfig, state/, net.d/, logs.
	Dir        string
	ConfigPath string
	Settings   settings.Node
	// CNIPath is where cnitool finds the plugins: the freshly built
	// binaries unless an installer staged them elsewhere.
	CNIPath string
	// RouterMemoryLimit, when set, is the memory limit of the routers the
	// node starts (Router.MemoryLimit).
	RouterMemoryLimit int64
	env               *Env
	fwd               *Forwarder
}

// NewNode creates a node called name with the API server reachable.
func (e *Env) NewNode(t testing.TB, name string) *Node {
	t.Helper()
	dir, err := MkdirTemp("galactic-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveDir(dir) })
	nn := NewNetns(t, "n")
	n, err := e.newNode(name, dir, nn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.fwd.Close)
	return n
}

// CreateNode creates a node outside a test: a new netns and the node's
// files under dir. Close removes the netns and stops the forwarder.
func (e *Env) CreateNode(name, dir string) (*Node, error) {
	nn, err := CreateNetns("n")
	if err != nil {
		return nil, err
	}
	n, err := e.newNode(name, dir, nn)
	if err != nil {
		nn.Delete()
		return nil, err
	}
	return n, nil
}

// Close stops the node's forwarder and deletes its namespace.
func (n *Node) Close() {
	n.fwd.Close()
	n.Netns.Delete()
}

func (e *Env) newNode(name, dir string, nn *Netns) (*Node, error) {
	n := &Node{Netns: nn, Name: name, Dir: dir, CNIPath: e.BinDir, env: e}
	n.Settings = settings.Node{
		NodeName:   name,
		Kubeconfig: filepath.Join(dir, "kubeconfig"),
		Namespace:  Namespace,
		StateDir:   filepath.Join(dir, "state"),
		LogFile:    filepath.Join(dir, "galactic.log"),
	}
	n.ConfigPath = filepath.Join(dir, "node.json")
	if err := os.MkdirAll(filepath.Join(dir, "net.d"), 0o755); err != nil {
		return nil, err
	}
	data, _ := json.MarshalIndent(n.Settings, "", "  ")
	if err := os.WriteFile(n.ConfigPath, data, 0o644); err != nil {
		return nil, err
	}
	// The node's own credential, as galactic-installer writes it on a
	// cluster: a galactic-node token bound to this node, under the
	// per-node admission policy.
	if err := e.writeNodeKubeconfig(context.Background(), n.Settings.Kubeconfig, name); err != nil {
		return nil, err
	}
	fwd, err := NewForwarder(nn.Path, e.CP.Port)
	if err != nil {
		return nil, err
	}
	n.fwd = fwd
	return n, nil
}

// SetAPIReachable cuts or restores the node's path to the API server: a
// cut node's connections are refused, as with an API server that is down.
func (n *Node) SetAPIReachable(reachable bool) error {
	if reachable {
		return n.fwd.Resume()
	}
	n.fwd.Pause()
	return nil
}

// Environ is what a galactic binary on this node sees: the node config path.
func (n *Node) Environ() []string {
	return []string{settings.EnvConfig + "=" + n.ConfigPath}
}

// WriteConflist stores a network config list in the node's net.d.
func (n *Node) WriteConflist(t testing.TB, conf any) {
	t.Helper()
	if err := n.WriteConflistFile(conf); err != nil {
		t.Fatal(err)
	}
}

// WriteConflistFile is WriteConflist for programs outside tests.
func (n *Node) WriteConflistFile(conf any) error {
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	var head struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(data, &head)
	if head.Name == "" {
		return fmt.Errorf("conflist has no name")
	}
	return os.WriteFile(filepath.Join(n.Dir, "net.d", head.Name+".conflist"), data, 0o644)
}

// CNITool runs the real cnitool inside the node: verb is add, del, check,
// status or gc; ifName is CNI_IFNAME. It returns stdout and an error
// carrying stderr.
func (n *Node) CNITool(verb, network string, container *Netns, ifName string, extraEnv ...string) (string, error) {
	cmd := n.CNIToolCommand(verb, network, container, ifName, extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("cnitool %s %s: %v: %s", verb, network, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// CNIToolCommand is the command CNITool runs, not started, for a caller
// that needs the process (to kill a verb half-way, say).
func (n *Node) CNIToolCommand(verb, network string, container *Netns, ifName string, extraEnv ...string) *exec.Cmd {
	netnsPath := ""
	if container != nil {
		netnsPath = container.Path
	}
	args := []string{"netns", "exec", n.Netns.Name, filepath.Join(n.env.BinDir, "cnitool"), verb, network, netnsPath}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(),
		"CNI_PATH="+n.CNIPath,
		"NETCONFPATH="+filepath.Join(n.Dir, "net.d"),
		"CNI_IFNAME="+ifName,
	)
	cmd.Env = append(append(cmd.Env, n.Environ()...), extraEnv...)
	return cmd
}

// ContainerID is the container ID cnitool derives from a netns path.
func ContainerID(netnsPath string) string {
	s := sha512.Sum512([]byte(netnsPath))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// NewContainer creates a container network namespace.
func NewContainer(t testing.TB) *Netns { return NewNetns(t, "c") }

// LibCNI runs the node's network config list through libcni (what cnitool
// and container runtimes use) inside the node, returning typed errors so
// tests can check CNI error codes. containerID defaults to cnitool's.
type LibCNI struct {
	Node    *Node
	Network string
}

func (l LibCNI) setup() (*libcni.CNIConfig, *libcni.NetworkConfigList, error) {
	list, err := libcni.LoadNetworkConf(filepath.Join(l.Node.Dir, "net.d"), l.Network)
	if err != nil {
		return nil, nil, err
	}
	exec := &nodeExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, env: l.Node.Environ()}
	return libcni.NewCNIConfigWithCacheDir([]string{l.Node.CNIPath}, filepath.Join(l.Node.Dir, "cni-cache"), exec), list, nil
}

// RuntimeConf is the runtime config for a container netns and interface.
func RuntimeConf(container *Netns, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: ContainerID(container.Path), NetNS: container.Path, IfName: ifName}
}

// Add runs ADD for the whole chain.
func (l LibCNI) Add(ctx context.Context, rt *libcni.RuntimeConf) (res types.Result, err error) {
	cfg, list, err := l.setup()
	if err != nil {
		return nil, err
	}
	err = l.Node.Do(func() error { res, err = cfg.AddNetworkList(ctx, list, rt); return err })
	return res, err
}

// Del runs DEL for the whole chain.
func (l LibCNI) Del(ctx context.Context, rt *libcni.RuntimeConf) error {
	cfg, list, err := l.setup()
	if err != nil {
		return err
	}
	return l.Node.Do(func() error { return cfg.DelNetworkList(ctx, list, rt) })
}

// Check runs CHECK for the whole chain.
func (l LibCNI) Check(ctx context.Context, rt *libcni.RuntimeConf) error {
	cfg, list, err := l.setup()
	if err != nil {
		return err
	}
	return l.Node.Do(func() error { return cfg.CheckNetworkList(ctx, list, rt) })
}

// Status runs STATUS for the whole chain.
func (l LibCNI) Status(ctx context.Context) error {
	cfg, list, err := l.setup()
	if err != nil {
		return err
	}
	return l.Node.Do(func() error { return cfg.GetStatusNetworkList(ctx, list) })
}

// GC runs GC for the whole chain with the given valid attachments.
func (l LibCNI) GC(ctx context.Context, valid ...types.GCAttachment) error {
	cfg, list, err := l.setup()
	if err != nil {
		return err
	}
	return l.Node.Do(func() error { return cfg.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: valid}) })
}

// Do runs f on an OS thread inside the namespace; processes f starts
// are in the node too.
func (n *Netns) Do(f func() error) error {
	return ns.WithNetNSPath(n.Path, func(ns.NetNS) error { return f() })
}

// Get fetches url from inside the namespace: the connection's socket is
// made there, the rest runs here, so polling a daemon's metrics spawns no
// process. A status other than 200 is an error.
func (n *Netns) Get(url string) (string, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := n.Do(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// nodeExec runs plugins with the node's environment added.
type nodeExec struct {
	*invoke.RawExec
	version.PluginDecoder
	env []string
}

func (e *nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	return e.RawExec.ExecPlugin(ctx, pluginPath, stdinData, append(environ, e.env...))
}

// Forwarder accepts connections on 127.0.0.1:<port> inside a netns and
// relays them to 127.0.0.1:<port> in the test's own namespace: a listening
// socket keeps the namespace it was created in.
type Forwarder struct {
	path string
	port int
	// listen is the address inside the namespace; default 127.0.0.1:port.
	listen string
	mu     sync.Mutex
	l      net.Listener
	conns  map[net.Conn]struct{}
}

// NewForwarder starts relaying from the namespace at path to port.
func NewForwarder(path string, port int) (*Forwarder, error) {
	f := &Forwarder{path: path, port: port, conns: map[net.Conn]struct{}{}}
	return f, f.Resume()
}

// Resume listens again after Pause; a no-op while listening.
func (f *Forwarder) Resume() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.l != nil {
		return nil
	}
	err := ns.WithNetNSPath(f.path, func(ns.NetNS) error {
		var err error
		addr := f.listen
		if addr == "" {
			addr = "127.0.0.1:" + strconv.Itoa(f.port)
		}
		f.l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return fmt.Errorf("forwarder in %s: %w", f.path, err)
	}
	go f.serve(f.l)
	return nil
}

func (f *Forwarder) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		go f.relay(c)
	}
}

func (f *Forwarder) relay(c net.Conn) {
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
	}()
	up, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(f.port))
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// Pause stops listening and drops open connections, so the node's clients
// get "connection refused" as from an API server that is down.
func (f *Forwarder) Pause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.l != nil {
		f.l.Close()
		f.l = nil
	}
	for c := range f.conns {
		c.Close()
	}
}

// Close stops the forwarder.
func (f *Forwarder) Close() { f.Pause() }

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, mode)
}

// GC runs one `galactic-gc --once` pass inside the node and returns its
// output.
func (n *Node) GC() (string, error) {
	out, err := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(n.env.BinDir, "galactic-gc"),
		"--once", "--config", n.ConfigPath).CombinedOutput()
	return string(out), err
}

// MustGC is GC, failing t when the pass fails.
func (n *Node) MustGC(t testing.TB) string {
	t.Helper()
	out, err := n.GC()
	if err != nil {
		t.Fatalf("galactic-gc --once on %s: %v\n%s", n.Name, err, out)
	}
	return out
}
