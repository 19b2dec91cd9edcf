// Package demo is `make demo`: the routing story of a VM on one machine.
// A real control plane, an FRR route reflector on a test fabric, three
// nodes as network namespaces, each running galactic-gc and
// galactic-router as galactic-installer set them up, the real plugins run
// by cnitool, and a qemu guest in VPC blue that a client on another node
// pings every 10 ms while the VM is attached, upgraded, moved, crashed,
// its router restarted and finally drained; before that, a second VM
// live-migrates from node-a to node-b under the client's pings and TCP
// connection. Every step prints what FRR
// holds, the client node's route, the lease and the lost replies, and Run
// fails when an expected state is not observed. Last, galactic-controller
// allocates two tenants' VPC blue with the same attachment names and
// addresses on node-a and node-b, and each tenant's pair pings across
// nodes without reaching the other tenant's.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

const (
	leaseSeconds = 5
	// withdrawHold must outlast a takeover (the lease's expiry plus a guest
	// boot under TCG, slower on a loaded machine), so an upgrade, a move or
	// a crash changes the client's route at most once.
	withdrawHold = 30
	vniBlue      = 10100
	vniRed       = 10200
	ifName       = "net0"
	pingInterval = 10 * time.Millisecond
	// mtu leaves room for VXLAN on the fabric's 1500-byte links.
	mtu = 1450
)

// withHandoff is the handoff of the demo's attachments that have it on.
var withHandoff = &harness.Handoff{WaitSeconds: 30, LeaseSeconds: leaseSeconds}

var (
	// theVM is what moves around; client pings it from node-c.
	theVM = harness.Attachment{VPC: "blue", Name: "web-0-net0", Mode: "tap", VNI: vniBlue, Addresses: []string{"10.20.0.5/24", "fd20::5/64"},
		Announce: "whenAvailable", Handoff: withHandoff, MTU: mtu}
	client = harness.Attachment{VPC: "blue", Name: "client-0-net0", VNI: vniBlue, Addresses: []string{"10.20.0.7/24", "fd20::7/64"}, MTU: mtu}
	// red holds the VM's address in another VPC, next to the client.
	red = harness.Attachment{VPC: "red", Name: "db-0-net0", VNI: vniRed, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, MTU: mtu}

	// vmAddr is what the client pings; prefix is its route everywhere.
	vmAddr  = netip.MustParseAddr("10.20.0.5")
	vmAddr6 = netip.MustParseAddr("fd20::5")
	prefix  = netip.PrefixFrom(vmAddr, 32)
)

// node is a demo node: its namespace, underlay address and daemons.
type node struct {
	*harness.Node
	underlay netip.Addr
	router   *harness.Router
	gc       *harness.GCDaemon
}

// running is the VM as it runs now.
type running struct {
	node  string
	netns *harness.Netns
	guest *guest
}

type demo struct {
	ctx    context.Context
	out    io.Writer
	start  time.Time
	env    *harness.Env
	dir    string
	fabric *harness.Fabric
	nodes  map[string]*node
	// byUnderlay names the node of an underlay address, for the narration.
	byUnderlay map[string]string
	qemu       *qemu
	vm         *running
	// clientNetns and redNetns are the workloads on node-c.
	clientNetns, redNetns *harness.Netns
	pinger                *harness.Pinger
	monitor               *routeMonitor
	// vmStarted is when each node's VM last became ready.
	vmStarted map[string]time.Time
	undo      []func()
	report    *Report
}

// Run runs the demo and returns what it measured. With env nil it builds
// the binaries and starts its own control plane. Everything it creates is
// removed before it returns, also when ctx is cancelled or a step fails.
func Run(ctx context.Context, out io.Writer, env *harness.Env) (rep *Report, err error) {
	d := &demo{ctx: ctx, out: out, start: time.Now(), nodes: map[string]*node{}, byUnderlay: map[string]string{},
		vmStarted: map[string]time.Time{}, report: &Report{}}
	defer func() {
		if err != nil {
			d.tails()
		}
		d.say("== teardown: removing processes, namespaces and files")
		for i := len(d.undo) - 1; i >= 0; i-- {
			d.undo[i]()
		}
		if err == nil {
			d.say("done: every expected state was observed")
			d.report.print(d.out)
		}
	}()
	if env == nil {
		d.say("starting a real etcd and kube-apiserver (the first run builds them from the Go module proxy: about 6-9 minutes on 2 cores)")
		if env, err = harness.NewEnv(ctx, out); err != nil {
			return nil, err
		}
		d.undo = append(d.undo, env.Close)
	}
	d.env = env
	if d.dir, err = harness.MkdirTemp("galactic-demo-"); err != nil {
		return nil, err
	}
	d.undo = append(d.undo, func() { harness.RemoveDir(d.dir) })
	d.say("control plane at %s; CRDs installed", env.CP.Server)
	if d.qemu, err = newQEMU(d.dir, out); err != nil {
		return nil, err
	}
	d.say("the VM is %s", d.qemu.describe())

	for _, step := range []func() error{d.setup, d.liveMigration, d.attach, d.upgrade, d.move, d.crash, d.restartRouter, d.drain, d.tenants} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := step(); err != nil {
			return nil, err
		}
	}
	return d.report, nil
}

// tails prints the end of each router's log, which teardown removes, so a
// failed run says what the routers saw.
func (d *demo) tails() {
	for _, name := range keys(d.nodes) {
		if r := d.nodes[name].router; r != nil {
			lines := strings.Split(strings.TrimSpace(r.Log()), "\n")
			d.say("%s: the last lines of galactic-router's log:", name)
			d.show(strings.Join(lines[max(0, len(lines)-15):], "\n"))
		}
	}
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) show(text string) {
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintf(d.out, "           %s\n", line)
	}
}

func expect(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf("expected "+format, args...)
}

// until waits until cond returns nil; past limit (or when ctx ends) the
// error names what was awaited.
func (d *demo) until(limit time.Duration, what string, cond func() error) error {
	if err := harness.Poll(d.ctx, limit, what, cond); err != nil {
		return fmt.Errorf("expected %w", err)
	}
	return nil
}

// setup makes the fabric with FRR, node-a, node-b and node-c on it with
// galactic installed and its daemons running, and on node-c the client
// and red's workload.
func (d *demo) setup() error {
	d.say("== setup: an FRR route reflector on a fabric, three nodes with galactic installed")
	f, err := harness.CreateFabric(harness.FabricOptions{})
	if err != nil {
		return err
	}
	d.undo = append(d.undo, f.Close)
	d.fabric = f
	d.say("fabric: netns %s, bridge 192.0.2.0/24, FRR bgpd at %s (AS %d, route reflector of l2vpn evpn)", f.Netns.Name, f.RR, harness.FabricASN)
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		if err := d.addNode(name); err != nil {
			return err
		}
	}
	for _, n := range d.nodes {
		for _, a := range []harness.Attachment{theVM, client, red} {
			if err := n.WriteConflistFile(a.Conflist()); err != nil {
				return err
			}
		}
	}
	d.say("conflists on every node (routing: table, since this kernel has no VRF); the VM's:")
	data, _ := json.MarshalIndent(theVM.Conflist(), "", "  ")
	d.show(string(data))
	d.say("the client's and red's:")
	for _, a := range []harness.Attachment{client, red} {
		data, _ := json.Marshal(a.Conflist())
		d.show(string(data))
	}
	if err := d.until(20*time.Second, "every router's session with FRR established", d.allEstablished); err != nil {
		return err
	}
	d.say("FRR: sessions with node-a, node-b and node-c established")

	c := d.nodes["node-c"]
	if d.clientNetns, err = d.add("node-c", client); err != nil {
		return err
	}
	if d.redNetns, err = d.add("node-c", red); err != nil {
		return err
	}
	// node-c reaches its own workloads through their VPC's table: the
	// answer comes from red's workload, which holds the VM's address.
	if err := c.Ping(vmAddr); err != nil {
		return fmt.Errorf("expected red's workload on node-c to answer the node on %s: %w", vmAddr, err)
	}
	d.say("node-c: the client (blue %s) and red's workload (red %s, the VM's address) are attached; red's answers node-c's own ping", client.Addresses[0], red.Addresses[0])
	if err := d.until(20*time.Second, "FRR holding the client's and red's routes", func() error {
		routes, err := f.EVPNRoutes()
		if err != nil {
			return err
		}
		if len(vpcPaths(routes[netip.MustParsePrefix("10.20.0.7/32")], vniBlue)) != 1 || len(vpcPaths(routes[prefix], vniRed)) != 1 {
			return fmt.Errorf("FRR holds %+v", routes)
		}
		return nil
	}); err != nil {
		return err
	}
	d.say("FRR holds the client's 10.20.0.7/32 (route target %d:%d) and red's 10.20.0.5/32 (%d:%d)", harness.FabricASN, vniBlue, harness.FabricASN, vniRed)
	if d.monitor, err = startRouteMonitor(c.Node); err != nil {
		return err
	}
	d.undo = append(d.undo, d.monitor.stop)
	if d.pinger, err = d.clientNetns.StartPinger(vmAddr, pingInterval); err != nil {
		return err
	}
	d.undo = append(d.undo, func() { d.pinger.Stop() })
	d.say("node-c: the client pings %s every %s from now to the end", vmAddr, pingInterval)
	return nil
}

// addNode creates a node on the fabric and installs galactic on it with
// galactic-installer into the node's own root, router.json from its
// --router-* flags, then starts galactic-gc and galactic-router.
func (d *demo) addNode(name string) error {
	dir := filepath.Join(d.dir, name)
	hn, err := d.env.CreateNode(name, dir)
	if err != nil {
		return err
	}
	d.undo = append(d.undo, hn.Close)
	n := &node{Node: hn}
	d.nodes[name] = n
	if n.underlay, err = d.fabric.AttachNode(hn); err != nil {
		return err
	}
	d.byUnderlay[n.underlay.String()] = name
	// Nodes forward between their workloads and the fabric.
	if out, err := hn.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return fmt.Errorf("enabling forwarding on %s: %v %s", name, err, out)
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	// What the kubelet would project into the DaemonSet's pod on this node:
	// a service account token bound to it, so the admission policy keeps
	// the node to its own objects.
	token, err := d.env.NodeToken(d.ctx, name)
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(dir, "serviceaccount", "token")
	if err := os.MkdirAll(filepath.Dir(tokenFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	args := []string{"install", "--root", root, "--node-name", name, "--token-file", tokenFile, "--ca-file", d.env.CP.CAFile,
		"--api-server", d.env.CP.Server, "--source-dir", d.env.BinDir,
		"--router-asn", fmt.Sprint(harness.FabricASN), "--router-underlay", n.underlay.String(),
		"--router-peer", fmt.Sprintf("%s:%d", d.fabric.RR, harness.FabricASN), "--router-listen-port", "-1",
		"--router-withdraw-hold-seconds", fmt.Sprint(withdrawHold)}
	out, err := exec.CommandContext(d.ctx, filepath.Join(d.env.BinDir, "galactic-installer"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("installing on %s: %v\n%s", name, err, out)
	}
	d.say("%s: netns %s, underlay %s; galactic-installer %s", name, hn.Netns.Name, n.underlay, strings.Join(args, " "))
	routerConfig := filepath.Join(root, strings.TrimPrefix(config.DefaultPath, "/"))
	if name == "node-a" {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if !strings.HasPrefix(line, "create directory") {
				d.show(line)
			}
		}
		data, err := os.ReadFile(routerConfig)
		if err != nil {
			return err
		}
		d.say("node-a: the router.json galactic-installer wrote:")
		d.show(string(data))
	}
	hn.ConfigPath = filepath.Join(root, strings.TrimPrefix(settings.DefaultConfig, "/"))
	hn.CNIPath = filepath.Join(root, "opt/cni/bin")
	if hn.Settings, err = settings.Load(func(k string) string {
		if k == settings.EnvConfig {
			return hn.ConfigPath
		}
		return ""
	}); err != nil {
		return err
	}
	if err := d.startGC(name); err != nil {
		return err
	}
	n.router = hn.NewRouter(routerConfig)
	if err := n.router.Start(); err != nil {
		return err
	}
	d.undo = append(d.undo, n.router.Kill)
	return nil
}

// allEstablished reports whether FRR has a session up with every node.
func (d *demo) allEstablished() error {
	states, err := d.fabric.PeerStates()
	if err != nil {
		return err
	}
	for _, n := range d.nodes {
		if st, ok := states[n.underlay.String()]; !ok || st != "Established" {
			return fmt.Errorf("%s: %+v", n.Name, states)
		}
	}
	return nil
}

// startGC runs galactic-gc on a node with a short interval, so it renews
// the leases of live holders well within the lease duration.
func (d *demo) startGC(name string) error {
	n := d.nodes[name]
	if n.gc == nil {
		n.gc = n.NewGCDaemon(time.Second)
		d.undo = append(d.undo, n.gc.Kill)
	}
	return n.gc.Start()
}

func (d *demo) stopGC(name string) { d.nodes[name].gc.Kill() }

// gcLog is what the node's GC daemon logged.
func (d *demo) gcLog(name string) string {
	data, _ := os.ReadFile(filepath.Join(d.nodes[name].Dir, "galactic-gc.log"))
	return string(data)
}

// waitGCPass waits until the node's GC daemon finished a pass that started
// after t.
func (d *demo) waitGCPass(name string, t time.Time) error {
	return d.until(15*time.Second, "a galactic-gc pass on "+name+" after "+t.Format(time.RFC3339Nano), func() error {
		for _, line := range strings.Split(d.gcLog(name), "\n") {
			var l struct {
				Time     time.Time `json:"time"`
				Msg      string    `json:"msg"`
				Duration string    `json:"duration"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || !strings.HasPrefix(l.Msg, "gc pass finished") {
				continue
			}
			took, _ := time.ParseDuration(l.Duration)
			if l.Time.Add(-took).After(t) {
				return nil
			}
		}
		return errors.New("none yet")
	})
}

// container creates a workload sandbox netns.
func (d *demo) container() (*harness.Netns, error) {
	c, err := harness.CreateNetns("c")
	if err != nil {
		return nil, err
	}
	d.undo = append(d.undo, c.Delete)
	return c, nil
}

// cnitool runs a verb of a's chain on a node and returns its output (the
// CNI result of an ADD).
func (d *demo) cnitool(name, verb string, a harness.Attachment, c *harness.Netns) (string, error) {
	d.say("%s: cnitool %s %s %s", name, verb, a.Network(), c.Path)
	return d.nodes[name].CNITool(verb, a.Network(), c, a.Interface())
}

// add attaches a for a new container on a node.
func (d *demo) add(name string, a harness.Attachment) (*harness.Netns, error) {
	c, err := d.container()
	if err != nil {
		return nil, err
	}
	_, err = d.cnitool(name, "add", a, c)
	return c, err
}

// launch starts the VM on a node: a sandbox netns, the chain's ADD, then
// the guest on the tap, ready. It does not report the guest available.
func (d *demo) launch(name string) (*running, error) {
	c, err := d.container()
	if err != nil {
		return nil, err
	}
	out, err := d.cnitool(name, "add", theVM, c)
	if err != nil {
		return nil, err
	}
	return d.boot(name, c, out)
}

// boot starts the guest on the tap an ADD result (out) names.
func (d *demo) boot(name string, c *harness.Netns, out string) (*running, error) {
	res := &current.Result{}
	if err := json.Unmarshal([]byte(out), res); err != nil {
		return nil, fmt.Errorf("the ADD result on %s: %v: %s", name, err, out)
	}
	g, err := d.qemu.start(d.ctx, d.nodes[name].Node, res)
	if err != nil {
		return nil, fmt.Errorf("starting the VM on %s: %w", name, err)
	}
	d.undo = append(d.undo, g.crash)
	d.vmStarted[name] = time.Now()
	d.say("%s: qemu (pid %d) on tap %s; the guest %s", name, g.pid(), res.Interfaces[0].Name, g.summary)
	return &running{node: name, netns: c, guest: g}, nil
}

// availability runs `galactic-cni available|unavailable` for the VM's
// container, as its runtime does once the guest serves or before it stops.
func (d *demo) availability(r *running, verb string) error {
	n := d.nodes[r.node]
	cmd := exec.CommandContext(d.ctx, "ip", "netns", "exec", n.Netns.Name, filepath.Join(d.env.BinDir, "galactic-cni"), verb,
		"--vpc", theVM.VPC, "--attachment", theVM.Name, "--container", harness.ContainerID(r.netns.Path))
	// Outside a CNI call: no CNI_* variables, only the node's settings.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, n.Environ()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("galactic-cni %s on %s: %v %s", verb, r.node, err, out)
	}
	d.say("%s: galactic-cni %s --vpc %s --attachment %s --container %s", r.node, verb, theVM.VPC, theVM.Name, short(harness.ContainerID(r.netns.Path)))
	return nil
}

// stopVM powers the VM off and runs its DEL, as a runtime stopping it does.
func (d *demo) stopVM(r *running) error {
	if err := r.guest.stop(); err != nil {
		return fmt.Errorf("stopping the VM on %s: %w", r.node, err)
	}
	d.say("%s: the guest powered off (qemu pid %d exited and let go of the tap)", r.node, r.guest.pid())
	if _, err := d.cnitool(r.node, "del", theVM, r.netns); err != nil {
		return err
	}
	r.netns.Delete()
	return nil
}

func short(id string) string {
	if len(id) > 20 {
		return id[:20] + "…"
	}
	return id
}

// tapOn is the ifindex of the VM's tap on a node, 0 when there is none.
func (d *demo) tapOn(name string) int {
	out, err := d.nodes[name].Run("ip", "link", "show", "dev", names.HostInterface(names.ModeTap, theVM.VPC, theVM.Name))
	if err != nil {
		return 0
	}
	var idx int
	fmt.Sscanf(out, "%d:", &idx)
	return idx
}
