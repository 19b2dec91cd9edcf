package routing

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

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
