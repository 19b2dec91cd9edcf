package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

// The soak's fixed settings. withdrawHold outlasts a move on a loaded
// machine, so a move changes a receiver's route once.
const (
	LeaseSeconds = 5
	WithdrawHold = 20 * time.Second
	pingInterval = 50 * time.Millisecond
	sampleEvery  = 100 * time.Millisecond
	probeEvery   = 500 * time.Millisecond
	canaryPort   = 7777
	mtu          = 1450
	vniBlue      = 10100
	vniRed       = 10200
)

// DefaultBounds are the checkers' windows for this topology.
var DefaultBounds = Bounds{WithdrawHold: WithdrawHold, Converge: 15 * time.Second, RoutingGrace: 30 * time.Second, Lag: 2 * time.Second}

// TenantNamespace is the tenant whose VPC green galactic-controller
// allocates: its attachments are VPCAttachments the plugins read.
const TenantNamespace = "soak-tenant"

// tenantNetwork is VPC green's only network.
const tenantNetwork = "10.30.0.0/24"

// DefaultTopology is the soak's: two VPCs of inline attachments with
// overlapping addresses, and the tenant's VPC green of object-backed ones,
// on three nodes; node-c hosts each VPC's client (which pings the VPC's
// attachments) and the inline VPCs' canaries, and never crashes.
func DefaultTopology() Topology {
	return Topology{
		Nodes: []string{"node-a", "node-b", "node-c"}, Crashable: []string{"node-a", "node-b"},
		Attachments: []Attachment{
			{VPC: "blue", Name: "app-0", VNI: vniBlue, Address: "10.20.0.5/24", Announce: "whenAvailable", Peer: "red/app-0"},
			{VPC: "blue", Name: "app-1", VNI: vniBlue, Address: "10.20.0.6/24", Announce: "always", Peer: "red/app-1"},
			{VPC: "red", Name: "app-0", VNI: vniRed, Address: "10.20.0.5/24", Announce: "always", Peer: "blue/app-0"},
			{VPC: "red", Name: "app-1", VNI: vniRed, Address: "10.20.0.6/24", Announce: "whenAvailable", Peer: "blue/app-1"},
			{VPC: "green", Name: "app-0", Namespace: TenantNamespace, Address: "10.30.0.5/24", Announce: "always"},
		},
		Initial: map[string]string{"blue/app-0": "node-a", "blue/app-1": "node-b", "red/app-0": "node-b", "red/app-1": "node-a",
			"green/app-0": "node-b"},
		LeaseSeconds: LeaseSeconds,
		OutageMax:    60 * time.Second,
	}
}

// statics are node-c's fixed workloads: a client per VPC and a canary per
// inline VPC, on addresses the other VPCs do not use, so table routing can
// hold them on one node.
var statics = []Attachment{
	{VPC: "green", Name: "client", Namespace: TenantNamespace, Address: "10.30.0.7/24", Announce: "always"},
	{VPC: "blue", Name: "client", VNI: vniBlue, Address: "10.20.0.7/24", Announce: "always"},
	{VPC: "red", Name: "client", VNI: vniRed, Address: "10.20.0.8/24", Announce: "always"},
	{VPC: "blue", Name: "canary", VNI: vniBlue, Address: "10.20.0.100/24", Announce: "always"},
	{VPC: "red", Name: "canary", VNI: vniRed, Address: "10.20.0.101/24", Announce: "always"},
}

func network(a Attachment) string { return "soak-" + a.VPC + "-" + a.Name }

func conflist(a Attachment, handoff bool) map[string]any {
	if a.Namespace != "" {
		// The stanzas name the VPCAttachment; VPC, VNI, addresses and
		// announce come from it.
		return map[string]any{
			"cniVersion": "1.1.0", "name": network(a),
			"plugins": []any{
				map[string]any{"type": "galactic-cni", "namespace": a.Namespace, "attachment": a.Name, "mode": mode(a), "routing": "table", "mtu": mtu,
					"handoff":      map[string]any{"enabled": handoff, "waitSeconds": 30, "leaseSeconds": LeaseSeconds},
					"capabilities": map[string]bool{netconf.CapabilityPodAnnotations: true}},
				map[string]any{"type": "galactic-bgp", "namespace": a.Namespace, "attachment": a.Name},
			},
		}
	}
	return map[string]any{
		"cniVersion": "1.1.0", "name": network(a),
		"plugins": []any{
			map[string]any{"type": "galactic-cni", "vpc": a.VPC, "attachment": a.Name, "mode": mode(a),
				"addresses": []string{a.Address}, "routing": "table", "mtu": mtu,
				"handoff": map[string]any{"enabled": handoff, "waitSeconds": 30, "leaseSeconds": LeaseSeconds},
				// A live migration's target is a standby ADD, asked for
				// with the pod annotation.
				"capabilities": map[string]bool{netconf.CapabilityPodAnnotations: true}},
			map[string]any{"type": "galactic-bgp", "vpc": a.VPC, "attachment": a.Name, "vni": a.VNI, "announce": a.Announce},
		},
	}
}

func mode(a Attachment) string {
	if a.VM {
		return "tap"
	}
	return "veth"
}

func addrOf(a Attachment) netip.Addr { return netip.MustParsePrefix(a.Address).Addr() }

// Options configure a run.
type Options struct {
	Seed     uint64
	Duration time.Duration
	// Plan, when set, is the schedule instead of the seed's: a scenario
	// written for one finding (its regression test).
	Plan []Step
	// Steps, when positive, runs only the schedule's first Steps steps
	// (with their faults ended): a violation's reproduction.
	Steps int
	// Quiet is how long the world rests after the schedule before leaks
	// are checked.
	Quiet time.Duration
	// Env is the control plane; nil starts one.
	Env *harness.Env
	Out io.Writer
	// Trace, when set, gets every change the checkers sample (leases,
	// entries, records, routes) and every step's start and end.
	Trace io.Writer
	// VM adds a qemu guest (blue/vm-0, on a tap) that live migration
	// moves between nodes with qemu's own migration.
	VM bool
	// Keep leaves the nodes' directories (the daemons' logs, state and
	// records) in place and names them on Out.
	Keep bool
}

type node struct {
	*harness.Node
	underlay netip.Addr
	router   *harness.Router
	gc       *harness.GCDaemon
	down     bool
}

type instance struct {
	a         Attachment
	node      string
	netns     *harness.Netns
	available bool
	// vm is the guest of a VM attachment.
	vm *guest
}

// runner is the real World.
type runner struct {
	ctx      context.Context
	o        Options
	topo     Topology
	env      *harness.Env
	dir      string
	fabric   *harness.Fabric
	nodes    map[string]*node
	byUL     map[string]string
	undo     []func()
	start    time.Time
	mu       sync.Mutex
	inst     map[string]*instance
	stale    map[string][]*instance // instances replaced while their node was cut off
	clients  map[string]*harness.Netns
	staticNs map[string]*harness.Netns
	pingers  map[string]*harness.Pinger
	canary   *canaries
	advInf   cache.SharedIndexInformer
	lInf     cache.SharedIndexInformer
	checker  *Checker
	report   *Report
	trace    *tracer
	assets   *vm.GuestAssets
	sockDir  string
	qmpSeq   int
	// reachable records, per attachment, whether it should answer.
	reachable map[string][]change
	// tenant is VPC green's; objs its attachments by key, extra the
	// workloads of the object step kinds' attachments (the keeper's).
	tenant                  *harness.Tenant
	objs                    map[string]*v1alpha1.VPCAttachment
	extra                   map[string]*instance
	dpVPC                   map[string]string
	vpcInf, attInf, addrInf cache.SharedIndexInformer
}

func (r *runner) say(format string, args ...any) {
	fmt.Fprintf(r.o.Out, "[%7.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run runs a soak and returns its report; a non-nil error means the
// topology could not be built or torn down, violations are in the report.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Quiet == 0 {
		o.Quiet = WithdrawHold + 10*time.Second
	}
	topo := DefaultTopology()
	if o.VM {
		topo = WithVM(topo)
	}
	// A short soak plans outages that fit it.
	topo.OutageMax = min(60*time.Second, max(5*time.Second, o.Duration/8))
	steps := Schedule(o.Seed, o.Duration, topo)
	if o.Plan != nil {
		steps = o.Plan
	}
	if o.Steps > 0 && o.Steps < len(steps) {
		steps = Prefix(steps, o.Steps-1)
	}
	r := &runner{ctx: ctx, o: o, topo: topo, start: time.Now(), nodes: map[string]*node{}, byUL: map[string]string{},
		inst: map[string]*instance{}, stale: map[string][]*instance{}, clients: map[string]*harness.Netns{}, staticNs: map[string]*harness.Netns{},
		pingers: map[string]*harness.Pinger{}, reachable: map[string][]change{},
		objs: map[string]*v1alpha1.VPCAttachment{}, extra: map[string]*instance{}, dpVPC: map[string]string{"blue": "blue", "red": "red"}}
	r.report = &Report{Seed: o.Seed, Planned: o.Duration, Steps: steps, StepErrors: map[int]string{}, Blackouts: map[string][]time.Duration{}}
	defer func() {
		r.say("teardown")
		for i := len(r.undo) - 1; i >= 0; i-- {
			r.undo[i]()
		}
	}()
	if r.env = o.Env; r.env == nil {
		r.say("starting a real etcd and kube-apiserver")
		if r.env, err = harness.NewEnv(r.ctx, o.Out); err != nil {
			return nil, err
		}
		r.undo = append(r.undo, r.env.Close)
	}
	if err := r.setup(); err != nil {
		r.tails()
		return nil, fmt.Errorf("setting up the soak: %w", err)
	}
	r.say("schedule: seed %d, %s, %d steps (kinds: %s)", o.Seed, o.Duration, len(steps), strings.Join(Kinds(), ", "))
	r.checker = NewChecker(topo, DefaultBounds, time.Now())
	r.start = time.Now()
	r.trace = &tracer{w: o.Trace, start: r.start}
	stopObs := r.observe()
	windows := r.execute(steps)
	r.say("schedule done; quiet for %s", o.Quiet)
	r.sleep(o.Quiet)
	stopObs()
	r.report.Ran = time.Since(r.start)
	r.report.Samples, r.report.Routes, r.report.Routed, r.report.Claims = r.checker.Samples, r.checker.Routes, r.checker.Routed, r.checker.Claims
	r.blackouts(steps, windows)
	if r.ctx.Err() == nil {
		r.quietCheck()
	}
	// Interrupted, the workloads are still deleted but nothing is judged:
	// there was no quiet period.
	r.emptyCheck(r.ctx.Err() == nil)
	r.deleteTenant()
	r.report.Violations = r.checker.Violations
	if len(r.report.Violations) > 0 {
		r.tails()
	}
	return r.report, nil
}

func (r *runner) sleep(d time.Duration) {
	select {
	case <-r.ctx.Done():
	case <-time.After(d):
	}
}

// until polls cond every 100 ms until it returns nil or limit passes.
func (r *runner) until(limit time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			return fmt.Errorf("%s within %s: %v", what, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *runner) tails() {
	for _, name := range sortedKeys(r.nodes) {
		n := r.nodes[name]
		for _, log := range []string{n.router.LogPath, n.gc.LogPath} {
			data, _ := os.ReadFile(log)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			r.say("%s: the last lines of %s:", name, filepath.Base(log))
			for _, l := range lines[max(0, len(lines)-8):] {
				fmt.Fprintf(r.o.Out, "           %s\n", l)
			}
		}
	}
}

func (r *runner) setup() error {
	var err error
	if r.dir, err = os.MkdirTemp("", "galactic-soak-"); err != nil {
		return err
	}
	r.undo = append(r.undo, func() {
		if r.o.Keep {
			r.say("kept the nodes' logs and state in %s", r.dir)
			return
		}
		os.RemoveAll(r.dir)
	})
	if r.sockDir, err = os.MkdirTemp("", "qmp"); err != nil {
		return err
	}
	r.undo = append(r.undo, func() { os.RemoveAll(r.sockDir) })
	if r.fabric, err = harness.CreateFabric(harness.FabricOptions{}); err != nil {
		return err
	}
	r.undo = append(r.undo, r.fabric.Close)
	for _, name := range r.topo.Nodes {
		if err := r.addNode(name); err != nil {
			return err
		}
	}
	if err := r.until(60*time.Second, "every router's session with FRR", r.established); err != nil {
		return err
	}
	if err := r.setupTenant(); err != nil {
		return err
	}
	r.canary = &canaries{own: map[string]int{}, strangers: map[string]int{}}
	r.undo = append(r.undo, r.canary.stop)
	for _, a := range statics {
		c, err := r.container()
		if err != nil {
			return err
		}
		if _, err := r.nodes["node-c"].CNITool("add", network(a), c, "eth0"); err != nil {
			return err
		}
		r.staticNs[a.Key()] = c
		switch a.Name {
		case "client":
			r.clients[a.VPC] = c
		case "canary":
			if err := r.canary.listen(a.VPC, c); err != nil {
				return err
			}
		}
	}
	if err := r.startInformers(); err != nil {
		return err
	}
	for _, a := range r.topo.Attachments {
		if err := r.Create(a.Key(), r.topo.Initial[a.Key()]); err != nil {
			return err
		}
		p, err := r.clients[a.VPC].StartPinger(addrOf(a), pingInterval)
		if err != nil {
			return err
		}
		r.pingers[a.Key()] = p
		r.undo = append(r.undo, func() { p.Stop() })
	}
	r.say("setup: every attachment created; waiting until each answers its VPC's client")
	return r.until(90*time.Second, "every attachment answering", func() error {
		for _, a := range r.topo.Attachments {
			st := r.pingers[a.Key()].StatsBetween(time.Now().Add(-2*time.Second), time.Now())
			if st.Received == 0 {
				return fmt.Errorf("%s: no reply", a.Key())
			}
		}
		return nil
	})
}

func (r *runner) container() (*harness.Netns, error) {
	c, err := harness.CreateNetns("c")
	if err != nil {
		return nil, err
	}
	r.undo = append(r.undo, c.Delete)
	return c, nil
}

func (r *runner) addNode(name string) error {
	hn, err := r.env.CreateNode(name, filepath.Join(r.dir, name))
	if err != nil {
		return err
	}
	r.undo = append(r.undo, hn.Close)
	n := &node{Node: hn}
	if n.underlay, err = r.fabric.AttachNode(hn); err != nil {
		return err
	}
	r.byUL[n.underlay.String()] = name
	if out, err := hn.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return fmt.Errorf("forwarding on %s: %v %s", name, err, out)
	}
	for _, a := range r.topo.Attachments {
		if err := hn.WriteConflistFile(conflist(a, true)); err != nil {
			return err
		}
	}
	for _, a := range statics {
		if err := hn.WriteConflistFile(conflist(a, false)); err != nil {
			return err
		}
	}
	for _, a := range []Attachment{cycled, keeper} {
		if err := hn.WriteConflistFile(conflist(a, true)); err != nil {
			return err
		}
	}
	cfg := r.fabric.FabricRouterConfig(n.underlay)
	hold := int64(WithdrawHold / time.Second)
	cfg.WithdrawHoldSeconds = &hold
	cfg.GracefulRestart = &config.GracefulRestart{Enabled: new(true), RestartSeconds: new(int64(120))}
	if n.router, err = hn.LaunchRouter(cfg); err != nil {
		return err
	}
	r.undo = append(r.undo, n.router.Kill)
	n.gc = hn.NewGCDaemon(time.Second)
	if err := n.gc.Start(); err != nil {
		return err
	}
	r.undo = append(r.undo, n.gc.Kill)
	r.nodes[name] = n
	r.say("%s: underlay %s, galactic-router and galactic-gc running", name, n.underlay)
	return nil
}

func (r *runner) established() error {
	states, err := r.fabric.PeerStates()
	if err != nil {
		return err
	}
	for _, n := range r.nodes {
		if st := states[n.underlay.String()]; !n.down && st != "Established" {
			return fmt.Errorf("%s: %q", n.Name, st)
		}
	}
	return nil
}

func listWatch[T runtime.Object](list func(context.Context, metav1.ListOptions) (T, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return list(ctx, o) },
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return w(ctx, o)
		},
	}
}

// startInformers watches every advertisement and lease, and the tenant's
// objects, with the admin credential, which no fault cuts.
func (r *runner) startInformers() error {
	ctx, cancel := context.WithCancel(context.Background())
	r.undo = append(r.undo, cancel)
	ads := r.env.API.BGPAdvertisements(harness.Namespace)
	leases := r.env.API.Leases(harness.Namespace)
	r.advInf = cache.NewSharedIndexInformer(listWatch(ads.List, ads.Watch), &v1alpha1.BGPAdvertisement{}, 0, cache.Indexers{})
	r.lInf = cache.NewSharedIndexInformer(listWatch(leases.List, leases.Watch), &coordinationv1.Lease{}, 0, cache.Indexers{})
	go r.advInf.RunWithContext(ctx)
	go r.lInf.RunWithContext(ctx)
	synced := append(r.startObjectInformers(ctx), r.advInf.HasSynced, r.lInf.HasSynced)
	if !cache.WaitForCacheSync(r.ctx.Done(), synced...) {
		return errors.New("informers did not sync")
	}
	return nil
}

// canaries count the probes each VPC's canary receives, by the VPC that
// sent them.
type canaries struct {
	mu        sync.Mutex
	own       map[string]int
	strangers map[string]int
	conns     []*net.UDPConn
	wg        sync.WaitGroup
}

func (c *canaries) listen(vpc string, ns *harness.Netns) error {
	var conn *net.UDPConn
	if err := ns.Do(func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: canaryPort})
		return err
	}); err != nil {
		return err
	}
	c.conns = append(c.conns, conn)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		buf := make([]byte, 256)
		for {
			n, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			f := strings.Fields(string(buf[:n]))
			if len(f) < 2 || f[0] != "soak-probe" {
				continue
			}
			c.mu.Lock()
			if f[1] == vpc {
				c.own[vpc]++
			} else {
				c.strangers[vpc]++
			}
			c.mu.Unlock()
		}
	}()
	return nil
}

func (c *canaries) stop() {
	for _, conn := range c.conns {
		conn.Close()
	}
	c.wg.Wait()
}

func (c *canaries) counts() (own, strangers map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	own, strangers = map[string]int{}, map[string]int{}
	for k, v := range c.own {
		own[k] = v
	}
	for k, v := range c.strangers {
		strangers[k] = v
	}
	return own, strangers
}

// canaryAddrs are the canaries' addresses: every workload probes both,
// its own VPC's (a control) and the other's (which must never arrive).
var canaryAddrs = []netip.Addr{netip.MustParseAddr("10.20.0.100"), netip.MustParseAddr("10.20.0.101")}

func probe(vpc string, ns *harness.Netns) {
	_ = ns.Do(func() error {
		for _, a := range canaryAddrs {
			conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: a.AsSlice(), Port: canaryPort})
			if err != nil {
				continue
			}
			_, _ = conn.Write([]byte("soak-probe " + vpc))
			conn.Close()
		}
		return nil
	})
}
