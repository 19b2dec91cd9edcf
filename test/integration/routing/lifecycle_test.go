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
	a := f.NewRouted(t, env, "node-a")
	// Tap mode: a replacement adopts the tap while the old runtime lives.
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Mode: "tap"}
	old := a.Add(t, att)
	f.WaitPaths(t, 1, att.Prefixes()...)
	env.WaitCondition(t, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	from := f.LogOffset()

	// The replacement's ADD first, then the old DEL, as a runtime upgrade does.
	a.Add(t, att)
	a.Del(t, att, old)
	settle(t, f, a)
	f.WaitPaths(t, 1, att.Prefixes()...)
	u := counts(t, f, from, att.Prefixes()[0])
	if len(u.Announced) != 0 || len(u.Withdrawn) != 0 {
		t.Fatalf("FRR received announcements %v and withdrawals %v during an upgrade on one node", u.Announced, u.Withdrawn)
	}
}

func testMove(t *testing.T, handoff bool) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	if handoff {
		att.Handoff = withHandoff
	}
	ca := a.Add(t, att)
	f.WaitPaths(t, 1, att.Prefixes()...)
	from := f.LogOffset()
	onlyB := func() {
		t.Helper()
		harness.Eventually(t, 20*time.Second, "FRR holds only node-b's paths", func() error {
			for _, p := range att.Prefixes() {
				paths := f.Paths(t, p)
				if len(paths) != 1 || paths[0].NextHop != b.Underlay.String() {
					return fmt.Errorf("%s: %+v", p, paths)
				}
			}
			return nil
		})
	}
	if handoff {
		// B's ADD waits for the lease until A's DEL releases it.
		done := b.AddInBackground(t, att, harness.NewContainer(t))
		waitsFor(t, b.Node, att, a.HolderOf(ca))
		a.Del(t, att, ca)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	} else {
		// B's ADD while A is live, A's DEL late, once the move is done:
		// B's ADD deletes A's advertisement, A's DEL finds nothing left
		// to release.
		b.Add(t, att)
		onlyB()
		a.Del(t, att, ca)
	}
	onlyB()
	settle(t, f, a, b)
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
	a := f.NewRouted(t, env, "node-a")
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	a.Add(t, att)
	f.WaitPaths(t, 1, att.Prefixes()...)
	rd := f.Paths(t, att.Prefixes()[0])[0].RD

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
		harness.Eventually(t, 20*time.Second, tc.name+": the session is back with the same routes and RDs", func() error {
			for _, p := range att.Prefixes() {
				paths := f.Paths(t, p)
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
	a := f.NewRouted(t, env, "node-a")
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, att)
	f.WaitPaths(t, 1, att.Prefixes()...)
	from := f.LogOffset()
	connects := a.CountAPIConnects(t)
	if err := a.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	// The outage lasts until the router has tried the API server many
	// times: it retries every half second, where its informers alone
	// would back off to 30 s between attempts, and an ADD after a long
	// outage would then wait that long to be announced.
	began := time.Now()
	harness.Eventually(t, 2*time.Minute, "40 attempts of node-a's router to reach the API server", func() error {
		if n := connects(); n < 40 {
			return fmt.Errorf("%d attempts", n)
		}
		return nil
	})
	t.Logf("the outage lasted %s", time.Since(began).Round(time.Millisecond))
	if err := a.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	if u := counts(t, f, from, att.Prefixes()[0]); len(u.Withdrawn) != 0 {
		t.Fatalf("withdrawn during the outage: %v", u.Withdrawn)
	}
	f.WaitPaths(t, 1, att.Prefixes()...)
	second := harness.Attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	a.Add(t, second)
	f.WaitPaths(t, 1, second.Prefixes()...)
}

func TestDrainWithdrawsEveryRouteOfTheNode(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	blue := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	red := harness.Attachment{VPC: "red", Name: "db-0", VNI: 10200, Addresses: []string{"10.30.0.5/24"}}
	a.Add(t, blue)
	a.Add(t, red)
	f.WaitPaths(t, 1, append(blue.Prefixes(), red.Prefixes()...)...)
	if out, err := a.Router.Drain(); err != nil {
		t.Fatalf("drain: %v %s\nrouter log:\n%s", err, out, a.Router.Log())
	}
	f.WaitPaths(t, 0, append(blue.Prefixes(), red.Prefixes()...)...)
	harness.Eventually(t, 10*time.Second, "the router exits after the drain", func() error {
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
	a := f.NewRouted(t, env, "node-a")
	blue := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	red := harness.Attachment{VPC: "red", Name: "db-0", VNI: 10200, Addresses: []string{"10.30.0.5/24"}}
	a.Add(t, blue)
	a.Add(t, red)
	f.WaitPaths(t, 1, blue.Prefixes()[0], red.Prefixes()[0])
	if got := f.Paths(t, blue.Prefixes()[0])[0].Extended; !strings.Contains(got, "RT:65000:10100") {
		t.Errorf("blue's route target: %s", got)
	}
	if got := f.Paths(t, red.Prefixes()[0])[0].Extended; !strings.Contains(got, "RT:65000:10200") {
		t.Errorf("red's route target: %s", got)
	}
	clash := harness.Attachment{VPC: "blue", Name: "web-1", VNI: 10999, Addresses: []string{"10.20.0.9/24"}}
	a.Add(t, clash)
	env.WaitCondition(t, clash, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonVNIConflict)
	if paths := f.Paths(t, clash.Prefixes()[0]); len(paths) != 0 {
		t.Fatalf("the conflicting attachment is announced: %+v", paths)
	}
	env.WaitCondition(t, blue, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
}

func TestASteadyStateOfFiftyAttachmentsWritesNoStatus(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	var atts []harness.Attachment
	for i := 0; i < 50; i++ {
		att := harness.Attachment{VPC: "blue", Name: fmt.Sprintf("web-%d", i), VNI: 10100, Addresses: []string{fmt.Sprintf("10.20.1.%d/24", i+10)}}
		a.Add(t, att)
		atts = append(atts, att)
	}
	for _, att := range atts {
		env.WaitCondition(t, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	}
	before, err := a.Router.Metric("galactic_router_status_writes_total")
	if err != nil {
		t.Fatal(err)
	}
	list, err := env.API.BGPAdvertisements(harness.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Three resync passes of the router.
	harness.WaitPasses(t, 3, a.Router)
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
	n := f.NewNode(t, env, "node-a")
	g := f.StartGoBGPd(t, n.Underlay)
	r := n.Route(t, harness.AlsoPeer(g.Addr))
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	n.Add(t, att)
	paths := func() []harness.GoBGPPath {
		ps, err := g.EVPNPaths()
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	harness.Eventually(t, 20*time.Second, "gobgpd holds node-a's two routes", func() error {
		if ps := paths(); len(ps) != 2 {
			return fmt.Errorf("%+v", ps)
		}
		return nil
	})
	r.Kill()
	// Throughout the restart gobgpd keeps both routes, marked stale.
	harness.Eventually(t, 20*time.Second, "gobgpd marks node-a's routes stale while it is down", func() error {
		ps := paths()
		if len(ps) != 2 {
			t.Fatalf("gobgpd dropped routes during the restart: %+v", ps)
		}
		for _, p := range ps {
			if !p.Stale {
				return fmt.Errorf("not stale: %+v", ps)
			}
		}
		return nil
	})
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, "node-a's routes current again after its End-of-RIB", func() error {
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
	f.WaitPaths(t, 1, att.Prefixes()...)
}

func TestARouteReflectorRestartChangesNothingInTheKernel(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
	mon := monitorRoutes(t, c.Node)
	p := harness.Ping(t, wc, vm.Addr(false))
	before := endOfRIBs(a, c)
	f.StopFRR()
	a.Router.WaitEstablished(t, 0)
	c.Router.WaitEstablished(t, 0)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	f.WaitPaths(t, 1, vm.Prefixes()...)
	// A route the return's End-of-RIB swept would go when its withdrawal
	// hold ends, unless its path came back: each RIB holds them all.
	waitEndOfRIB(t, before, a, c)
	a.Router.WaitRIB(t, 1)
	c.Router.WaitRIB(t, 1)
	st := p.Stop()
	if st.Lost != 0 {
		t.Errorf("lost %d of %d pings while the route reflector restarted", st.Lost, st.Sent)
	}
	if ch := mon.changes(vm.Prefixes()[0]); len(ch) != 0 {
		t.Fatalf("node-c's route changed:\n%s", strings.Join(ch, "\n"))
	}
}
