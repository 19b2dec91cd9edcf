package routing

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// report runs `galactic-cni available|unavailable` for c on n, as the
// instance's runtime would, and fails t unless it succeeds.
func report(t *testing.T, env *harness.Env, n *harness.Node, a harness.Attachment, verb string, c *harness.Netns) {
	t.Helper()
	if code, out := reportCmd(t, env, n, a, verb, c); code != 0 {
		t.Fatalf("galactic-cni %s: exit %d %s", verb, code, out)
	}
}

func TestWhenAvailableRoutesOnlyWhileTheHolderReportsAvailableAndDrainsAtOnce(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: withHandoff, Announce: "whenAvailable"}
	always := harness.Attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}, Handoff: withHandoff}
	wa := a.Add(t, vm)
	wAlways := a.Add(t, always)
	wc := c.Add(t, harness.Client)
	p := vm.Prefixes()[0]

	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionHolderAvailable, metav1.ConditionFalse, "Acquired")
	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonHolderUnavailable)
	// The always attachment is routed without any report.
	wc.WaitPing(t, always.Addr(false))
	// Passes in which node-a's router would announce it.
	harness.WaitPasses(t, 2, a.Router)
	if paths := f.Paths(t, p); len(paths) != 0 {
		t.Fatalf("announced before the holder reported available: %+v", paths)
	}
	if err := wc.Ping(vm.Addr(false)); err == nil {
		t.Fatal("a reply from an instance that never reported available")
	}

	report(t, env, a.Node, vm, "available", wa)
	f.WaitPaths(t, 1, p)
	wc.WaitPing(t, vm.Addr(false))
	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionHolderAvailable, metav1.ConditionTrue, "Available")
	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)

	report(t, env, a.Node, vm, "unavailable", wa)
	harness.Eventually(t, 10*time.Second, "FRR holds the route only drained", func() error {
		paths := f.Paths(t, p)
		if len(paths) == 1 && strings.Contains(paths[0].Large, "65000:2:0") {
			return nil
		}
		return fmt.Errorf("%+v", paths)
	})
	// Drained paths go from the receivers' kernels at once, without the hold.
	harness.Eventually(t, 5*time.Second, "node-c's route is gone", func() error {
		if r := kernelRoute(t, c.Node, "blue", p); r != nil {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	if err := wc.Ping(vm.Addr(false)); err == nil {
		t.Fatal("a reply after the holder reported unavailable")
	}
	// A report on the always attachment changes nothing of its routing.
	report(t, env, a.Node, always, "unavailable", wAlways)
	harness.WaitPasses(t, 2, a.Router, c.Router)
	wc.WaitPing(t, always.Addr(false))
}

// reportCmd runs the availability command and returns its exit code and output.
func reportCmd(t *testing.T, env *harness.Env, n *harness.Node, a harness.Attachment, verb string, c *harness.Netns) (int, string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(env.BinDir, "galactic-cni"), verb,
		"--vpc", a.VPC, "--attachment", a.Name, "--container", harness.ContainerID(c.Path))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, n.Environ()...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

func waitNoKernelRoute(t *testing.T, n *harness.Node, vpc string, p netip.Prefix) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, n.Name+" has no route for "+p.String(), func() error {
		if r := kernelRoute(t, n, vpc, p); r != nil {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
}

func waitKernelRoute(t *testing.T, n *harness.Node, vpc string, p netip.Prefix, via netip.Addr) {
	t.Helper()
	harness.Eventually(t, 20*time.Second, n.Name+" routes "+p.String()+" via "+via.String(), func() error {
		if r := kernelRoute(t, n, vpc, p); r == nil || r.Gw.String() != via.String() {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
}

func TestAnUpgradeKeepsTheRouteDrainedUntilTheSuccessorReportsAvailable(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: withHandoff, Announce: "whenAvailable"}
	old := a.Add(t, vm)
	c.Add(t, harness.Client)
	p := vm.Prefixes()[0]
	report(t, env, a.Node, vm, "available", old)
	c.WaitRouteVia(t, "blue", p, a.Underlay)
	// Leases outlive tests, so the token is read, not assumed.
	before := f.Paths(t, p)
	if len(before) != 1 {
		t.Fatalf("FRR before the upgrade: %+v", before)
	}
	var token int
	if _, err := fmt.Sscanf(before[0].Large, "65000:1:%d", &token); err != nil {
		t.Fatalf("holderGeneration in %q: %v", before[0].Large, err)
	}

	// The replacement's ADD waits for the lease; the old DEL releases it.
	next := harness.NewContainer(t)
	done := a.AddInBackground(t, vm, next)
	waitsFor(t, a.Node, vm, a.HolderOf(old))
	a.Del(t, vm, old)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	env.WaitCondition(t, vm, "node-a", v1alpha1.ConditionHolderAvailable, metav1.ConditionFalse, "Acquired")
	c.WaitNoRoute(t, "blue", p)
	if code, _ := reportCmd(t, env, a.Node, vm, "available", old); code == 0 {
		t.Fatal("the predecessor's late available was accepted")
	}
	harness.WaitPasses(t, 2, a.Router, c.Router)
	if r := kernelRoute(t, c.Node, "blue", p); r != nil {
		t.Fatalf("routed after the predecessor's late report: %+v", r)
	}
	report(t, env, a.Node, vm, "available", next)
	c.WaitRouteVia(t, "blue", p, a.Underlay)
	paths := f.Paths(t, p)
	if len(paths) != 1 || strings.Contains(paths[0].Large, "65000:2:0") || !strings.Contains(paths[0].Large, fmt.Sprintf("65000:1:%d", token+1)) {
		t.Fatalf("FRR's path after the successor reported: %+v", paths)
	}
}

func TestAMoveWithWhenAvailableAnnouncesTheNewNodeOnlyAfterItReports(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: withHandoff, Announce: "whenAvailable"}
	wa := a.Add(t, vm)
	c.Add(t, harness.Client)
	p := vm.Prefixes()[0]
	report(t, env, a.Node, vm, "available", wa)
	c.WaitRouteVia(t, "blue", p, a.Underlay)

	report(t, env, a.Node, vm, "unavailable", wa)
	c.WaitNoRoute(t, "blue", p)
	a.Del(t, vm, wa)
	f.WaitPaths(t, 0, p)
	wb := b.Add(t, vm)
	// Passes in which node-b's router would announce it.
	harness.WaitPasses(t, 2, b.Router)
	if paths := f.Paths(t, p); len(paths) != 0 {
		t.Fatalf("node-b announced before it reported available: %+v", paths)
	}
	report(t, env, b.Node, vm, "available", wb)
	c.WaitRouteVia(t, "blue", p, b.Underlay)
	paths := f.Paths(t, p)
	if len(paths) != 1 || paths[0].NextHop != b.Underlay.String() {
		t.Fatalf("FRR after node-b reported: %+v", paths)
	}
}

func TestAnAPIOutageFreezesTheLastKnownAvailability(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: withHandoff, Announce: "whenAvailable"}
	wa := a.Add(t, vm)
	p := vm.Prefixes()[0]
	report(t, env, a.Node, vm, "available", wa)
	f.WaitPaths(t, 1, p)
	if err := a.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	// The holder's report reaches the API server, not node-a's router.
	setReport(t, env, vm, false)
	harness.WaitPasses(t, 2, a.Router)
	paths := f.Paths(t, p)
	if len(paths) != 1 || strings.Contains(paths[0].Large, "65000:2:0") {
		t.Fatalf("changed during the outage: %+v", paths)
	}
	if err := a.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "drained after the API returned", func() error {
		paths := f.Paths(t, p)
		if len(paths) == 1 && strings.Contains(paths[0].Large, "65000:2:0") {
			return nil
		}
		return fmt.Errorf("%+v", paths)
	})
}

// setReport writes the lease's availability annotation directly, as a
// runtime elsewhere would through the API server.
func setReport(t *testing.T, env *harness.Env, a harness.Attachment, available bool) {
	t.Helper()
	leases := env.Kube.CoordinationV1().Leases(harness.Namespace)
	l, err := leases.Get(context.Background(), names.Lease(a.VPC, a.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Annotations[handoff.AnnotationAvailable] = fmt.Sprint(available)
	if _, err := leases.Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestRenewalsOfLeasesHeldElsewhereReachNoRouterButALeaseMovingHereDoes(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	leases := env.Kube.CoordinationV1().Leases(harness.Namespace)
	ctx := context.Background()
	var made []*coordinationv1.Lease
	for i := 0; i < 100; i++ {
		holder, dur := fmt.Sprintf("node-b/c%d", i), int32(60)
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("blue.renew-%d", i), Labels: map[string]string{names.LabelHolderNode: names.NodeLabelValue("node-b")}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur},
		}
		created, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, created)
	}
	t.Cleanup(func() {
		for _, l := range made {
			_ = leases.Delete(ctx, l.Name, metav1.DeleteOptions{})
		}
	})
	// The router's first list brings one event for each lease held on
	// node-a that earlier tests left; counted from then on, the events are
	// those of changes.
	held, err := leases.List(ctx, metav1.ListOptions{LabelSelector: names.HolderNodeSelector("node-a")})
	if err != nil {
		t.Fatal(err)
	}
	var before float64
	harness.Eventually(t, 20*time.Second, "node-a's router's first list of its leases", func() error {
		if before, err = a.Router.Metric("galactic_router_lease_events_total"); err != nil || int(before) < len(held.Items) {
			return fmt.Errorf("%v events (%v), %d leases held on node-a", before, err, len(held.Items))
		}
		return nil
	})
	for i, l := range made {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		if made[i], err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The first lease moves to node-a. The router's watch delivers events
	// in order, so once it has seen this one it has seen any the creations
	// and renewals above brought it: it must have seen this one only.
	moved := made[0]
	holder := "node-a/c0"
	moved.Spec.HolderIdentity = &holder
	moved.Labels[names.LabelHolderNode] = names.NodeLabelValue("node-a")
	if made[0], err = leases.Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var after float64
	harness.Eventually(t, 10*time.Second, "node-a's router sees the lease that moved to it", func() error {
		v, err := a.Router.Metric("galactic_router_lease_events_total")
		if err != nil || v <= before {
			return fmt.Errorf("%v events (%v)", v-before, err)
		}
		after = v
		return nil
	})
	if after != before+1 {
		t.Fatalf("%v lease events at node-a's router, want only the one of the lease that moved to it: the others came from creations and renewals of leases held on node-b", after-before)
	}
}
