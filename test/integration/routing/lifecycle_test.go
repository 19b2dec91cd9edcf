package routing

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/test/harness"
)

// counts are FRR's updates for p since from, by sending node address.
func counts(t *testing.T, f *harness.Fabric, from int64, p netip.Prefix) harness.Updates {
	t.Helper()
	u, err := f.CountUpdates(from, p)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestAnUpgradeOnOneNodeSendsNoWithdrawalAndNoReannouncement(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	// Tap mode: a replacement adopts the tap while the old runtime lives.
	att := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Mode: "tap"}
	old := add(t, a.Node, att)
	waitFRR(t, f, 1, att.Prefixes()...)
	waitCondition(t, env, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	from := f.LogOffset()

	// The replacement's ADD first, then the old DEL, as a runtime upgrade does.
	add(t, a.Node, att)
	del(t, a.Node, att, old)
	time.Sleep(3 * time.Second)
	waitFRR(t, f, 1, att.Prefixes()...)
	u := counts(t, f, from, att.Prefixes()[0])
	if len(u.Announced) != 0 || len(u.Withdrawn) != 0 {
		t.Fatalf("FRR received announcements %v and withdrawals %v during an upgrade on one node", u.Announced, u.Withdrawn)
	}
}

func testMove(t *testing.T, handoff bool) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	b := newRouted(t, env, f, "node-b")
	att := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, Handoff: handoff}
	ca := add(t, a.Node, att)
	waitFRR(t, f, 1, att.Prefixes()...)
	from := f.LogOffset()
	if handoff {
		// B's ADD waits for the lease until A's DEL releases it.
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(time.Second)
			del(t, a.Node, att, ca)
		}()
		add(t, b.Node, att)
		<-done
	} else {
		// B's ADD while A is live, A's DEL late: B's ADD deletes A's
		// advertisement, A's DEL finds nothing left to release.
		add(t, b.Node, att)
		time.Sleep(2 * time.Second)
		del(t, a.Node, att, ca)
	}
	eventually(t, 20*time.Second, "FRR holds only node-b's paths", func() error {
		for _, p := range att.Prefixes() {
			paths := frrPaths(t, f, p)
			if len(paths) != 1 || paths[0].NextHop != b.Underlay.String() {
				return fmt.Errorf("%s: %+v", p, paths)
			}
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	for _, p := range att.Prefixes() {
		u := counts(t, f, from, p)
		if u.Withdrawn[a.Underlay.String()] != 1 || len(u.Withdrawn) != 1 {
			t.Errorf("%s: withdrawals %v, want exactly one from %s", p, u.Withdrawn, a.Underlay)
		}
		if u.Announced[b.Underlay.String()] != 1 || len(u.Announced) != 1 {
			t.Errorf("%s: announcements %v, want exactly one from %s", p, u.Announced, b.Underlay)
		}
	}
}

func TestAMoveWithHandoffIsOneWithdrawalAndOneAnnouncement(t *testing.T) { testMove(t, true) }

func TestAMoveWithoutHandoffIsOneWithdrawalAndOneAnnouncement(t *testing.T) { testMove(t, false) }

func TestARestartSendsNoWithdrawalNoNotificationAndKeepsTheRDs(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	att := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	add(t, a.Node, att)
	waitFRR(t, f, 1, att.Prefixes()...)
	rd := frrPaths(t, f, att.Prefixes()[0])[0].RD

	for _, tc := range []struct {
		name   string
		stop   func()
		apiCut bool
	}{
		{"SIGKILL", a.Router.Kill, false},
		{"SIGTERM", a.Router.Terminate, false},
		{"SIGKILL with the API server unreachable", a.Router.Kill, true},
	} {
		from := f.LogOffset()
		if tc.apiCut {
			if err := a.SetAPIReachable(false); err != nil {
				t.Fatal(err)
			}
		}
		tc.stop()
		if err := a.Router.Start(); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		eventually(t, 20*time.Second, tc.name+": the session is back with the same routes and RDs", func() error {
			for _, p := range att.Prefixes() {
				paths := frrPaths(t, f, p)
				if len(paths) != 1 || paths[0].RD != rd {
					return fmt.Errorf("%s: %+v", p, paths)
				}
			}
			u := counts(t, f, from, att.Prefixes()[0])
			if len(u.Announced) == 0 {
				return fmt.Errorf("not re-announced yet")
			}
			return nil
		})
		t.Logf("%s: routes back in FRR after %s", tc.name, time.Since(begin).Round(time.Millisecond))
		for _, p := range att.Prefixes() {
			u := counts(t, f, from, p)
			if len(u.Withdrawn) != 0 || u.Notifications != 0 {
				t.Errorf("%s: %s: FRR received withdrawals %v and %d notifications", tc.name, p, u.Withdrawn, u.Notifications)
			}
		}
		if tc.apiCut {
			if err := a.SetAPIReachable(true); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestAnAPIOutageWithdrawsNothingAndAnAddAfterItIsAnnounced(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	att := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, att)
	waitFRR(t, f, 1, att.Prefixes()...)
	from := f.LogOffset()
	if err := a.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Second)
	if err := a.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	if u := counts(t, f, from, att.Prefixes()[0]); len(u.Withdrawn) != 0 {
		t.Fatalf("withdrawn during the outage: %v", u.Withdrawn)
	}
	waitFRR(t, f, 1, att.Prefixes()...)
	second := attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	add(t, a.Node, second)
	waitFRR(t, f, 1, second.Prefixes()...)
}

func TestDrainWithdrawsEveryRouteOfTheNode(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	blue := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	red := attachment{VPC: "red", Name: "db-0", VNI: 10200, Addresses: []string{"10.30.0.5/24"}}
	add(t, a.Node, blue)
	add(t, a.Node, red)
	waitFRR(t, f, 1, append(blue.Prefixes(), red.Prefixes()...)...)
	if out, err := a.Router.Drain(); err != nil {
		t.Fatalf("drain: %v %s\nrouter log:\n%s", err, out, a.Router.Log())
	}
	waitFRR(t, f, 0, append(blue.Prefixes(), red.Prefixes()...)...)
	eventually(t, 10*time.Second, "the router exits after the drain", func() error {
		if a.Router.Running() {
			return fmt.Errorf("still running")
		}
		return nil
	})
	if out := show(a.Node, "ip", "-d", "link", "show", "type", "vxlan"); strings.Contains(out, "vxlan") {
		t.Fatalf("VXLAN devices left after the drain:\n%s", out)
	}
}

func TestTwoVPCsAnnounceDistinctRouteTargetsAndAConflictingVNIIsNotAnnounced(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	blue := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	red := attachment{VPC: "red", Name: "db-0", VNI: 10200, Addresses: []string{"10.30.0.5/24"}}
	add(t, a.Node, blue)
	add(t, a.Node, red)
	waitFRR(t, f, 1, blue.Prefixes()[0], red.Prefixes()[0])
	if got := frrPaths(t, f, blue.Prefixes()[0])[0].Extended; !strings.Contains(got, "RT:65000:10100") {
		t.Errorf("blue's route target: %s", got)
	}
	if got := frrPaths(t, f, red.Prefixes()[0])[0].Extended; !strings.Contains(got, "RT:65000:10200") {
		t.Errorf("red's route target: %s", got)
	}
	clash := attachment{VPC: "blue", Name: "web-1", VNI: 10999, Addresses: []string{"10.20.0.9/24"}}
	add(t, a.Node, clash)
	waitCondition(t, env, clash, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonVNIConflict)
	if paths := frrPaths(t, f, clash.Prefixes()[0]); len(paths) != 0 {
		t.Fatalf("the conflicting attachment is announced: %+v", paths)
	}
	waitCondition(t, env, blue, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
}

func TestASteadyStateOfFiftyAttachmentsWritesNoStatus(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	var atts []attachment
	for i := 0; i < 50; i++ {
		att := attachment{VPC: "blue", Name: fmt.Sprintf("web-%d", i), VNI: 10100, Addresses: []string{fmt.Sprintf("10.20.1.%d/24", i+10)}}
		add(t, a.Node, att)
		atts = append(atts, att)
	}
	for _, att := range atts {
		waitCondition(t, env, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	}
	before, err := a.Router.Metric("galactic_router_status_writes_total")
	if err != nil {
		t.Fatal(err)
	}
	list, err := env.API.BGPAdvertisements(harness.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Three resync periods of the test router (2 s each).
	time.Sleep(7 * time.Second)
	after, err := a.Router.Metric("galactic_router_status_writes_total")
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("%v status writes in a steady state", after-before)
	}
	again, err := env.API.BGPAdvertisements(harness.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := map[string]string{}
	for _, o := range list.Items {
		rv[o.Name] = o.ResourceVersion
	}
	for _, o := range again.Items {
		if rv[o.Name] != o.ResourceVersion {
			t.Errorf("%s changed in a steady state", o.Name)
		}
	}
}

func TestAGracefulRestartHelperKeepsTheRestartingNodesRoutesStaleThenCurrent(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	harness.RequireGoBGPd(t)
	n := env.NewNode(t, "node-a")
	ul := f.Attach(t, n)
	g := f.StartGoBGPd(t, ul)
	cfg := f.FabricRouterConfig(ul)
	cfg.Peers = append(cfg.Peers, harness.RouterPeer{Address: g.Addr.String(), ASN: harness.FabricASN, HoldSeconds: 9, KeepaliveSeconds: 3})
	r := n.StartRouter(t, cfg, "--resync", "2s")
	att := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	add(t, n, att)
	paths := func() []harness.GoBGPPath {
		ps, err := g.EVPNPaths()
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	eventually(t, 20*time.Second, "gobgpd holds node-a's two routes", func() error {
		if ps := paths(); len(ps) != 2 {
			return fmt.Errorf("%+v", ps)
		}
		return nil
	})
	r.Kill()
	stale := 0
	// Throughout the restart gobgpd keeps both routes, marked stale.
	for i := 0; i < 20; i++ {
		ps := paths()
		if len(ps) != 2 {
			t.Fatalf("gobgpd dropped routes during the restart: %+v", ps)
		}
		for _, p := range ps {
			if p.Stale {
				stale++
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if stale == 0 {
		t.Fatal("gobgpd never marked node-a's routes stale while it was down")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "node-a's routes current again after its End-of-RIB", func() error {
		ps := paths()
		if len(ps) != 2 {
			return fmt.Errorf("%+v", ps)
		}
		for _, p := range ps {
			if p.Stale {
				return fmt.Errorf("still stale: %+v", ps)
			}
		}
		return nil
	})
	waitFRR(t, f, 1, att.Prefixes()...)
}

func TestARouteReflectorRestartChangesNothingInTheKernel(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	c := newRouted(t, env, f, "node-c")
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	add(t, a.Node, vm)
	wc := clientOf(t, c, vm)
	mon := monitorRoutes(t, c.Node)
	p, err := wc.StartPinger(vm.Addr(false), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	f.StopFRR()
	time.Sleep(time.Second)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	waitFRR(t, f, 1, vm.Prefixes()...)
	time.Sleep(2 * time.Second)
	st := p.Stop()
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings while the route reflector restarted", st.Lost, st.Sent)
	}
	if ch := mon.changes(vm.Prefixes()[0]); len(ch) != 0 {
		t.Fatalf("node-c's route changed:\n%s", strings.Join(ch, "\n"))
	}
}
