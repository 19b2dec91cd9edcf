package routing

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestWorkloadsOfOneVPCReachEachOtherAcrossNodesOverIPv4AndIPv6(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	onA := harness.Attachment{VPC: "blue", Name: "web-a", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	onC := harness.Attachment{VPC: "blue", Name: "web-c", VNI: 10100, Addresses: []string{"10.20.0.7/24", "fd20::7/64"}}
	wa := a.Add(t, onA)
	wc := c.Add(t, onC)
	for _, v6 := range []bool{false, true} {
		if err := func() (err error) {
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if err = wc.Ping(onA.Addr(v6)); err == nil {
					return wa.Ping(onC.Addr(v6))
				}
			}
			return err
		}(); err != nil {
			t.Fatalf("v6=%v: %v\nC:\n%s\n%s\n%s\nA:\n%s\n%s", v6, err, c.Router.Log(), show(c.Node, "ip", "-6", "route", "show", "table", "all"), show(c.Node, "ip", "-6", "neigh"),
				show(a.Node, "ip", "-6", "route", "show", "table", "all"), show(a.Node, "ip", "-6", "rule"))
		}
	}
	r := kernelRoute(t, c.Node, "blue", onA.Prefixes()[0])
	if r == nil || int(r.Protocol) != dataplane.Protocol || r.Gw.String() != a.Underlay.String() {
		t.Fatalf("node-c's route to %s: %+v\n%s", onA.Prefixes()[0], r, show(c.Node, "ip", "route", "show", "table", "all"))
	}
	dev := routing.VXLANDeviceName("blue")
	out := show(c.Node, "ip", "-d", "link", "show", dev)
	for _, want := range []string{"vxlan id 10100", "local " + c.Underlay.String(), "dstport 4789", "nolearning", "mtu 1450"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s lacks %q:\n%s", dev, want, out)
		}
	}
	// galactic-cni's CHECK stays green with the router's routes in the table.
	c.WriteConflist(t, onC.Conflist())
	if out, err := c.CNITool("check", onC.Network(), wc, ifName); err != nil {
		t.Fatalf("CHECK with remote routes in the table: %v %s", err, out)
	}
}

func TestOverlappingVPCsReachOnlyTheirOwnWorkloads(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	c := f.NewRouted(t, env, "node-c")
	// Red uses blue's addresses, on other nodes (table mode cannot hold
	// two VPCs with one address on one node).
	blueA := harness.Attachment{VPC: "blue", Name: "web-a", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	blueC := harness.Attachment{VPC: "blue", Name: "web-c", VNI: 10100, Addresses: []string{"10.20.0.7/24"}}
	redB := harness.Attachment{VPC: "red", Name: "db-b", VNI: 10200, Addresses: []string{"10.20.0.5/24"}}
	redA := harness.Attachment{VPC: "red", Name: "db-a", VNI: 10200, Addresses: []string{"10.20.0.9/24"}}
	wBlueA := a.Add(t, blueA)
	wBlueC := c.Add(t, blueC)
	b.Add(t, redB)
	wRedA := a.Add(t, redA)
	wBlueC.WaitPing(t, blueA.Addr(false))
	wRedA.WaitPing(t, redB.Addr(false))
	wBlueA.WaitPing(t, blueC.Addr(false))
	// Red never reaches blue's 10.20.0.7, blue never reaches red's 10.20.0.9.
	if err := wRedA.Ping(blueC.Addr(false)); err == nil {
		t.Error("red reached blue's workload on node-c")
	}
	if err := wBlueC.Ping(redA.Addr(false)); err == nil {
		t.Error("blue reached red's workload on node-a")
	}
	// 10.20.0.5 in red's table on node-a leads to node-b, in blue's to node-a's own workload.
	if r := kernelRoute(t, a.Node, "red", redB.Prefixes()[0]); r == nil || r.Gw.String() != b.Underlay.String() {
		t.Errorf("red's route for 10.20.0.5 on node-a: %+v", r)
	}
}

func TestAMoveWithHandoffChangesTheRemoteRouteOnceAndRepliesComeFromTheNewNode(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	// The withdrawal hold bridges node-a's withdrawal and node-b's
	// announcement, whichever comes first: the shipped default, since no
	// wait here outlasts it.
	a := f.NewRouted(t, env, "node-a", harness.ShippedHold)
	b := f.NewRouted(t, env, "node-b", harness.ShippedHold)
	c := f.NewRouted(t, env, "node-c", harness.ShippedHold)
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: withHandoff}
	wa := a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
	mon := monitorRoutes(t, c.Node)
	p := harness.Ping(t, wc, vm.Addr(false))
	harness.Eventually(t, 20*time.Second, "replies to the client's pings", func() error {
		if st := p.Stats(); st.Received == 0 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	start := time.Now()
	done := b.AddInBackground(t, vm, harness.NewContainer(t))
	waitsFor(t, b.Node, vm, a.HolderOf(wa))
	a.Del(t, vm, wa)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	handoff := time.Since(start)
	wc.WaitPing(t, vm.Addr(false))
	// Once FRR holds only node-b's path and node-c has passed over it,
	// node-a's withdrawal has reached node-c.
	harness.Eventually(t, 20*time.Second, "FRR holds only node-b's path", func() error {
		if paths := f.Paths(t, vm.Prefix()); len(paths) != 1 || paths[0].NextHop != b.Underlay.String() {
			return fmt.Errorf("%+v", paths)
		}
		return nil
	})
	harness.WaitPasses(t, 1, c.Router)
	st := p.Stop()
	t.Logf("move: %d sent, %d lost, longest blackout %s, handoff took %s", st.Sent, st.Lost, st.LongestGap, handoff)
	r := kernelRoute(t, c.Node, "blue", vm.Prefixes()[0])
	if r == nil || r.Gw.String() != b.Underlay.String() {
		t.Fatalf("node-c's route after the move: %+v", r)
	}
	if ch := mon.changes(vm.Prefixes()[0]); len(ch) != 1 {
		t.Fatalf("node-c's route for %s changed %d times, want once:\n%s", vm.Prefixes()[0], len(ch), strings.Join(ch, "\n"))
	}
	if st.Received == 0 {
		t.Fatal("no replies at all")
	}
}

func TestBothNodesAdvertisingKeepsTheRemoteRouteOnTheHigherHolderGeneration(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: withHandoff}
	a.Add(t, vm)
	c.Add(t, harness.Client)
	c.WaitRouteVia(t, "blue", vm.Prefixes()[0], a.Underlay)
	// node-a crashes without DEL: its advertisement stays, held by a
	// finalizer so node-b's fallback delete cannot remove it, and node-b
	// takes over once the lease expires.
	advA := names.Advertisement(vm.VPC, vm.Name, "node-a")
	patch := []byte(`{"metadata":{"finalizers":["test.galactic.dev/hold"]}}`)
	ads := env.API.BGPAdvertisements(harness.Namespace)
	if _, err := ads.Patch(context.Background(), advA, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ads.Patch(context.Background(), advA, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	mon := monitorRoutes(t, c.Node)
	b.Add(t, vm)
	c.WaitRouteVia(t, "blue", vm.Prefixes()[0], b.Underlay)
	if paths := f.Paths(t, vm.Prefixes()[0]); len(paths) != 2 {
		t.Fatalf("want both nodes' paths in FRR during the test, got %+v", paths)
	}
	// Resync passes of every router, in which any would move it back.
	harness.WaitPasses(t, 3, a.Router, b.Router, c.Router)
	if r := kernelRoute(t, c.Node, "blue", vm.Prefixes()[0]); r == nil || r.Gw.String() != b.Underlay.String() {
		t.Fatalf("node-c's route moved back: %+v", r)
	}
	if ch := mon.changes(vm.Prefixes()[0]); len(ch) != 1 {
		t.Fatalf("node-c's route changed %d times while both advertised, want once:\n%s", len(ch), strings.Join(ch, "\n"))
	}
}

func TestRouterRestartsLoseNoPing(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	vm := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, vm)
	wc := c.AddClient(t, vm.Addr(false))
	mon := monitorRoutes(t, c.Node)
	for _, r := range []*harness.Routed{c, a} {
		p := harness.Ping(t, wc, vm.Addr(false))
		harness.Eventually(t, 20*time.Second, "replies to the client's pings", func() error {
			if st := p.Stats(); st.Received == 0 {
				return fmt.Errorf("%+v", st)
			}
			return nil
		})
		before := endOfRIBs(r)
		r.Router.Kill()
		if err := r.Router.Start(); err != nil {
			t.Fatal(err)
		}
		// The session back, synced, and FRR holding the route again.
		r.Router.WaitEstablished(t, 1)
		waitEndOfRIB(t, before, r)
		f.WaitPaths(t, 1, vm.Prefix())
		st := p.Stop()
		t.Logf("restart on %s: %d sent, %d lost", r.Name, st.Sent, st.Lost)
		if st.Lost != 0 {
			t.Errorf("restart on %s lost %d of %d pings", r.Name, st.Lost, st.Sent)
		}
	}
	if ch := mon.changes(vm.Prefixes()[0]); len(ch) != 0 {
		t.Fatalf("node-c's route changed during the restarts:\n%s", strings.Join(ch, "\n"))
	}
}

func TestARemoteRouteNeverReplacesALocalHostRoute(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	there := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	here := harness.Attachment{VPC: "blue", Name: "web-0-here", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	c.Add(t, here)
	a.Add(t, there)
	f.WaitPaths(t, 2, there.Prefixes()...)
	harness.WaitPasses(t, 2, c.Router)
	r := kernelRoute(t, c.Node, "blue", here.Prefixes()[0])
	if r == nil || int(r.Protocol) != routing.Protocol {
		t.Fatalf("node-c's route for its own workload: %+v", r)
	}
}

func TestTheLastAttachmentLeavingTakesTheVXLANDeviceAndEverythingOfIt(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	c := f.NewRouted(t, env, "node-c")
	a.Add(t, harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}})
	last := harness.Attachment{VPC: "blue", Name: "client", VNI: 10100, Addresses: []string{"10.20.0.7/24"}}
	wc := c.Add(t, last)
	wc.WaitPing(t, netip.MustParseAddr("10.20.0.5"))
	dev := routing.VXLANDeviceName("blue")
	c.Del(t, last, wc)
	harness.Eventually(t, 10*time.Second, "nothing of blue's fabric left on node-c", func() error {
		for _, args := range [][]string{
			{"ip", "link", "show", "type", "vxlan"},
			{"ip", "route", "show", "table", "all", "proto", "150"},
			{"ip", "-6", "route", "show", "table", "all", "proto", "150"},
			{"ip", "rule", "show"},
			{"ip", "-6", "rule", "show"},
			{"bridge", "fdb", "show"},
			{"ip", "neigh", "show", "nud", "permanent"},
		} {
			if out := show(c.Node, args...); strings.Contains(out, dev) || (args[1] == "route" && strings.TrimSpace(out) != "") {
				return fmt.Errorf("%v:\n%s", args, out)
			}
		}
		return nil
	})
}
