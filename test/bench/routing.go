package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
)

// AgentRouter is galactic-router's user agent.
const AgentRouter = "galactic-router"

// The reference: Debian's gobgpd and its CLI.
const (
	gobgpd     = "/usr/bin/gobgpd"
	gobgpCLI   = "/usr/bin/gobgp"
	gobgpdPort = "50051"
)

// The VPCs of the section: rb carries the latency, availability and move
// attachments, rscale the 10,000 prefixes.
const (
	routingVPC   = "rb"
	routingVNI   = 10100
	scaleVPC     = "rscale"
	scaleVNI     = 10300
	scaleAdverts = 40
	// scalePerAdvert stays under the CRD's 256 prefixes per advertisement,
	// in entries of at most 64 (its limit per entry).
	scalePerAdvert = 250
	scalePerEntry  = 63
	steadyWindow   = 30 * time.Second
	// routerQPS and routerBurst are galactic-router's API client limits
	// (router/cmd/galactic-router/main.go).
	routerQPS, routerBurst = 20, 40
	// moveSpacing exceeds the routers' default withdrawHoldSeconds (10).
	moveSpacing = 12 * time.Second
)

// RoutingResult is the Routing section.
type RoutingResult struct {
	Iterations int
	// RefAdd and RefDel: the gobgp CLI returned → FRR logged the update.
	RefAdd, RefDel Sample
	// Add and Del: cnitool ADD or DEL returned → FRR logged the update.
	Add, Del Sample
	// The same from the command's start: the route can be in FRR before
	// the command returns (galactic-bgp is the last plugin of ADD and the
	// first of DEL).
	RefAddStart, RefDelStart, AddStart, DelStart Sample
	// Install: ADD on A returned → the route in C's kernel.
	Install Sample
	// Available and Unavailable: the command returned → C's kernel.
	Available, Unavailable Sample
	// AvailPasses, AvailPassMean and AvailWrites are A's router's passes,
	// their mean duration and its status writes during those rounds.
	AvailPasses   int
	AvailPassMean time.Duration
	AvailWrites   int
	Moves         []MoveResult
	Scale         *ScaleResult
	Restart       *RestartResult
	Faults        *FaultResult
	Skipped       string
}

// MoveResult is one move of an attachment from one node to another.
type MoveResult struct {
	Handoff bool
	// Blackout is the pinger's longest gap between answered requests;
	// Wait is the part of it before the new holder acquired the lease.
	Blackout, Wait time.Duration
	Lost           int
	// Withdrawn and Announced are the updates FRR received about the
	// prefix; KernelChanges the route changes in C's kernel.
	Withdrawn, Announced, KernelChanges int
	// KernelAfterAdd is C's route change for the prefix, from the new
	// holder's ADD returned.
	KernelAfterAdd time.Duration
}

// Routing is the part of the blackout the handoff wait does not explain.
func (m MoveResult) Routing() time.Duration { return m.Blackout - m.Wait }

// ScaleResult is 10,000 prefixes on one node and their receiver.
type ScaleResult struct {
	Prefixes int
	// ToFRR is the router's start → the last of its prefixes in FRR.
	ToFRR time.Duration
	// RSS and HWM are the router's VmRSS and VmHWM with every prefix out.
	RSS, HWM int64
	// Startup are the router's API requests from its restart to the
	// steady window, the last StartupTook after the restart; Steady those
	// begun in the window.
	Startup, Steady []Request
	StartupTook     time.Duration
	// FirstWrites are the status writes of the first start (the router's
	// metric); Writes the restart's, completed, with their status codes.
	FirstWrites float64
	Writes      []Request
	// Installed is the receiver's router start → every prefix in its
	// kernel; RemoteRSS and RemoteHWM its memory then.
	Installed            time.Duration
	RemoteRSS, RemoteHWM int64
	// SessionUp and RemoteSessionUp are each router's start → its BGP
	// session established, from its log.
	SessionUp, RemoteSessionUp time.Duration
	// RemoteFirst is the receiver's start → its first routes installed.
	RemoteFirst time.Duration
}

// RestartResult is a SIGTERM restart of the scale node's router.
type RestartResult struct {
	Prefixes int
	// Withdrawn and Notifications are what FRR received from the node
	// across the restart; Back is SIGTERM → every prefix re-announced.
	Withdrawn, Notifications int
	Back                     time.Duration
	// ReceiverChanges are the kernel route changes the receiving node's
	// router made across it; ReceiverUpdates the updates it received.
	ReceiverChanges, ReceiverUpdates float64
}

// routedNode is a bench node on the fabric.
type routedNode struct {
	*node
	underlay netip.Addr
	router   *harness.Router
}

// routing runs the Routing section.
func (b *bench) routing() error {
	r := &RoutingResult{Iterations: 50}
	if b.opts.Quick {
		r.Iterations = 10
	}
	b.res.Routing = r
	for _, bin := range []string{harness.FRRBgpd, gobgpd, gobgpCLI} {
		if _, err := os.Stat(bin); err != nil {
			r.Skipped = fmt.Sprintf("%s is not installed (Debian: frr, gobgpd; hack/install-deps.sh installs them)", bin)
			b.say("Routing: skipped: %s", r.Skipped)
			return nil
		}
	}
	f, err := harness.CreateFabric(harness.FabricOptions{})
	if err != nil {
		return err
	}
	b.undo = append(b.undo, f.Close)
	log := &frrLog{f: f}

	// The reference attaches first, so it is 192.0.2.11, the address of
	// the gobgp command of the reference.
	ref, err := b.fabricNode(f, "ref", false)
	if err != nil {
		return err
	}
	if err := b.startGobgpd(ref, f); err != nil {
		return err
	}
	nodes := map[string]*routedNode{}
	for _, name := range []string{"ra", "rb", "rc"} {
		if nodes[name], err = b.fabricNode(f, name, true); err != nil {
			return err
		}
	}
	a, bn, c := nodes["ra"], nodes["rb"], nodes["rc"]
	// Resident attachments keep the VPC's routing domain on every node, as
	// on nodes that run workloads; C's is the pinger's source.
	var wc *harness.Netns
	for i, n := range []*routedNode{a, bn, c} {
		cont, err := b.attach(n, routedConf(routingVPC, fmt.Sprintf("res-%d", i), "veth", []string{fmt.Sprintf("10.20.2.%d/16", 10+i)}, false, ""))
		if err != nil {
			return err
		}
		wc = cont
	}
	mon, err := watchRoutes(c.Node)
	if err != nil {
		return err
	}
	defer mon.stop()

	if err := b.routeLatency(r, log, ref, a, c, mon); err != nil {
		return err
	}
	if err := b.availability(r, a, c, mon); err != nil {
		return err
	}
	if err := b.moves(r, log, a, bn, mon, wc); err != nil {
		return err
	}
	if err := b.faults(r, f, a, c, wc); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	return b.routingScale(r, f, log)
}

// fabricNode makes a node on the fabric, with galactic-router if routed.
func (b *bench) fabricNode(f *harness.Fabric, name string, routed bool) (*routedNode, error) {
	n, err := b.newNode(name)
	if err != nil {
		return nil, err
	}
	ul, err := f.AttachNode(n.Node)
	if err != nil {
		return nil, err
	}
	// Nodes forward between their workloads and the fabric.
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return nil, fmt.Errorf("forwarding on %s: %v %s", name, err, out)
	}
	rn := &routedNode{node: n, underlay: ul}
	if routed {
		if err := b.startRouter(rn, f); err != nil {
			return nil, err
		}
	}
	return rn, nil
}

func (b *bench) startRouter(n *routedNode, f *harness.Fabric) error {
	r, err := n.LaunchRouter(f.FabricRouterConfig(n.underlay))
	if err != nil {
		return err
	}
	n.router = r
	b.undo = append(b.undo, r.Kill)
	return nil
}

const gobgpdConf = `[global.config]
  as = %d
  router-id = "%s"
  port = -1
[[neighbors]]
  [neighbors.config]
    neighbor-address = "%s"
    peer-as = %d
  [neighbors.timers.config]
    connect-retry = 1
    hold-time = 9
    keepalive-interval = 3
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "l2vpn-evpn"
`

// startGobgpd runs the reference speaker in n, peered with FRR as the
// galactic routers are, and waits for its session.
func (b *bench) startGobgpd(n *routedNode, f *harness.Fabric) error {
	conf := filepath.Join(n.Dir, "gobgpd.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(gobgpdConf, harness.FabricASN, n.underlay, f.RR, harness.FabricASN)), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, gobgpd, "-f", conf, "-p", "--pprof-disable", "--api-hosts", "127.0.0.1:"+gobgpdPort)
	p, err := harness.StartProcess("gobgpd", cmd, filepath.Join(n.Dir, "gobgpd.log"))
	if err != nil {
		return err
	}
	b.undo = append(b.undo, p.Kill)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if e, err := b.run(n.node, nil, nil, gobgpCLI, "-p", gobgpdPort, "neighbor"); err == nil && strings.Contains(string(e.Stdout), "Establ") {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("gobgpd's session with FRR is not established; its log is %s", filepath.Join(n.Dir, "gobgpd.log"))
}

// routedConf is a chain of galactic-cni and galactic-bgp with a VNI.
func routedConf(vpc, att, mode string, addrs []string, handoff bool, announce string) map[string]any {
	vni := routingVNI
	if vpc == scaleVPC {
		vni = scaleVNI
	}
	// The lease outlives every wait here (no GC renews it in the bench), so
	// a successor waits for the holder's DEL, not for the lease to expire.
	h := map[string]any{"enabled": handoff, "waitSeconds": 30, "leaseSeconds": 3600}
	bgp := map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": att, "vni": vni}
	if announce != "" {
		bgp["announce"] = announce
	}
	return map[string]any{"cniVersion": "1.1.0", "name": vpc + "-" + att, "plugins": []any{
		map[string]any{"type": "galactic-cni", "vpc": vpc, "attachment": att, "mode": mode, "routing": "table", "addresses": addrs, "handoff": h},
		bgp,
	}}
}

func confName(conf map[string]any) string { return conf["name"].(string) }

// attach writes conf and ADDs it for a new container, removed at the end.
func (b *bench) attach(n *routedNode, conf map[string]any) (*harness.Netns, error) {
	c, err := b.container()
	if err != nil {
		return nil, err
	}
	if _, err := b.addConf(n, conf, c); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() { _, _ = b.delConf(n, conf, c) })
	return c, nil
}

func (b *bench) addConf(n *routedNode, conf map[string]any, c *harness.Netns) (Exec, error) {
	if err := n.WriteConflistFile(conf); err != nil {
		return Exec{}, err
	}
	return b.cnitool(n.node, "add", confName(conf), c, ifName)
}

func (b *bench) delConf(n *routedNode, conf map[string]any, c *harness.Netns) (Exec, error) {
	if err := n.WriteConflistFile(conf); err != nil {
		return Exec{}, err
	}
	return b.cnitool(n.node, "del", confName(conf), c, ifName)
}

func returned(e Exec) time.Time { return e.Start.Add(e.Wall) }

func host(p string) netip.Prefix {
	a := netip.MustParsePrefix(p).Addr()
	return netip.PrefixFrom(a, a.BitLen())
}

// routeLatency interleaves the reference's add and del through the gobgp
// CLI with galactic's ADD and DEL on A, timing each to FRR's log, and
// galactic's ADD to C's kernel.
func (b *bench) routeLatency(r *RoutingResult, log *frrLog, ref, a, c *routedNode, mon *routeLog) error {
	refPrefix := netip.MustParsePrefix("10.20.0.5/32")
	refRoute := []string{"10.20.0.5/32", "esi", "0", "etag", "0", "rd", ref.underlay.String() + ":1", "rt", fmt.Sprintf("%d:%d", harness.FabricASN, routingVNI),
		"encap", "vxlan", "label", fmt.Sprint(routingVNI), "router-mac", "02:00:00:00:00:01", "nexthop", ref.underlay.String()}
	cli := func(verb string) (Exec, error) {
		return b.run(ref.node, nil, nil, gobgpCLI, append([]string{"-p", gobgpdPort, "global", "rib", "-a", "evpn", verb, "prefix"}, refRoute...)...)
	}
	const warmup = 2
	for i := 0; i < r.Iterations+warmup; i++ {
		keep := i >= warmup
		// The reference.
		m := log.mark()
		e, err := cli("add")
		if err != nil {
			return err
		}
		u, err := log.wait(m, 10*time.Second, update(ref.underlay, refPrefix, false))
		if err != nil {
			return fmt.Errorf("reference add: %w", err)
		}
		refAdd, refAddStart := u.At.Sub(returned(e)), u.At.Sub(e.Start)
		m = log.mark()
		if e, err = cli("del"); err != nil {
			return err
		}
		if u, err = log.wait(m, 10*time.Second, update(ref.underlay, refPrefix, true)); err != nil {
			return fmt.Errorf("reference del: %w", err)
		}
		refDel, refDelStart := u.At.Sub(returned(e)), u.At.Sub(e.Start)

		// galactic: a new address each round, so C has no route for it
		// (a withdrawn one is held there for withdrawHoldSeconds).
		addr := fmt.Sprintf("10.20.1.%d/16", 10+i)
		p := host(addr)
		conf := routedConf(routingVPC, "lat", "tap", []string{addr}, false, "")
		cont, err := b.container()
		if err != nil {
			return err
		}
		m, k := log.mark(), mon.mark()
		e, err = b.addConf(a, conf, cont)
		if err != nil {
			return err
		}
		if u, err = log.wait(m, 10*time.Second, update(a.underlay, p, false)); err != nil {
			return fmt.Errorf("galactic ADD: %w", err)
		}
		add, addStart := u.At.Sub(returned(e)), u.At.Sub(e.Start)
		ev, err := mon.wait(k, 10*time.Second, p, false)
		if err != nil {
			return fmt.Errorf("galactic ADD to C's kernel: %w", err)
		}
		install := ev.Sub(returned(e))
		m = log.mark()
		if e, err = b.delConf(a, conf, cont); err != nil {
			return err
		}
		if u, err = log.wait(m, 10*time.Second, update(a.underlay, p, true)); err != nil {
			return fmt.Errorf("galactic DEL: %w", err)
		}
		if keep {
			r.RefAdd, r.RefDel = append(r.RefAdd, refAdd), append(r.RefDel, refDel)
			r.Add, r.Del = append(r.Add, add), append(r.Del, u.At.Sub(returned(e)))
			r.RefAddStart, r.RefDelStart = append(r.RefAddStart, refAddStart), append(r.RefDelStart, refDelStart)
			r.AddStart, r.DelStart = append(r.AddStart, addStart), append(r.DelStart, u.At.Sub(e.Start))
			r.Install = append(r.Install, install)
		}
	}
	b.say("Routing: to FRR p50 ADD %s DEL %s (reference add %s del %s); to C's kernel p50 %s",
		ms(r.Add.P50()), ms(r.Del.P50()), ms(r.RefAdd.P50()), ms(r.RefDel.P50()), ms(r.Install.P50()))
	return nil
}

// availability times `galactic-cni available` and `unavailable` on A to
// C's kernel.
func (b *bench) availability(r *RoutingResult, a, c *routedNode, mon *routeLog) error {
	const att = "avail"
	addr := "10.20.3.5/16"
	p := host(addr)
	cont, err := b.attach(a, routedConf(routingVPC, att, "tap", []string{addr}, true, "whenAvailable"))
	if err != nil {
		return err
	}
	report := func(verb string) (Exec, error) {
		return b.run(a.node, nil, a.Environ(), filepath.Join(b.env.BinDir, "galactic-cni"), verb,
			"--vpc", routingVPC, "--attachment", att, "--container", harness.ContainerID(cont.Path))
	}
	before, err := passMetrics(a.router)
	if err != nil {
		return err
	}
	for i := 0; i < r.Iterations+1; i++ {
		k := mon.mark()
		e, err := report("available")
		if err != nil {
			return err
		}
		on, err := mon.wait(k, 10*time.Second, p, false)
		if err != nil {
			return fmt.Errorf("available: %w", err)
		}
		k = mon.mark()
		e2, err := report("unavailable")
		if err != nil {
			return err
		}
		off, err := mon.wait(k, 10*time.Second, p, true)
		if err != nil {
			return fmt.Errorf("unavailable: %w", err)
		}
		if i > 0 {
			r.Available = append(r.Available, on.Sub(returned(e)))
			r.Unavailable = append(r.Unavailable, off.Sub(returned(e2)))
		}
	}
	after, err := passMetrics(a.router)
	if err != nil {
		return err
	}
	r.AvailPasses, r.AvailWrites = int(after[1]-before[1]), int(after[2]-before[2])
	if r.AvailPasses > 0 {
		r.AvailPassMean = time.Duration((after[0] - before[0]) / float64(r.AvailPasses) * float64(time.Second))
	}
	b.say("Routing: available → C p50 %s, unavailable → C p50 %s; A's router: %d passes of %s on average, %d status writes",
		ms(r.Available.P50()), ms(r.Unavailable.P50()), r.AvailPasses, ms(r.AvailPassMean), r.AvailWrites)
	return nil
}

// passMetrics reads a router's pass duration sum (seconds), its pass
// count and its status writes.
func passMetrics(r *harness.Router) ([3]float64, error) {
	var v [3]float64
	for i, name := range []string{"galactic_router_reconcile_duration_seconds_sum", "galactic_router_reconcile_duration_seconds_count", "galactic_router_status_writes_total"} {
		x, err := r.Metric(name)
		if err != nil {
			return v, err
		}
		v[i] = x
	}
	return v, nil
}

// moves moves an attachment between A and B while C pings it: with
// handoff (A's DEL releases the lease B's ADD waits for) and without (B's
// ADD while A is live, A's DEL later).
func (b *bench) moves(r *RoutingResult, log *frrLog, a, bn *routedNode, mon *routeLog, from *harness.Netns) error {
	for _, handoff := range []bool{true, false} {
		att, addr, count := "move-h", "10.20.4.5/16", 5
		if !handoff {
			att, addr, count = "move-n", "10.20.4.6/16", 3
		}
		p := host(addr)
		conf := routedConf(routingVPC, att, "veth", []string{addr}, handoff, "")
		holder, other := a, bn
		cont, err := b.container()
		if err != nil {
			return err
		}
		if _, err := b.addConf(holder, conf, cont); err != nil {
			return err
		}
		var last time.Time
		for i := 0; i < count; i++ {
			// The old holder keeps the new holder's route from the move
			// before for withdrawHoldSeconds and would forward C's packets
			// to B without any routing change: moves are spaced past it.
			time.Sleep(time.Until(last.Add(moveSpacing)))
			last = time.Now()
			next, err := b.container()
			if err != nil {
				return err
			}
			m, err := b.moveOnce(log, mon, from, p, att, conf, holder, other, cont, next, handoff)
			if err != nil {
				return fmt.Errorf("move %d (handoff %v): %w", i+1, handoff, err)
			}
			r.Moves = append(r.Moves, m)
			b.say("Routing: move %d (handoff %v): blackout %s, of it waiting %s; FRR %d withdrawn %d announced; C %d route changes",
				i+1, handoff, ms(m.Blackout), ms(m.Wait), m.Withdrawn, m.Announced, m.KernelChanges)
			holder, other, cont = other, holder, next
		}
		if _, err := b.delConf(holder, conf, cont); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) moveOnce(log *frrLog, mon *routeLog, from *harness.Netns, p netip.Prefix, att string, conf map[string]any, holder, other *routedNode, cont, next *harness.Netns, handoff bool) (MoveResult, error) {
	m := MoveResult{Handoff: handoff}
	pg, err := from.StartPinger(p.Addr(), 10*time.Millisecond)
	if err != nil {
		return m, err
	}
	stopped := false
	defer func() {
		if !stopped {
			pg.Stop()
		}
	}()
	if err := waitReplies(pg, 10*time.Second); err != nil {
		return m, fmt.Errorf("before the move: %w", err)
	}
	lm, k := log.mark(), mon.mark()
	var add Exec
	if handoff {
		// B's ADD waits for the lease until A's DEL releases it.
		type result struct {
			e   Exec
			err error
		}
		done := make(chan result, 1)
		go func() { e, err := b.addConf(other, conf, next); done <- result{e, err} }()
		time.Sleep(time.Second)
		if _, err := b.delConf(holder, conf, cont); err != nil {
			<-done
			return m, err
		}
		res := <-done
		if res.err != nil {
			return m, res.err
		}
		add = res.e
	} else {
		if add, err = b.addConf(other, conf, next); err != nil {
			return m, err
		}
	}
	// Traffic back, then time for the late updates of the move.
	if err := waitReplies(pg, 20*time.Second); err != nil {
		return m, fmt.Errorf("after the move: %w", err)
	}
	if !handoff {
		time.Sleep(2 * time.Second)
		if _, err := b.delConf(holder, conf, cont); err != nil {
			return m, err
		}
	}
	time.Sleep(3 * time.Second)
	stopped = true
	s := pg.Stop()
	m.Blackout, m.Lost = s.LongestGap, s.Lost
	if handoff && !s.LongestGapFrom.IsZero() {
		// The wait ends when B holds the lease; the lease records that to
		// the microsecond.
		lease, err := b.env.Kube.CoordinationV1().Leases(harness.Namespace).Get(b.ctx, names.Lease(routingVPC, att), metav1.GetOptions{})
		if err != nil {
			return m, err
		}
		if lease.Spec.AcquireTime == nil || !strings.HasPrefix(derefString(lease.Spec.HolderIdentity), other.Name+"/") {
			return m, fmt.Errorf("the lease is not %s's after the move: %+v", other.Name, lease.Spec)
		}
		m.Wait = min(max(lease.Spec.AcquireTime.Sub(s.LongestGapFrom), 0), s.LongestGap)
	}
	if at, err := mon.wait(k, 0, p, false); err == nil {
		m.KernelAfterAdd = at.Sub(returned(add))
	}
	for _, u := range log.since(lm) {
		if u.Prefix == p {
			if u.Withdrawn {
				m.Withdrawn++
			} else {
				m.Announced++
			}
		}
	}
	m.KernelChanges = mon.count(k, p)
	return m, nil
}

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// waitReplies waits until the pinger has an answer sent after now.
func waitReplies(pg *harness.Pinger, limit time.Duration) error {
	start := time.Now()
	base := pg.Stats().Received
	for time.Since(start) < limit+time.Second {
		time.Sleep(100 * time.Millisecond)
		// Stats leave out the last second, so wait for it to pass.
		if time.Since(start) > time.Second && pg.Stats().Received > base {
			return nil
		}
	}
	return fmt.Errorf("no ping reply within %s", limit)
}

// routingScale puts 10,000 prefixes on one node (S) and times their way
// to FRR and to a receiver (R), the router's memory and API requests, and
// a SIGTERM restart.
func (b *bench) routingScale(r *RoutingResult, f *harness.Fabric, log *frrLog) error {
	sNode, err := b.fabricNode(f, "rs", false)
	if err != nil {
		return err
	}
	rNode, err := b.fabricNode(f, "rr", false)
	if err != nil {
		return err
	}
	// One real ADD on each makes the VPC's routing domain.
	if _, err := b.attach(sNode, routedConf(scaleVPC, "dom", "tap", []string{"10.63.0.5/16"}, false, "")); err != nil {
		return err
	}
	if _, err := b.attach(rNode, routedConf(scaleVPC, "dom", "tap", []string{"10.63.0.6/16"}, false, "")); err != nil {
		return err
	}
	live, err := b.container()
	if err != nil {
		return err
	}
	prefixes, err := b.scaleAdverts(sNode.Name, live.Path)
	if err != nil {
		return err
	}
	want := map[netip.Prefix]bool{}
	for _, p := range prefixes {
		want[p] = true
	}
	s := &ScaleResult{Prefixes: len(prefixes)}
	r.Scale = s

	lm := log.mark()
	start0 := time.Now()
	if err := b.startRouter(sNode, f); err != nil {
		return err
	}
	last, err := log.waitAll(lm, 60*time.Second, sNode.underlay, want, false)
	if err != nil {
		return fmt.Errorf("S's prefixes to FRR: %w", err)
	}
	s.ToFRR = last.Sub(start0)
	b.say("Routing: %d prefixes in FRR %s after S's router started", len(prefixes), ms(s.ToFRR))

	start := time.Now()
	if err := b.startRouter(rNode, f); err != nil {
		return err
	}
	got := 0
	for deadline := time.Now().Add(60 * time.Second); got < len(prefixes); time.Sleep(50 * time.Millisecond) {
		if got, err = countRoutes(rNode.Node, scaleVPC, want); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("R installed %d of %d routes within a minute", got, len(prefixes))
		}
	}
	s.Installed = time.Since(start)
	b.say("Routing: %d remote routes installed on R %s after its router started", got, ms(s.Installed))

	// Settle, then the memory and the steady state's requests.
	time.Sleep(5 * time.Second)
	s.SessionUp = logged(sNode.router, start0, `"state":"ESTABLISHED"`)
	s.RemoteSessionUp = logged(rNode.router, start, `"state":"ESTABLISHED"`)
	s.RemoteFirst = logged(rNode.router, start, `"msg":"remote routes"`)
	if s.RSS, s.HWM, err = procMemory(sNode.router.Pid()); err != nil {
		return err
	}
	if s.RemoteRSS, s.RemoteHWM, err = procMemory(rNode.router.Pid()); err != nil {
		return err
	}
	// The restart goes through the counting proxy (the timings above do
	// not), so its requests are counted from its start.
	if err := sNode.viaProxy(b, true); err != nil {
		return err
	}
	if s.FirstWrites, err = sNode.router.Metric("galactic_router_status_writes_total"); err != nil {
		return err
	}
	restartAt, mark := time.Now(), b.proxy.Mark()
	rs, err := b.restart(log, sNode, rNode, want)
	if err != nil {
		return err
	}
	r.Restart = rs
	// The status writes of the start (client-go's default 5 requests per
	// second) end before the steady window begins.
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		reqs := b.proxy.Begun(AgentRouter, restartAt, time.Now())
		if len(reqs) > 0 && time.Since(reqs[len(reqs)-1].At) > 5*time.Second {
			s.StartupTook = reqs[len(reqs)-1].At.Sub(restartAt)
			break
		}
	}
	steadyFrom := time.Now()
	time.Sleep(steadyWindow)
	steadyTo := time.Now()
	s.Startup = b.proxy.Begun(AgentRouter, restartAt, steadyFrom)
	s.Steady = b.proxy.Begun(AgentRouter, steadyFrom, steadyTo)
	for _, q := range b.proxy.Since(mark, AgentRouter) {
		if q.Resource() == "bgpadvertisements/status" && q.At.Before(steadyFrom) {
			s.Writes = append(s.Writes, q)
		}
	}
	b.say("Routing: S's router RSS %s (peak %s), R's %s; requests from its restart (last %s after it) %s; in %s of steady state %s",
		mib(s.RSS), mib(s.HWM), mib(s.RemoteRSS), ms(s.StartupTook), summarize(s.Startup), steadyWindow, summarize(s.Steady))
	return nil
}

// scaleAdverts creates the advertisements of node on the API server
// directly: scaleAdverts × scalePerAdvert prefixes, every entry live
// (netns exists).
func (b *bench) scaleAdverts(node, netns string) ([]netip.Prefix, error) {
	var all []netip.Prefix
	api := b.env.API.BGPAdvertisements(harness.Namespace)
	for i := 0; i < scaleAdverts; i++ {
		att := fmt.Sprintf("scale-%d", i)
		var entries []v1alpha1.ContainerEntry
		for j := 0; j < scalePerAdvert; j += scalePerEntry {
			e := v1alpha1.ContainerEntry{ContainerID: fmt.Sprintf("bench-%d-%d", i, j), IfName: ifName, Netns: netns}
			for k := j; k < min(j+scalePerEntry, scalePerAdvert); k++ {
				n := i*scalePerAdvert + k
				p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 64, byte(n / 250), byte(n%250 + 1)}), 32)
				e.Prefixes = append(e.Prefixes, v1alpha1.Prefix(p.String()))
				all = append(all, p)
			}
			entries = append(entries, e)
		}
		adv := &v1alpha1.BGPAdvertisement{
			ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement(scaleVPC, att, node), Namespace: harness.Namespace, Labels: names.AdvertisementLabels(scaleVPC, att, node)},
			Spec: v1alpha1.BGPAdvertisementSpec{VPC: scaleVPC, Attachment: att, Node: node, VNI: scaleVNI, Announce: v1alpha1.AnnounceAlways,
				Prefixes: advert.Union(entries), Containers: entries},
		}
		if _, err := api.Create(b.ctx, adv, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating %s: %w", adv.Name, err)
		}
		name := adv.Name
		b.undo = append(b.undo, func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	return all, nil
}

// restart sends S's router SIGTERM, starts it again and counts what FRR
// received from S until every prefix is announced again.
func (b *bench) restart(log *frrLog, sNode, rNode *routedNode, want map[netip.Prefix]bool) (*RestartResult, error) {
	rs := &RestartResult{Prefixes: len(want)}
	before, err := rNode.router.Metric("galactic_router_kernel_route_changes_total")
	if err != nil {
		return nil, err
	}
	beforeUp, err := rNode.router.Metric("galactic_router_received_updates_total")
	if err != nil {
		return nil, err
	}
	lm := log.mark()
	start := time.Now()
	sNode.router.Terminate()
	if err := sNode.router.Start(); err != nil {
		return nil, err
	}
	last, err := log.waitAll(lm, 60*time.Second, sNode.underlay, want, false)
	if err != nil {
		return nil, fmt.Errorf("after the restart: %w", err)
	}
	rs.Back = last.Sub(start)
	// Past the receiver's withdrawal hold, so a route it dropped shows.
	time.Sleep(time.Until(start.Add(15 * time.Second)))
	for _, u := range log.since(lm) {
		if u.Peer == sNode.underlay.String() && u.Withdrawn {
			rs.Withdrawn++
		}
	}
	rs.Notifications = log.notesSince(lm)
	after, err := rNode.router.Metric("galactic_router_kernel_route_changes_total")
	if err != nil {
		return nil, err
	}
	rs.ReceiverChanges = after - before
	afterUp, err := rNode.router.Metric("galactic_router_received_updates_total")
	if err != nil {
		return nil, err
	}
	rs.ReceiverUpdates = afterUp - beforeUp
	b.say("Routing: SIGTERM restart: %d withdrawals, %d notifications at FRR, every prefix back after %s; R received %v updates and made %v route changes",
		rs.Withdrawn, rs.Notifications, ms(rs.Back), rs.ReceiverUpdates, rs.ReceiverChanges)
	return rs, nil
}

// logged is the time from start to the first line of the router's log
// that contains what (0 if none).
func logged(r *harness.Router, start time.Time, what string) time.Duration {
	for _, line := range strings.Split(r.Log(), "\n") {
		if !strings.Contains(line, what) {
			continue
		}
		var entry struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Time.After(start) {
			return entry.Time.Sub(start)
		}
	}
	return 0
}

// countRoutes counts want's routes in the VPC's table in n.
func countRoutes(n *harness.Node, vpc string, want map[netip.Prefix]bool) (int, error) {
	got := 0
	err := n.Do(func() error {
		d, err := routing.Find(vpc)
		if err != nil || d == nil {
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: d.Table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if p, ok := prefixOf(r.Dst); ok && want[p] {
				got++
			}
		}
		return nil
	})
	return got, err
}

// procMemory reads VmRSS and VmHWM of pid, in bytes.
func procMemory(pid int) (rss, hwm int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			rss = kb << 10
		} else if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			hwm = kb << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS for pid %d", pid)
	}
	return rss, hwm, nil
}

// summarize counts requests by verb and resource: "list bgpadvertisements ×1, ...".
func summarize(reqs []Request) string {
	counts := map[string]int{}
	var order []string
	for _, q := range reqs {
		k := q.Verb() + " " + q.Resource()
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	if len(order) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// frrLog follows FRR's log: the updates received so far, in order, and
// the notifications, each at the position of the updates after it.
type frrLog struct {
	f     *harness.Fabric
	off   int64
	ups   []harness.LogUpdate
	notes []noteBatch
}

type noteBatch struct{ at, n int }

func (l *frrLog) poll() error {
	ups, notes, next, err := l.f.ReadUpdates(l.off)
	if err != nil {
		return err
	}
	l.off = next
	if notes > 0 {
		l.notes = append(l.notes, noteBatch{len(l.ups), notes})
	}
	l.ups = append(l.ups, ups...)
	return nil
}

// mark is the position after everything logged so far.
func (l *frrLog) mark() int {
	_ = l.poll()
	return len(l.ups)
}

func (l *frrLog) since(m int) []harness.LogUpdate {
	_ = l.poll()
	return l.ups[m:]
}

func (l *frrLog) notesSince(m int) int {
	_ = l.poll()
	n := 0
	for _, b := range l.notes {
		if b.at >= m {
			n += b.n
		}
	}
	return n
}

func update(peer netip.Addr, p netip.Prefix, withdrawn bool) func(harness.LogUpdate) bool {
	return func(u harness.LogUpdate) bool {
		return u.Peer == peer.String() && u.Prefix == p && u.Withdrawn == withdrawn
	}
}

// wait polls the log until an update after m matches.
func (l *frrLog) wait(m int, limit time.Duration, match func(harness.LogUpdate) bool) (harness.LogUpdate, error) {
	deadline := time.Now().Add(limit)
	for {
		if err := l.poll(); err != nil {
			return harness.LogUpdate{}, err
		}
		for _, u := range l.ups[m:] {
			if match(u) {
				return u, nil
			}
		}
		if time.Now().After(deadline) {
			return harness.LogUpdate{}, fmt.Errorf("not in FRR's log within %s", limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitAll waits until every prefix of want had an update from peer after
// m and returns the time of the last.
func (l *frrLog) waitAll(m int, limit time.Duration, peer netip.Addr, want map[netip.Prefix]bool, withdrawn bool) (time.Time, error) {
	deadline := time.Now().Add(limit)
	seen := map[netip.Prefix]bool{}
	var last time.Time
	for i := m; ; {
		if err := l.poll(); err != nil {
			return last, err
		}
		for ; i < len(l.ups); i++ {
			u := l.ups[i]
			if u.Peer == peer.String() && u.Withdrawn == withdrawn && want[u.Prefix] && !seen[u.Prefix] {
				seen[u.Prefix], last = true, u.At
			}
		}
		if len(seen) == len(want) {
			return last, nil
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("%d of %d prefixes in FRR's log within %s", len(seen), len(want), limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// routeLog records a node's kernel route changes as netlink reports them.
type routeLog struct {
	mu   sync.Mutex
	ev   []routeEvent
	done chan struct{}
}

type routeEvent struct {
	at  time.Time
	dst netip.Prefix
	del bool
}

// watchRoutes subscribes to n's route changes; the socket is made inside
// n, so it reports n's.
func watchRoutes(n *harness.Node) (*routeLog, error) {
	l := &routeLog{done: make(chan struct{})}
	ch := make(chan netlink.RouteUpdate, 4096)
	err := n.Do(func() error {
		return netlink.RouteSubscribeWithOptions(ch, l.done, netlink.RouteSubscribeOptions{ReceiveBufferSize: 1 << 22})
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for u := range ch {
			at := time.Now()
			p, ok := prefixOf(u.Route.Dst)
			if !ok || u.Route.Table == unix.RT_TABLE_LOCAL {
				continue
			}
			l.mu.Lock()
			l.ev = append(l.ev, routeEvent{at: at, dst: p, del: u.Type == unix.RTM_DELROUTE})
			l.mu.Unlock()
		}
	}()
	return l, nil
}

func (l *routeLog) stop() { close(l.done) }

func (l *routeLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ev)
}

// wait returns the time of the first change of p after m (an add, or a
// removal when del).
func (l *routeLog) wait(m int, limit time.Duration, p netip.Prefix, del bool) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		l.mu.Lock()
		for _, e := range l.ev[m:] {
			if e.dst == p && e.del == del {
				l.mu.Unlock()
				return e.at, nil
			}
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s not changed in the kernel within %s", p, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (l *routeLog) count(m int, p netip.Prefix) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.ev[m:] {
		if e.dst == p {
			n++
		}
	}
	return n
}

func prefixOf(d *net.IPNet) (netip.Prefix, bool) {
	if d == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(d.IP)
	bits, _ := d.Mask.Size()
	if !ok {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a.Unmap(), bits), true
}

// The routing section's goals: a route in FRR within 50 ms p50 and 250 ms
// p99 of the CNI verb, at the receiving node's kernel within 100 ms and
// 500 ms (also for an availability report), 10,000 prefixes announced
// within 5 s and in 200 MiB, installed within 5 s and in 250 MiB, and a
// move's routing part within 200 ms.
const (
	goalFRRP50       = 50 * time.Millisecond
	goalFRRP99       = 250 * time.Millisecond
	goalKernelP50    = 100 * time.Millisecond
	goalKernelP99    = 500 * time.Millisecond
	goalScaleFRR     = 5 * time.Second
	goalScaleRSS     = 200 << 20
	goalRemoteRSS    = 250 << 20
	goalMoveRouting  = 200 * time.Millisecond
	goalRemoteInstal = 5 * time.Second
)

// goal is one row of the section's goals table; key names it for the
// reason given when it is missed.
type goal struct {
	key, what, measured, ref string
	met                      bool
	miss                     string
}

func latencyGoals(key, what string, s Sample, p50, p99 time.Duration) []goal {
	g := []goal{
		{key: key + "-p50", what: what + " p50", measured: ms(s.P50()), ref: "≤ " + ms(p50), met: s.P50() <= p50},
		{key: key + "-p99", what: what + " p99", measured: ms(s.P99()), ref: "≤ " + ms(p99), met: s.P99() <= p99},
	}
	for i, limit := range []time.Duration{p50, p99} {
		if !g[i].met {
			v := []time.Duration{s.P50(), s.P99()}[i]
			g[i].miss = fmt.Sprintf("%s over (%.1fx the goal)", ms(v-limit), float64(v)/float64(limit))
		}
	}
	return g
}

func limitGoal(key, what string, v, limit time.Duration) goal {
	g := goal{key: key, what: what, measured: ms(v), ref: fmt.Sprintf("≤ %s", limit), met: v <= limit}
	if !g.met {
		g.miss = fmt.Sprintf("%s over (%.1fx the goal)", ms(v-limit), float64(v)/float64(limit))
	}
	return g
}

func memGoal(key, what string, v, limit int64) goal {
	g := goal{key: key, what: what, measured: mib(v), ref: "≤ " + mib(limit), met: v <= limit}
	if !g.met {
		g.miss = fmt.Sprintf("%s over", mib(v-limit))
	}
	return g
}

// watchesAndLists judges "one watch and no periodic lists": one watch of
// the node's advertisements, and no list or new watch in the steady window.
func (s *ScaleResult) watchesAndLists() goal {
	advWatches := 0
	for _, q := range s.Startup {
		if q.Verb() == "watch" && q.Resource() == "bgpadvertisements" {
			advWatches++
		}
	}
	periodic := 0
	for _, q := range s.Steady {
		if v := q.Verb(); v == "list" || v == "watch" {
			periodic++
		}
	}
	g := goal{key: "watches", what: "the announcing router's API requests in a steady state",
		measured: fmt.Sprintf("%d watch of bgpadvertisements; %d requests in %s of steady state", advWatches, len(s.Steady), steadyWindow),
		ref:      "one watch, no periodic list", met: advWatches == 1 && periodic == 0}
	if !g.met {
		g.miss = fmt.Sprintf("%d watches of bgpadvertisements, %d lists or watches in the steady window", advWatches, periodic)
	}
	return g
}

func (r *RoutingResult) moves(handoff bool) []MoveResult {
	var out []MoveResult
	for _, m := range r.Moves {
		if m.Handoff == handoff {
			out = append(out, m)
		}
	}
	return out
}

func moveSample(ms []MoveResult, f func(MoveResult) time.Duration) Sample {
	var s Sample
	for _, m := range ms {
		s = append(s, f(m))
	}
	return s
}

// goals judges the section against its goals.
func (r *RoutingResult) goals() []goal {
	var gs []goal
	gs = append(gs, latencyGoals("add-frr", "ADD returned → route in FRR", r.Add, goalFRRP50, goalFRRP99)...)
	gs = append(gs, latencyGoals("del-frr", "DEL returned → withdrawn in FRR", r.Del, goalFRRP50, goalFRRP99)...)
	if s := r.Scale; s != nil {
		gs = append(gs, limitGoal("scale-frr", fmt.Sprintf("%s prefixes on one node: router start → all in FRR", thousands(s.Prefixes)), s.ToFRR, goalScaleFRR),
			memGoal("scale-rss", "router RSS with them", s.RSS, goalScaleRSS), s.watchesAndLists())
	}
	if rs := r.Restart; rs != nil {
		g := goal{key: "restart", what: "routes withdrawn at FRR by a graceful restart (SIGTERM)",
			measured: fmt.Sprintf("%d of %s, %d notifications", rs.Withdrawn, thousands(rs.Prefixes), rs.Notifications), ref: "none", met: rs.Withdrawn == 0}
		if !g.met {
			g.miss = fmt.Sprintf("%d withdrawals", rs.Withdrawn)
		}
		gs = append(gs, g)
	}
	gs = append(gs, latencyGoals("install", "announce on A → installed in C's kernel", r.Install, goalKernelP50, goalKernelP99)...)
	if s := r.Scale; s != nil {
		gs = append(gs, limitGoal("remote-install", fmt.Sprintf("%s remote routes: installed after the router starts", thousands(s.Prefixes)), s.Installed, goalRemoteInstal),
			memGoal("remote-rss", "the receiving router's RSS", s.RemoteRSS, goalRemoteRSS))
	}
	if hm := r.moves(true); len(hm) > 0 {
		gs = append(gs, limitGoal("move", "move with handoff: blackout minus the handoff wait, p50", moveSample(hm, MoveResult.Routing).P50(), goalMoveRouting))
	}
	gs = append(gs, latencyGoals("available", "`available` returned → route in another node's kernel", r.Available, goalKernelP50, goalKernelP99)...)
	gs = append(gs, latencyGoals("unavailable", "`unavailable` returned → gone from it", r.Unavailable, goalKernelP50, goalKernelP99)...)
	return gs
}

// routingTargets are the routing section's goals as targets.
func (r *Results) routingTargets() []Target {
	if r.Routing == nil || r.Routing.Skipped != "" {
		return nil
	}
	var ts []Target
	for _, g := range r.Routing.goals() {
		ts = append(ts, Target{Key: "routing/" + g.key, Section: "routing", What: g.what, Measured: g.measured, Ref: g.ref, Met: g.met, Miss: g.miss})
	}
	return ts
}

// reason says where a missed goal's time goes, from this run's figures.
func (r *RoutingResult) reason(key string) string {
	_, k, _ := strings.Cut(key, "/")
	switch k {
	case "add-frr-p50", "del-frr-p50":
		return fmt.Sprintf("The reference takes %s from its CLI to FRR, so the gap is the API server's watch delivery and the router's pass, not BGP.", ms(r.RefAdd.P50()))
	case "add-frr-p99", "del-frr-p99", "install-p99", "available-p99", "unavailable-p99":
		return "The p99 of a few dozen rounds is its slowest round or two; on two shared cores a router pass or the API server's watch delivery that waits for the CPU sets it."
	case "install-p50":
		return "The route goes from A's router through FRR to C's router: the watch delivery, A's pass and update, FRR's reflection and C's pass."
	case "available-p50", "unavailable-p50":
		return fmt.Sprintf("A's router's passes took %s on average during these rounds (%d status writes); a change waits for the pass before it.", ms(r.AvailPassMean), r.AvailWrites)
	case "move":
		return "The routing part is B's advertisement to C's kernel: the watch delivery, B's router pass and update, FRR's reflection and C's pass."
	case "scale-frr":
		return fmt.Sprintf("Of it, %s went until the session with FRR was established: GoBGP makes a new peer's first connection attempt a random 1.5 to 2 s after the peer is added.", ms(r.Scale.SessionUp))
	case "remote-install":
		return fmt.Sprintf("The receiving router's session came up %s after its start, its first routes %s after; the rest is installing them as FRR sends them.", ms(r.Scale.RemoteSessionUp), ms(r.Scale.RemoteFirst))
	case "scale-rss", "remote-rss":
		return "The router's heap holds GoBGP's copy of the paths and its own; `go_gc_heap_live_bytes` in its metrics shows what a collection keeps."
	case "watches":
		return "A steady router makes no request: its watches deliver every change. Extra lists or watches in the window mean a watch ended and was listed again."
	case "restart":
		return "A router stopped with SIGTERM exits without a withdrawal or a Cease; withdrawals at FRR mean the process withdrew before it exited."
	}
	panic("no reason for routing goal " + key)
}

func renderRouting(w *strings.Builder, res *Results) {
	r := res.Routing
	if r == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, res, "routing")
	p("")
	if r.Skipped != "" {
		p("Not measured in this run: %s.", r.Skipped)
		p("")
		return
	}
	p("galactic-router on nodes peered with FRR's `bgpd` as the `l2vpn evpn` route reflector in a fabric namespace (the test fabric of the routing tests), against a reference in the same run: Debian's `gobgpd` (%s) in a node namespace of its own, peered with the same FRR, and its `gobgp` CLI adding and deleting the same kind of type-5 route (`gobgp global rib -a evpn add prefix 10.20.0.5/32 esi 0 etag 0 rd 192.0.2.11:1 rt 65000:10100 encap vxlan label 10100 router-mac 02:00:00:00:00:01 nexthop 192.0.2.11`, then `del`). \"In FRR\" is the timestamp (microseconds) of the update line FRR's log writes on receiving it (`debug bgp updates in`), \"in the kernel\" the moment a netlink route monitor in the receiving node gets the change; both are measured from the moment the command (cnitool, the gobgp CLI, `galactic-cni available`) returned. The routers run with their defaults (resync 30 s, withdrawHoldSeconds 10); every node keeps one resident attachment of the VPC, so its routing domain exists, as on a node that runs workloads. %d rounds after 2 warm-up rounds, the reference and galactic taking turns. galactic's ADD gives the attachment a new address each round (tap mode, handoff off), so C never holds a route for it yet. Two shared cores run the API server, etcd, FRR, gobgpd, up to five galactic routers and the bench: the figures are noisy, and with this many rounds the slowest round or two set the p99.",
		gobgpVersion(), r.Iterations)
	p("")
	p("| goal | measured | compared with | |")
	p("|---|---|---|---|")
	for _, g := range r.goals() {
		verdict := "met"
		if !g.met {
			verdict = "**missed**: " + g.miss
		}
		p("| %s | %s | %s | %s |", g.what, g.measured, g.ref, verdict)
	}
	p("")
	p("| from → to | p50 | p90 | p99 | max | p50 from the command's start | that p50 / the reference's |")
	p("|---|---|---|---|---|---|---|")
	row := func(name string, s, start, refStart Sample) {
		from, q := "—", "—"
		if start != nil {
			from = ms(start.P50())
		}
		if refStart != nil {
			q = ratio(Ratio(start.P50(), refStart.P50()))
		}
		p("| %s | %s | %s | %s | %s | %s | %s |", name, ms(s.P50()), ms(s.P90()), ms(s.P99()), ms(s.Quantile(1)), from, q)
	}
	row("reference: `gobgp ... add` returned → in FRR", r.RefAdd, r.RefAddStart, nil)
	row("reference: `gobgp ... del` returned → withdrawn in FRR", r.RefDel, r.RefDelStart, nil)
	row("galactic: ADD returned (cnitool, galactic-cni + galactic-bgp with `vni`) → in FRR", r.Add, r.AddStart, r.RefAddStart)
	row("galactic: DEL returned → withdrawn in FRR", r.Del, r.DelStart, r.RefDelStart)
	row("galactic: ADD on A returned → installed in C's kernel", r.Install, nil, nil)
	row("`galactic-cni available` returned → installed in C's kernel (`announce: whenAvailable`)", r.Available, nil, nil)
	row("`galactic-cni unavailable` returned → removed from C's kernel (drain marking)", r.Unavailable, nil, nil)
	p("")
	if r.AvailPasses > 0 {
		p("During the %d availability rounds (each an `available` and an `unavailable`), A's router ran %d reconcile passes of %s on average (its `galactic_router_reconcile_duration_seconds`) and wrote %d status updates; a change waits for the pass before it to end. The router writes status apart from the passes that program routes, through an API client limited to %d requests a second (burst %d).",
			r.Iterations+1, r.AvailPasses, ms(r.AvailPassMean), r.AvailWrites, routerQPS, routerBurst)
		p("")
	}
	p("A negative figure means the route was in FRR before the command returned: galactic-bgp is the last plugin of the ADD chain and the first of DEL (galactic-cni's removal of the interface follows it), and cnitool and the gobgp CLI still exit after the work is done. The ratio to the reference is therefore taken from the commands' starts, where both figures are positive: it compares a whole CNI ADD (two plugin processes, the API server's write and watch delivery, the router's pass) with a gRPC call to a running gobgpd.")
	p("")
	if hm, nm := r.moves(true), r.moves(false); len(hm)+len(nm) > 0 {
		p("**Moves.** An attachment (veth, so the container answers) moves between A and B while a pinger in a container on C sends an echo request every 10 ms. With handoff, B's ADD starts first and waits for the lease; a second later A's DEL releases it (galactic-bgp's DEL withdraws A's route; galactic-cni's unroutes the interface and sets it down, releases the lease, and deletes the interface meanwhile), then B's ADD attaches and publishes. *Blackout* is the pinger's longest time between two answered requests (10 ms without a loss); *of it, the handoff wait* is the part before B held the lease (the rest of A's DEL after its interface stopped, and B's ADD noticing the release: it watches the lease, so that is the watch event's way to it), from the lease's `acquireTime` (microseconds); *routing* is the rest, the blackout minus the handoff wait: B's galactic-cni attaching after the lease, galactic-bgp publishing, and the route reaching C's kernel. The route can reach C before B's ADD returns: galactic-bgp's move fallback (listing and deleting the attachment's advertisements on other nodes) runs after it publishes. Moves start %s apart, past the routers' withdrawal hold: the old holder keeps a route to the node that held the attachment before it for that long, and moving back within it would forward C's packets through the old holder with no routing change at all. Without handoff, B's ADD runs while A's instance is live (its move fallback deletes A's advertisement) and A's DEL follows 2 s later. Updates are what FRR received about the prefix during the move; route changes what C's kernel saw for it.", moveSpacing)
		p("")
		p("| move | moves | blackout p50 | blackout max | of it, handoff wait p50 | routing p50 | routing max | C's route change after B's ADD returned, p50 | withdrawals at FRR per move | announcements at FRR per move | route changes at C per move |")
		p("|---|---|---|---|---|---|---|---|---|---|---|")
		for _, set := range []struct {
			name string
			ms   []MoveResult
		}{{"with handoff", hm}, {"without handoff", nm}} {
			if len(set.ms) == 0 {
				continue
			}
			bo := moveSample(set.ms, func(m MoveResult) time.Duration { return m.Blackout })
			wt := moveSample(set.ms, func(m MoveResult) time.Duration { return m.Wait })
			rt := moveSample(set.ms, MoveResult.Routing)
			ka := moveSample(set.ms, func(m MoveResult) time.Duration { return m.KernelAfterAdd })
			waitCol, rtCol, rtMax := ms(wt.P50()), ms(rt.P50()), ms(rt.Quantile(1))
			if set.name == "without handoff" {
				waitCol, rtCol, rtMax = "no wait", "= blackout", "= blackout"
			}
			p("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |", set.name, len(set.ms), ms(bo.P50()), ms(bo.Quantile(1)), waitCol, rtCol, rtMax, ms(ka.P50()),
				perMove(set.ms, func(m MoveResult) int { return m.Withdrawn }), perMove(set.ms, func(m MoveResult) int { return m.Announced }),
				perMove(set.ms, func(m MoveResult) int { return m.KernelChanges }))
		}
		p("")
	}
	renderFaults(p, r.Faults)
	if s := r.Scale; s != nil {
		named, codes := map[string]bool{}, map[int]int{}
		for _, q := range s.Writes {
			named[q.name()] = true
			codes[q.Status]++
		}
		var codeList []string
		for c, n := range codes {
			codeList = append(codeList, fmt.Sprintf("%d× %d", n, c))
		}
		sort.Strings(codeList)
		restartWrites := "none"
		if n := len(s.Writes); n > 0 {
			restartWrites = fmt.Sprintf("%d for %d of them (%s) within %s", n, len(named), strings.Join(codeList, ", "), ms(s.Writes[n-1].At.Sub(s.Writes[0].At)))
		}
		p("**Scale.** %s prefixes on one node: %d advertisements of %d prefixes (in entries of %d, under the CRD's limits of 256 per advertisement and 64 per entry), created on the API server directly, every entry live (its netns exists); one real ADD made the VPC's routing domain. The router starts after they exist: %s from its start to the last of them in FRR's log, of which %s until its session with FRR was established (GoBGP makes a new peer's first connection attempt a random 1.5 to 2 s after the peer is added, so every start pays this). With them announced it holds %s resident (peak %s). A second node with the VPC's routing domain starts its router once they are all in FRR and has all %s routes in the VPC's table %s later (its session up after %s, the first routes installed after %s, so %s from the session to the last route), holding %s (peak %s).",
			thousands(s.Prefixes), scaleAdverts, scalePerAdvert, scalePerEntry, ms(s.ToFRR), ms(s.SessionUp), mib(s.RSS), mib(s.HWM), thousands(s.Prefixes), ms(s.Installed), ms(s.RemoteSessionUp), ms(s.RemoteFirst), ms(s.Installed-s.RemoteSessionUp), mib(s.RemoteRSS), mib(s.RemoteHWM))
		p("")
		p("The announcing router's API requests, counted through the counting proxy from its restart below (user agent `%s`, each counted when it arrives, so an open watch counts; the timings above do not go through the proxy): from that start %s, the last %s after it; in %s of steady state after that, %s.",
			AgentRouter, summarize(s.Startup), ms(s.StartupTook), steadyWindow, summarize(s.Steady))
		p("")
		p("Status writes: the first start wrote %.0f for the %d advertisements (the router's `galactic_router_status_writes_total`); the restart %s. The router writes status apart from routing, through an API client limited to %d requests a second (burst %d): the routes never wait for these writes, but beyond the burst a node's conditions lag its routes after every start by its number of writes divided by that rate: with one advertisement per attachment (the usual case) and %.1f writes each as at the first start, 250 attachments take about %s.",
			s.FirstWrites, scaleAdverts, restartWrites,
			routerQPS, routerBurst, s.FirstWrites/scaleAdverts, (time.Duration(250 * s.FirstWrites / scaleAdverts / routerQPS * float64(time.Second))).Round(time.Second))
		p("")
	}
	if rs := r.Restart; rs != nil {
		p("**Restart.** The announcing router of the scale run gets SIGTERM (as in an upgrade) and is started again: FRR's log shows %d withdrawals and %d notifications from it, and every one of its %s prefixes announced again %s after the SIGTERM (this start reaches the API server through the counting proxy). FRR 8.4 has no graceful-restart helper for `l2vpn-evpn` (FRRouting/frr#9749), so it drops the node's routes while the session is down and tells the other nodes: the receiving node's router received %.0f updates across the restart (withdrawals and re-announcements of the %s), and its withdrawal hold kept the routes: it made %.0f kernel route changes (counted 15 s after the SIGTERM, past the 10 s hold).",
			rs.Withdrawn, rs.Notifications, thousands(rs.Prefixes), ms(rs.Back), rs.ReceiverUpdates, thousands(rs.Prefixes), rs.ReceiverChanges)
		p("")
	}
	p("")
}

func perMove(ms []MoveResult, f func(MoveResult) int) string {
	lo, hi := f(ms[0]), f(ms[0])
	for _, m := range ms {
		lo, hi = min(lo, f(m)), max(hi, f(m))
	}
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

// gobgpVersion is the reference's version, as gobgpd reports it.
func gobgpVersion() string {
	out, err := exec.Command(gobgpd, "--version").Output()
	if err != nil {
		return "version unknown"
	}
	return strings.TrimSpace(string(out))
}
