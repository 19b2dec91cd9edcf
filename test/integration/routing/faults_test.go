package routing

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router"
	"github.com/galactic-cni/galactic/test/harness"
)

// outage is how long a reflector stays away: longer than the session's
// hold time (9 s) and the withdrawal hold (10 s) together, so a lost
// session that counted as a withdrawal would show in the kernel; shorter
// than the 60 s to keep the package's run time bearable.
const outage = 25 * time.Second

// endOfRIB is what a router logs for each End-of-RIB it receives.
const endOfRIB = `"msg":"End-of-RIB"`

// waitEndOfRIB waits until each router has logged more End-of-RIBs than
// it had (before), that is until its session is back and synced.
func waitEndOfRIB(t *testing.T, before map[*routed]int, nodes ...*routed) {
	t.Helper()
	eventually(t, 60*time.Second, "every router's End-of-RIB after the reflector's return", func() error {
		for _, n := range nodes {
			if got := n.Router.LogCount(endOfRIB); got <= before[n] {
				return fmt.Errorf("%s: %d End-of-RIBs, had %d", n.Name, got, before[n])
			}
		}
		return nil
	})
}

func endOfRIBs(nodes ...*routed) map[*routed]int {
	out := map[*routed]int{}
	for _, n := range nodes {
		out[n] = n.Router.LogCount(endOfRIB)
	}
	return out
}

// noChanges fails t for every kernel route change a monitor saw of the
// prefixes.
func noChanges(t *testing.T, what string, mon *routeMonitor, prefixes ...netip.Prefix) {
	t.Helper()
	for _, p := range prefixes {
		if ch := mon.changes(p); len(ch) != 0 {
			t.Errorf("%s: %s changed:\n%s", what, p, strings.Join(ch, "\n"))
		}
	}
}

func testReflectorOutage(t *testing.T, o harness.FabricOptions) {
	env := harness.Setup(t)
	f := harness.NewFabricWith(t, o)
	a := newRouted(t, env, f, "node-a")
	c := newRouted(t, env, f, "node-c")
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, vm)
	wc := clientOf(t, c, vm)
	client := netip.MustParsePrefix("10.20.0.7/32")
	eventually(t, 20*time.Second, "node-a routes to the client", func() error {
		if kernelRoute(t, a.Node, "blue", client) == nil {
			return fmt.Errorf("no route")
		}
		return nil
	})
	monA, monC := monitorRoutes(t, a.Node), monitorRoutes(t, c.Node)
	p, err := wc.StartPinger(vm.Addr(false), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	before := endOfRIBs(a, c)
	f.StopFRR()
	time.Sleep(outage)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	waitFRR(t, f, 1, vm.Prefixes()[0], client)
	waitEndOfRIB(t, before, a, c)
	// A withdrawal the return caused would be acted on within the
	// withdrawal hold: watch past it.
	time.Sleep(12 * time.Second)
	st := p.Stop()
	t.Logf("pings: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings during a %s reflector outage", st.Lost, st.Sent, outage)
	}
	noChanges(t, "node-c", monC, vm.Prefixes()[0])
	noChanges(t, "node-a", monA, client)
}

func TestAReflectorOutageWithoutGracefulRestartLosesNoPingAndChangesNoRoute(t *testing.T) {
	testReflectorOutage(t, harness.FabricOptions{})
}

func TestAReflectorOutageLongerThanItsRestartTimeLosesNoPingAndChangesNoRoute(t *testing.T) {
	testReflectorOutage(t, harness.FabricOptions{GracefulRestartSeconds: 10})
}

func TestARouterStartedWithItsReflectorUnreachableKeepsTheKernelRoutesUntilEndOfRIB(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	c := newRouted(t, env, f, "node-c")
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, vm)
	wc := clientOf(t, c, vm)
	monC := monitorRoutes(t, c.Node)
	p, err := wc.StartPinger(vm.Addr(false), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c.Router.Kill()
	f.StopFRR()
	before := endOfRIBs(c)
	if err := c.Router.Start(); err != nil {
		t.Fatal(err)
	}
	// Past the start's RIB wait (30 s), after which a router that judged
	// without an End-of-RIB would remove what it found.
	time.Sleep(35 * time.Second)
	if kernelRoute(t, c.Node, "blue", vm.Prefixes()[0]) == nil {
		t.Fatalf("node-c removed the route it found while no reflector answered:\n%s", c.Router.Log())
	}
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	waitEndOfRIB(t, before, c)
	time.Sleep(12 * time.Second)
	st := p.Stop()
	t.Logf("pings: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings", st.Lost, st.Sent)
	}
	noChanges(t, "node-c", monC, vm.Prefixes()[0])
}

// setGeneration sets the holderGeneration of every entry of the
// attachment's advertisement on node, as a handoff would have recorded it.
func setGeneration(t *testing.T, env *harness.Env, a attachment, node string, gen int64) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("%s on %s at generation %d", a.Name, node, gen), func() error {
		obj := advertisement(t, env, a, node)
		if obj == nil {
			return fmt.Errorf("no advertisement")
		}
		for i := range obj.Spec.Containers {
			obj.Spec.Containers[i].HolderGeneration = gen
		}
		_, err := env.API.BGPAdvertisements(harness.Namespace).Update(context.Background(), obj, metav1.UpdateOptions{})
		return err
	})
}

// routeVia waits until n's route for p goes via the VTEP (nil: no route).
func routeVia(t *testing.T, n *harness.Node, p netip.Prefix, vtep netip.Addr) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%s's route for %s via %s", n.Name, p, vtep), func() error {
		r := kernelRoute(t, n, "blue", p)
		if r == nil || r.Gw == nil || !strings.HasSuffix(r.Gw.String(), vtep.String()) {
			return fmt.Errorf("route %+v", r)
		}
		return nil
	})
}

func TestTheCurrentHoldersRestartAndDrainNeverHandTheTrafficToAnOlderGeneration(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	b := newRouted(t, env, f, "node-b")
	c := newRouted(t, env, f, "node-c")
	// The older instance on A (its deletion never happened) and the
	// current one on B share the address; different attachment names keep
	// B's ADD from deleting A's advertisement.
	older := attachment{VPC: "blue", Name: "web-old", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	current := attachment{VPC: "blue", Name: "web-new", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, older)
	setGeneration(t, env, older, "node-a", 7)
	add(t, b.Node, current)
	setGeneration(t, env, current, "node-b", 8)
	vm := current.Prefixes()[0]
	wc := clientOf(t, c, current)
	routeVia(t, c.Node, vm, b.Underlay)
	mon := monitorRoutes(t, c.Node)
	p, err := wc.StartPinger(current.Addr(false), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}

	from := f.LogOffset()
	b.Router.Kill()
	if err := b.Router.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "node-b's path back in FRR", func() error {
		if u := counts(t, f, from, vm); u.Announced[b.Underlay.String()] == 0 {
			return fmt.Errorf("updates %+v", u)
		}
		return nil
	})
	// Past the withdrawal hold, after which a held route would have gone.
	time.Sleep(12 * time.Second)
	st := p.Stop()
	t.Logf("pings during node-b's router restart: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings while the current holder's router restarted", st.Lost, st.Sent)
	}
	noChanges(t, "node-c during node-b's router restart", mon, vm)

	if out, err := b.Router.Drain(); err != nil {
		t.Fatalf("drain: %v %s\n%s", err, out, b.Router.Log())
	}
	eventually(t, 20*time.Second, "node-c removes the drained route", func() error {
		if r := kernelRoute(t, c.Node, "blue", vm); r != nil {
			return fmt.Errorf("route %+v", r)
		}
		return nil
	})
	// The older generation stays announced; past the withdrawal hold it is
	// still not installed.
	time.Sleep(12 * time.Second)
	if paths := frrPaths(t, f, vm); len(paths) != 1 || paths[0].NextHop != a.Underlay.String() {
		t.Fatalf("FRR's paths %+v: want only the older instance's", paths)
	}
	if r := kernelRoute(t, c.Node, "blue", vm); r != nil {
		t.Fatalf("node-c installed the older generation after the drain: %+v", r)
	}
	for _, line := range mon.changes(vm) {
		if strings.Contains(line, a.Underlay.String()) {
			t.Errorf("node-c routed to the older instance: %s", line)
		}
	}
}

func TestARebootSetsNoRestartBitsAndAnnouncesNoSavedPathBeforeTheAPIAnswers(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	harness.RequireGoBGPd(t)
	n := env.NewNode(t, "node-a")
	ul := f.Attach(t, n)
	g := f.StartGoBGPd(t, ul)
	// gobgpd is the only peer: GoBGP clears its restarting state for every
	// peer once one peer's End-of-RIB has come, so a second peer's OPEN
	// could lack the bits for that reason alone.
	cfg := f.FabricRouterConfig(ul)
	cfg.Peers = []harness.RouterPeer{{Address: g.Addr.String(), ASN: harness.FabricASN, HoldSeconds: 9, KeepaliveSeconds: 3}}
	bootFile := filepath.Join(n.Dir, "boot_id")
	writeBoot := func(id string) {
		if err := os.WriteFile(bootFile, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeBoot("11111111-1111-1111-1111-111111111111")
	r := n.StartRouter(t, cfg, "--resync", "2s", "--boot-id-file", bootFile)
	att := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	add(t, n, att)
	gobgpPaths := func() []harness.GoBGPPath {
		ps, err := g.EVPNPaths()
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	current := func(want int) func() error {
		return func() error {
			ps := gobgpPaths()
			if len(ps) != want {
				return fmt.Errorf("%+v", ps)
			}
			for _, p := range ps {
				if p.Stale {
					return fmt.Errorf("stale: %+v", ps)
				}
			}
			return nil
		}
	}
	eventually(t, 20*time.Second, "gobgpd holds node-a's two routes", current(2))
	flags := func(what string, wantRestart bool) {
		t.Helper()
		eventually(t, 20*time.Second, what, func() error {
			restart, forward, err := g.RestartFlags(ul)
			if err != nil {
				return err
			}
			if restart != wantRestart || forward != wantRestart {
				out, _ := g.CLI("neighbor", ul.String())
				return fmt.Errorf("restart bit %v, forwarding bit %v; gobgpd says:\n%s\nrouter log:\n%s", restart, forward, out, r.Log())
			}
			return nil
		})
	}

	// A restart of the same boot, as the control: the bits are set.
	r.Kill()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	flags("a restart's OPEN has the restart and forwarding bits", true)
	eventually(t, 20*time.Second, "node-a's routes current after the restart", current(2))

	// A reboot: a new boot ID, the same state dir, and no API server yet.
	if err := n.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	writeBoot("22222222-2222-2222-2222-222222222222")
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	flags("a reboot's OPEN has neither bit", false)
	// Without the forwarding bit the helper drops what it kept, and the
	// router announces nothing before the API answers.
	eventually(t, 20*time.Second, "gobgpd holds nothing of node-a", current(0))
	time.Sleep(5 * time.Second)
	if ps := gobgpPaths(); len(ps) != 0 {
		t.Fatalf("announced before the API answered after a reboot: %+v", ps)
	}
	if !strings.Contains(r.Log(), "starting fresh") {
		t.Errorf("the router did not log its fresh start:\n%s", r.Log())
	}
	if err := n.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "node-a's routes announced once the API answers, none stale", current(2))
}

func TestAFailingVXLANDeviceKeepsTheVPCAnnouncedReportsItAndRecovers(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	c := newRouted(t, env, f, "node-c")
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, vm)
	wc := clientOf(t, c, vm)
	from := f.LogOffset()
	// The device's name taken by another link while the router is down.
	a.Router.Kill()
	dev := routing.VXLANDeviceName("blue")
	for _, args := range [][]string{{"ip", "link", "del", dev}, {"ip", "link", "add", dev, "type", "bridge"}} {
		if out, err := a.Run(args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	if err := a.Router.Start(); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, env, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, router.ReasonDeviceError)
	eventually(t, 20*time.Second, "the device error counted", func() error {
		if v, err := a.Router.Metric("galactic_router_device_errors"); err != nil || v != 1 {
			return fmt.Errorf("%v (%v)", v, err)
		}
		return nil
	})
	// Several retries later the route is still announced, never withdrawn.
	time.Sleep(5 * time.Second)
	if paths := frrPaths(t, f, vm.Prefixes()[0]); len(paths) != 1 || paths[0].NextHop != a.Underlay.String() {
		t.Fatalf("FRR's paths during the device error: %+v", paths)
	}
	if u := counts(t, f, from, vm.Prefixes()[0]); len(u.Withdrawn) != 0 {
		t.Fatalf("withdrawn during the device error: %v", u.Withdrawn)
	}
	if out, err := a.Run("ip", "link", "del", dev); err != nil {
		t.Fatalf("removing the bridge: %v %s", err, out)
	}
	waitCondition(t, env, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	eventually(t, 20*time.Second, "the client reaches the VM again", func() error { return wc.Ping(vm.Addr(false)) })
	if v, err := a.Router.Metric("galactic_router_device_errors"); err != nil || v != 0 {
		t.Errorf("device errors after recovery: %v (%v)", v, err)
	}
	if u := counts(t, f, from, vm.Prefixes()[0]); len(u.Withdrawn) != 0 {
		t.Errorf("withdrawn across the device error: %v", u.Withdrawn)
	}
}

func TestTwoNodesWithOneRouterIDBothReportTheOther(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	same := func(c *harness.RouterConfig) { c.RouterID = "192.0.2.99" }
	a := newRouted(t, env, f, "node-a", same)
	b := newRouted(t, env, f, "node-b", same)
	onA := attachment{VPC: "blue", Name: "web-a", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	onB := attachment{VPC: "blue", Name: "web-b", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	add(t, a.Node, onA)
	add(t, b.Node, onB)
	waitFRR(t, f, 1, onA.Prefixes()[0], onB.Prefixes()[0])
	begin := time.Now()
	for _, tc := range []struct {
		n     *routed
		other *routed
		att   attachment
	}{{a, b, onA}, {b, a, onB}} {
		metric := fmt.Sprintf(`galactic_router_duplicate_router_id{vtep="%s"}`, tc.other.Underlay)
		eventually(t, 10*time.Second-time.Since(begin), tc.n.Name+" reports the duplicate router ID", func() error {
			if v, err := tc.n.Router.Metric(metric); err != nil || v != 1 {
				return fmt.Errorf("%s = %v (%v)", metric, v, err)
			}
			if !strings.Contains(tc.n.Router.Log(), fmt.Sprintf(`"otherVTEP":"%s"`, tc.other.Underlay)) {
				return fmt.Errorf("no log naming %s", tc.other.Underlay)
			}
			obj := advertisement(t, env, tc.att, tc.n.Name)
			if obj == nil {
				return fmt.Errorf("no advertisement")
			}
			if c := meta.FindStatusCondition(obj.Status.Conditions, v1alpha1.ConditionProgrammed); c == nil || c.Reason != router.ReasonDuplicateRouterID ||
				!strings.Contains(c.Message, tc.other.Underlay.String()) {
				return fmt.Errorf("conditions %+v", obj.Status.Conditions)
			}
			return nil
		})
	}
	t.Logf("both reported within %s", time.Since(begin).Round(time.Millisecond))
}

func TestAPeerThatResetsEverySecondChangesNoRouteAndCostsLittleCPU(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	harness.RequireGoBGPd(t)
	c := newRouted(t, env, f, "node-c")
	n := env.NewNode(t, "node-a")
	ul := f.Attach(t, n)
	g := f.StartGoBGPd(t, ul)
	cfg := f.FabricRouterConfig(ul)
	cfg.Peers = append(cfg.Peers, harness.RouterPeer{Address: g.Addr.String(), ASN: harness.FabricASN, HoldSeconds: 9, KeepaliveSeconds: 3})
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	a := &routed{Node: n, Underlay: ul, Router: n.StartRouter(t, cfg, "--resync", "2s")}
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, vm)
	clientOf(t, c, vm)
	client := netip.MustParsePrefix("10.20.0.7/32")
	eventually(t, 20*time.Second, "node-a routes to the client", func() error {
		if kernelRoute(t, a.Node, "blue", client) == nil {
			return fmt.Errorf("no route")
		}
		return nil
	})
	mon := monitorRoutes(t, a.Node)
	upLine := fmt.Sprintf(`"address":"%s","state":"ESTABLISHED"`, g.Addr)
	ups0 := a.Router.LogCount(upLine)
	cpu0, err := a.Router.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	// Each reset comes before the session is back, so the session churns
	// through the states below Established for the whole time.
	const flapping = 30 * time.Second
	resets := 0
	for time.Since(begin) < flapping {
		if _, err := g.CLI("neighbor", ul.String(), "reset"); err == nil {
			resets++
		}
		time.Sleep(time.Second)
	}
	cpu1, err := a.Router.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(begin)
	share := float64(cpu1-cpu0) / float64(wall)
	t.Logf("%d resets in %s: the router used %s of CPU, %.1f%% of a core", resets, wall.Round(time.Millisecond), cpu1-cpu0, 100*share)
	if resets < 10 {
		t.Fatalf("only %d resets went through", resets)
	}
	if down := fmt.Sprintf(`"address":"%s","state":"IDLE"`, g.Addr); a.Router.LogCount(down) == 0 {
		t.Fatalf("the session to gobgpd never went down:\n%s", a.Router.Log())
	}
	if share >= 0.10 {
		t.Errorf("the router used %.1f%% of a core under a flapping peer, want under 10%%", 100*share)
	}
	noChanges(t, "node-a", mon, client)
	// The router kept trying: the session comes back once the resets stop.
	eventually(t, 60*time.Second, "the session to gobgpd back", func() error {
		if a.Router.LogCount(upLine) == ups0 {
			return fmt.Errorf("not established again")
		}
		return nil
	})
}

func TestOneOfTwoReflectorsStoppedChangesNoRouteAndChangesStillFlow(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	harness.RequireGoBGPd(t)
	second := func(c *harness.RouterConfig) {
		c.Peers = append(c.Peers, harness.RouterPeer{Address: "192.0.2.2", ASN: harness.FabricASN, HoldSeconds: 9, KeepaliveSeconds: 3})
	}
	a := newRouted(t, env, f, "node-a", second)
	c := newRouted(t, env, f, "node-c", second)
	g := f.StartGoBGPdReflector(t, a.Underlay, c.Underlay)
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, vm)
	wc := clientOf(t, c, vm)
	client := netip.MustParsePrefix("10.20.0.7/32")
	eventually(t, 30*time.Second, "gobgpd reflects both nodes' routes", func() error {
		ps, err := g.EVPNPaths()
		if err != nil {
			return err
		}
		if len(ps) < 2 {
			return fmt.Errorf("%+v", ps)
		}
		return nil
	})
	monA, monC := monitorRoutes(t, a.Node), monitorRoutes(t, c.Node)
	p, err := wc.StartPinger(vm.Addr(false), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	f.StopFRR()
	// A change during the outage still reaches node-c over gobgpd.
	late := attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	add(t, a.Node, late)
	eventually(t, 20*time.Second, "node-c learns web-1 over the other reflector", func() error {
		if kernelRoute(t, c.Node, "blue", late.Prefixes()[0]) == nil {
			return fmt.Errorf("no route")
		}
		return nil
	})
	time.Sleep(outage)
	before := endOfRIBs(a, c)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	waitFRR(t, f, 1, vm.Prefixes()[0], client, late.Prefixes()[0])
	waitEndOfRIB(t, before, a, c)
	time.Sleep(12 * time.Second)
	st := p.Stop()
	t.Logf("pings: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings with one of two reflectors stopped", st.Lost, st.Sent)
	}
	noChanges(t, "node-c", monC, vm.Prefixes()[0])
	noChanges(t, "node-a", monA, client)
}
