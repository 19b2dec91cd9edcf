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
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

// grRestart is FRR's graceful restart time in the test that outlasts it.
const grRestart = time.Second

// endOfRIB is what a router logs for each End-of-RIB it receives.
const endOfRIB = `"msg":"End-of-RIB"`

// waitEndOfRIB waits until each router has logged more End-of-RIBs than
// it had (before), that is until its session is back and synced.
func waitEndOfRIB(t *testing.T, before map[*harness.Routed]int, nodes ...*harness.Routed) {
	t.Helper()
	harness.Eventually(t, 60*time.Second, "every router's End-of-RIB after the reflector's return", func() error {
		for _, n := range nodes {
			if got := n.Router.LogCount(endOfRIB); got <= before[n] {
				return fmt.Errorf("%s: %d End-of-RIBs, had %d", n.Name, got, before[n])
			}
		}
		return nil
	})
}

func endOfRIBs(nodes ...*harness.Routed) map[*harness.Routed]int {
	out := map[*harness.Routed]int{}
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
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
	client := netip.MustParsePrefix("10.20.0.7/32")
	harness.Eventually(t, 20*time.Second, "node-a routes to the client", func() error {
		if kernelRoute(t, a.Node, "blue", client) == nil {
			return fmt.Errorf("no route")
		}
		return nil
	})
	monA, monC := monitorRoutes(t, a.Node), monitorRoutes(t, c.Node)
	p := harness.Ping(t, wc, vm.Addr(false))
	before := endOfRIBs(a, c)
	f.StopFRR()
	began := time.Now()
	// Once the routers have lost their sessions, a loss that counted as
	// a withdrawal would take the routes after the withdrawal hold; with
	// graceful restart, the routers drop FRR's paths after its restart
	// time, which must not count as one either.
	a.Router.WaitEstablished(t, 0)
	c.Router.WaitEstablished(t, 0)
	if o.GracefulRestartSeconds > 0 {
		time.Sleep(grRestart)
	}
	time.Sleep(harness.PastHold)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	outage := time.Since(began)
	f.WaitPaths(t, 1, vm.Prefixes()[0], client)
	waitEndOfRIB(t, before, a, c)
	// A route the return's End-of-RIB swept would go when its withdrawal
	// hold ends, unless its path came back: each RIB holds them all.
	a.Router.WaitRIB(t, 1)
	c.Router.WaitRIB(t, 1)
	st := p.Stop()
	t.Logf("pings: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings during a %s reflector outage", st.Lost, st.Sent, outage.Round(time.Millisecond))
	}
	noChanges(t, "node-c", monC, vm.Prefixes()[0])
	noChanges(t, "node-a", monA, client)
}

func TestAReflectorOutageWithoutGracefulRestartLosesNoPingAndChangesNoRoute(t *testing.T) {
	testReflectorOutage(t, harness.FabricOptions{})
}

func TestAReflectorOutageLongerThanItsRestartTimeLosesNoPingAndChangesNoRoute(t *testing.T) {
	testReflectorOutage(t, harness.FabricOptions{GracefulRestartSeconds: int(grRestart / time.Second)})
}

func TestARouterStartedWithItsReflectorUnreachableKeepsTheKernelRoutesUntilEndOfRIB(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
	monC := monitorRoutes(t, c.Node)
	p := harness.Ping(t, wc, vm.Addr(false))
	c.Router.Kill()
	f.StopFRR()
	before := endOfRIBs(c)
	started := c.Router.LogCount(`"msg":"started"`)
	c.Router.Args = append(c.Router.Args, harness.RIBWaitArgs()...)
	if err := c.Router.Start(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "node-c's router started", func() error {
		if c.Router.LogCount(`"msg":"started"`) == started {
			return fmt.Errorf("not yet:\n%s", c.Router.Log())
		}
		return nil
	})
	// Past the start's RIB wait and a pass after it, in which a router
	// that judged without an End-of-RIB would remove what it found.
	time.Sleep(harness.RIBWait)
	harness.WaitPasses(t, 1, c.Router)
	if kernelRoute(t, c.Node, "blue", vm.Prefixes()[0]) == nil {
		t.Fatalf("node-c removed the route it found while no reflector answered:\n%s", c.Router.Log())
	}
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	waitEndOfRIB(t, before, c)
	c.Router.WaitRIB(t, 1)
	st := p.Stop()
	t.Logf("pings: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings", st.Lost, st.Sent)
	}
	noChanges(t, "node-c", monC, vm.Prefixes()[0])
}

// setGeneration sets the holderGeneration of every entry of the
// attachment's advertisement on node, as a handoff would have recorded it.
func setGeneration(t *testing.T, env *harness.Env, a harness.Attachment, node string, gen int64) {
	t.Helper()
	harness.Eventually(t, 20*time.Second, fmt.Sprintf("%s on %s at generation %d", a.Name, node, gen), func() error {
		obj := env.Advertisement(t, a, node)
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

func TestTheCurrentHoldersRestartAndDrainNeverHandTheTrafficToAnOlderGeneration(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	c := f.NewRouted(t, env, "node-c")
	// The older instance on A (its deletion never happened) and the
	// current one on B share the address; different attachment names keep
	// B's ADD from deleting A's advertisement.
	older := harness.Attachment{VPC: "blue", Name: "web-old", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	current := harness.Attachment{VPC: "blue", Name: "web-new", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, older)
	setGeneration(t, env, older, "node-a", 7)
	b.Add(t, current)
	setGeneration(t, env, current, "node-b", 8)
	vm := current.Prefixes()[0]
	wc := c.AddClient(t, current.Addr(false))
	c.WaitRouteVia(t, "blue", vm, b.Underlay)
	mon := monitorRoutes(t, c.Node)
	p := harness.Ping(t, wc, current.Addr(false))

	from := f.LogOffset()
	b.Router.Kill()
	if err := b.Router.Start(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "node-b's path back in FRR", func() error {
		if u := counts(t, f, from, vm); u.Announced[b.Underlay.String()] == 0 {
			return fmt.Errorf("updates %+v", u)
		}
		return nil
	})
	// node-b's restart withdrew its path at node-c, which holds the route
	// until the path is back: node-c's RIB holds it and node-a's again.
	c.Router.WaitRIB(t, 2)
	st := p.Stop()
	t.Logf("pings during node-b's router restart: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings while the current holder's router restarted", st.Lost, st.Sent)
	}
	noChanges(t, "node-c during node-b's router restart", mon, vm)

	if out, err := b.Router.Drain(); err != nil {
		t.Fatalf("drain: %v %s\n%s", err, out, b.Router.Log())
	}
	harness.Eventually(t, 20*time.Second, "node-c removes the drained route", func() error {
		if r := kernelRoute(t, c.Node, "blue", vm); r != nil {
			return fmt.Errorf("route %+v", r)
		}
		return nil
	})
	// The older generation stays announced; past the withdrawal hold it is
	// still not installed.
	time.Sleep(harness.PastHold)
	if paths := f.Paths(t, vm); len(paths) != 1 || paths[0].NextHop != a.Underlay.String() {
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
	n := f.NewNode(t, env, "node-a")
	ul := n.Underlay
	g := f.StartGoBGPd(t, ul)
	// gobgpd is the only peer: GoBGP clears its restarting state for every
	// peer once one peer's End-of-RIB has come, so a second peer's OPEN
	// could lack the bits for that reason alone.
	cfg := f.RouterConfig(ul)
	cfg.Peers = []config.PeerFile{harness.Peer(g.Addr)}
	bootFile := filepath.Join(n.Dir, "boot_id")
	writeBoot := func(id string) {
		if err := os.WriteFile(bootFile, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeBoot("11111111-1111-1111-1111-111111111111")
	r := n.StartRouter(t, cfg, append(harness.RouterArgs(), "--boot-id-file", bootFile)...)
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	n.Add(t, att)
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
	harness.Eventually(t, 20*time.Second, "gobgpd holds node-a's two routes", current(2))
	flags := func(what string, wantRestart bool) {
		t.Helper()
		harness.Eventually(t, 20*time.Second, what, func() error {
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
	harness.Eventually(t, 20*time.Second, "node-a's routes current after the restart", current(2))

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
	harness.Eventually(t, 20*time.Second, "gobgpd holds nothing of node-a", current(0))
	// Passes that would announce, had the router anything to.
	harness.WaitPasses(t, 2, r)
	if ps := gobgpPaths(); len(ps) != 0 {
		t.Fatalf("announced before the API answered after a reboot: %+v", ps)
	}
	if !strings.Contains(r.Log(), "starting fresh") {
		t.Errorf("the router did not log its fresh start:\n%s", r.Log())
	}
	if err := n.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "node-a's routes announced once the API answers, none stale", current(2))
}

func TestAFailingVXLANDeviceKeepsTheVPCAnnouncedReportsItAndRecovers(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
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
	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, router.ReasonDeviceError)
	harness.Eventually(t, 20*time.Second, "the device error counted", func() error {
		if v, err := a.Router.Metric("galactic_router_device_errors"); err != nil || v != 1 {
			return fmt.Errorf("%v (%v)", v, err)
		}
		return nil
	})
	// Several retries (passes) later the route is still announced, never
	// withdrawn.
	harness.WaitPasses(t, 3, a.Router)
	if paths := f.Paths(t, vm.Prefixes()[0]); len(paths) != 1 || paths[0].NextHop != a.Underlay.String() {
		t.Fatalf("FRR's paths during the device error: %+v", paths)
	}
	if u := counts(t, f, from, vm.Prefixes()[0]); len(u.Withdrawn) != 0 {
		t.Fatalf("withdrawn during the device error: %v", u.Withdrawn)
	}
	if out, err := a.Run("ip", "link", "del", dev); err != nil {
		t.Fatalf("removing the bridge: %v %s", err, out)
	}
	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	harness.Eventually(t, 20*time.Second, "the client reaches the VM again", func() error { return wc.Ping(vm.Addr(false)) })
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
	same := func(c *config.File) { c.RouterID = "192.0.2.99" }
	a := f.NewRouted(t, env, "node-a", same)
	b := f.NewRouted(t, env, "node-b", same)
	onA := harness.Attachment{VPC: "blue", Name: "web-a", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	onB := harness.Attachment{VPC: "blue", Name: "web-b", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	a.Add(t, onA)
	b.Add(t, onB)
	f.WaitPaths(t, 1, onA.Prefixes()[0], onB.Prefixes()[0])
	begin := time.Now()
	for _, tc := range []struct {
		n     *harness.Routed
		other *harness.Routed
		att   harness.Attachment
	}{{a, b, onA}, {b, a, onB}} {
		metric := fmt.Sprintf(`galactic_router_duplicate_router_id{vtep="%s"}`, tc.other.Underlay)
		harness.Eventually(t, 10*time.Second-time.Since(begin), tc.n.Name+" reports the duplicate router ID", func() error {
			if v, err := tc.n.Router.Metric(metric); err != nil || v != 1 {
				return fmt.Errorf("%s = %v (%v)", metric, v, err)
			}
			if !strings.Contains(tc.n.Router.Log(), fmt.Sprintf(`"otherVTEP":"%s"`, tc.other.Underlay)) {
				return fmt.Errorf("no log naming %s", tc.other.Underlay)
			}
			obj := env.Advertisement(t, tc.att, tc.n.Name)
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
	c := f.NewRouted(t, env, "node-c")
	a := f.NewNode(t, env, "node-a")
	ul := a.Underlay
	g := f.StartGoBGPd(t, ul)
	a.Route(t, harness.AlsoPeer(g.Addr))
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	c.AddClient(t, vm.Addr(false))
	client := netip.MustParsePrefix("10.20.0.7/32")
	harness.Eventually(t, 20*time.Second, "node-a routes to the client", func() error {
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
	harness.Eventually(t, 60*time.Second, "the session to gobgpd back", func() error {
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
	// gobgpd's address, which StartGoBGPdReflector takes.
	second := harness.AlsoPeer(netip.MustParseAddr("192.0.2.2"))
	a := f.NewRouted(t, env, "node-a", second)
	c := f.NewRouted(t, env, "node-c", second)
	g := f.StartGoBGPdReflector(t, a.Underlay, c.Underlay)
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
	client := netip.MustParsePrefix("10.20.0.7/32")
	harness.Eventually(t, 30*time.Second, "gobgpd reflects both nodes' routes", func() error {
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
	p := harness.Ping(t, wc, vm.Addr(false))
	f.StopFRR()
	// A change during the outage still reaches node-c over gobgpd.
	late := harness.Attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	a.Add(t, late)
	harness.Eventually(t, 20*time.Second, "node-c learns web-1 over the other reflector", func() error {
		if kernelRoute(t, c.Node, "blue", late.Prefixes()[0]) == nil {
			return fmt.Errorf("no route")
		}
		return nil
	})
	// Once the routers have lost FRR, past the withdrawal hold a loss that
	// counted as a withdrawal would have shown.
	a.Router.WaitEstablished(t, 1)
	c.Router.WaitEstablished(t, 1)
	time.Sleep(harness.PastHold)
	before := endOfRIBs(a, c)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	f.WaitPaths(t, 1, vm.Prefixes()[0], client, late.Prefixes()[0])
	waitEndOfRIB(t, before, a, c)
	a.Router.WaitRIB(t, 1)
	c.Router.WaitRIB(t, 2)
	st := p.Stop()
	t.Logf("pings: %d sent, %d lost", st.Sent, st.Lost)
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings with one of two reflectors stopped", st.Lost, st.Sent)
	}
	noChanges(t, "node-c", monC, vm.Prefixes()[0])
	noChanges(t, "node-a", monA, client)
}
