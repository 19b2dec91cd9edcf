package migration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
)

// TestASwitchoverChangesTheClientsRouteOnceWithOneHolderThroughout runs
// the driver's sequence with a veth workload on each side in place of a
// guest: the client's route changes once, when the target's higher token
// is announced, the lease has one holder at every version, and the
// standby interface is sent nothing before promote.
func TestASwitchoverChangesTheClientsRouteOnceWithOneHolderThroughout(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "switchover")
	src := cl.a.Add(t, vm)
	wc := cl.client(t, vm)
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.a.Underlay)
	token := harness.LeaseToken(cl.env.Lease(t, vm.LeaseName()))

	leases := cl.watchLease(t, vm)
	routes := watchRoute(t, cl.c, vm.Prefix())
	pinger := harness.Ping(t, wc, vm.Addr(false))
	m := cl.migration(t, vm, cl.a, cl.b, src)
	var sent *harness.TapCounter
	var beforePromote int64
	m.AfterStandby = func() error {
		// Standby: the interface exists with the gateway, but nothing
		// routes to it, no lease was taken and nothing is announced.
		if r := hostRoute(t, cl.b, vm.Prefix()); r != nil {
			return errors.New("the standby target has a host route: " + r.String())
		}
		if l := cl.env.Lease(t, vm.LeaseName()); harness.LeaseHolder(l) != cl.a.HolderOf(src) {
			return errors.New("the standby ADD changed the lease holder to " + harness.LeaseHolder(l))
		}
		adv := cl.env.Advertisement(t, vm, cl.b.Name)
		if adv == nil || len(adv.Spec.Containers) != 1 || !adv.Spec.Containers[0].Standby {
			return errors.New("the target's entry is not marked standby")
		}
		ifs := hostInterfaces(t, cl.b, vm)
		if len(ifs) != 1 {
			return errors.New("the standby target has no host interface")
		}
		var err error
		sent, err = cl.b.CountSent(ifs[0], vm.Addr(false))
		return err
	}
	m.BeforePromote = func() error {
		// The client's traffic still goes to the source: replies come
		// while node-b sends nothing to the standby interface.
		pinger.WaitReplies(t, 20)
		beforePromote = sent.Stop()
		return nil
	}
	res, err := m.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.b.Underlay)
	harness.Eventually(t, hangGuard, "the client reaches the VM on node-b", func() error { return wc.Ping(vm.Addr(false)) })
	cl.settled(t, vm, cl.b)
	st := pinger.Stop()

	if beforePromote != 0 {
		t.Errorf("node-b sent %d packets to the standby interface before promote", beforePromote)
	}
	ch := routes.Changes()
	if len(ch) != 1 || ch[0].Deleted || ch[0].Via != cl.b.Underlay {
		t.Fatalf("node-c's route for %s: want one change to via %s, got %v", vm.Prefix(), cl.b.Underlay, ch)
	}
	versions, werr := leases.Versions()
	if werr != nil {
		t.Fatal(werr)
	}
	if err := harness.OneHolder(versions); err != nil {
		t.Fatalf("%v in %+v", err, versions)
	}
	last := versions[len(versions)-1]
	if last.Holder != cl.b.HolderOf(m.Target.Container) || last.Token != token+1 {
		t.Fatalf("lease after the migration: %+v, want %s with token %d", last, cl.b.HolderOf(m.Target.Container), token+1)
	}
	if e := cl.env.Advertisement(t, vm, cl.b.Name).Spec.Containers[0]; e.Standby || e.HolderGeneration != token+1 {
		t.Fatalf("the promoted entry: %+v", e)
	}
	if adv := cl.env.Advertisement(t, vm, cl.a.Name); adv != nil {
		t.Fatalf("node-a's advertisement outlived its DEL: %+v", adv.Spec)
	}
	if !strings.Contains(res.Promote.Stdout, "promoted with token") {
		t.Errorf("promote said %q", res.Promote.Stdout)
	}
	t.Logf("release %s, promote %s; release returned -> node-c's route changed: %s; pings: %d sent, %d lost, longest gap %s",
		res.Timings.Released.Sub(res.Timings.Migrated), res.Promote.Took, ch[0].At.Sub(res.Timings.Released), st.Sent, st.Lost, st.LongestGap)
}

// TestPromoteWithoutReleaseWaitsThenFailsNamingTheHolderAndChangesNothing:
// the source still holds, so promote waits waitSeconds and exits non-zero
// naming it, with the lease, the target's record, routes and entries as
// they were.
func TestPromoteWithoutReleaseWaitsThenFailsNamingTheHolderAndChangesNothing(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "held")
	src := cl.a.Add(t, vm)
	cl.client(t, vm)
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.a.Underlay)
	start := time.Now()
	tgt := cl.b.Add(t, vm, "CAP_ARGS="+migration.StandbyCapArgs)
	if took := time.Since(start); took > time.Duration(waitSeconds)*time.Second {
		t.Errorf("the standby ADD took %s: it must not wait for the lease", took)
	}
	before := cl.env.Lease(t, vm.LeaseName())
	routes := watchRoute(t, cl.c, vm.Prefix())

	r, err := cl.b.GalacticCNI("promote", "--vpc", vpc, "--attachment", vm.Name, "--container", harness.ContainerID(tgt.Path))
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != migration.ExitHeld || !strings.Contains(r.Stderr, cl.a.HolderOf(src)) || r.Stdout != "" {
		t.Fatalf("promote while node-a holds: %s; want exit %d naming %s", r, migration.ExitHeld, cl.a.HolderOf(src))
	}
	if r.Took < time.Duration(waitSeconds)*time.Second {
		t.Errorf("promote gave up after %s, before waitSeconds (%ds)", r.Took, waitSeconds)
	}
	if after := cl.env.Lease(t, vm.LeaseName()); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the refused promote wrote the lease: %+v", after.Spec)
	}
	if hr := hostRoute(t, cl.b, vm.Prefix()); hr != nil {
		t.Errorf("the refused promote installed a host route on node-b: %s", hr)
	}
	if e := cl.env.Advertisement(t, vm, cl.b.Name).Spec.Containers[0]; !e.Standby || e.HolderGeneration != 0 {
		t.Errorf("the refused promote changed the target's entry: %+v", e)
	}
	// Passes in which the routers would act on a change.
	harness.WaitPasses(t, 2, cl.b.Router, cl.c.Router)
	if ch := routes.Changes(); len(ch) != 0 {
		t.Errorf("node-c's route changed: %v", ch)
	}
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.a.Underlay)
}

// TestAnAbortedMigrationDeletesTheStandbyTargetAndChangesNoRoute: the DEL
// of the standby target before any release leaves the source serving,
// with no route changed anywhere.
func TestAnAbortedMigrationDeletesTheStandbyTargetAndChangesNoRoute(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "aborted")
	src := cl.a.Add(t, vm)
	wc := cl.client(t, vm)
	before := cl.env.Lease(t, vm.LeaseName())
	advBefore := cl.env.Advertisement(t, vm, cl.a.Name)
	routes := watchRoute(t, cl.c, vm.Prefix())
	bRoutes := watchRoute(t, cl.b, vm.Prefix())
	pinger := harness.Ping(t, wc, vm.Addr(false))
	tgt := cl.b.Add(t, vm, "CAP_ARGS="+migration.StandbyCapArgs)
	// The routers act on the standby target before it goes.
	harness.WaitPasses(t, 2, cl.b.Router, cl.c.Router)
	cl.b.Del(t, vm, tgt)
	harness.WaitPasses(t, 2, cl.b.Router, cl.c.Router)
	st := pinger.Stop()

	if ch := routes.Changes(); len(ch) != 0 {
		t.Errorf("node-c's route changed: %v", ch)
	}
	// node-b's router imports the VPC's routes while the standby target
	// gives it the VPC's domain: the VM's route there only ever points
	// at node-a, never at the standby interface.
	for _, c := range bRoutes.Changes() {
		if !c.Deleted && c.Via != cl.a.Underlay {
			t.Errorf("node-b routed the VM elsewhere than node-a: %v", bRoutes.Changes())
		}
	}
	if st.Lost > 0 {
		t.Errorf("the source stopped serving: %d of %d pings lost", st.Lost, st.Sent)
	}
	if after := cl.env.Lease(t, vm.LeaseName()); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the aborted migration wrote the lease: %+v", after.Spec)
	}
	if adv := cl.env.Advertisement(t, vm, cl.a.Name); adv == nil || adv.ResourceVersion != advBefore.ResourceVersion {
		t.Errorf("the aborted migration changed node-a's advertisement")
	}
	if adv := cl.env.Advertisement(t, vm, cl.b.Name); adv != nil {
		t.Errorf("node-b's advertisement outlived the target's DEL: %+v", adv.Spec)
	}
	if ifs := hostInterfaces(t, cl.b, vm); len(ifs) != 0 {
		t.Errorf("node-b kept %v", ifs)
	}
	_ = src
}

// TestATargetLostAfterTheReleaseGivesTheAttachmentBackToTheSource: the
// target fails between release and promote; the source promotes itself
// back with a new token and serves again, and the client's route never
// leaves it.
func TestATargetLostAfterTheReleaseGivesTheAttachmentBackToTheSource(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "fallback")
	src := cl.a.Add(t, vm)
	wc := cl.client(t, vm)
	token := harness.LeaseToken(cl.env.Lease(t, vm.LeaseName()))
	routes := watchRoute(t, cl.c, vm.Prefix())
	m := cl.migration(t, vm, cl.a, cl.b, src)
	lost := errors.New("the target node is gone")
	m.BeforePromote = func() error { return lost }
	res, err := m.Run(t.Context())
	if !errors.Is(err, lost) || !res.FellBack || res.SourcePromote.Code != migration.ExitOK {
		t.Fatalf("want a fall-back to the source: err %v, result %+v", err, res)
	}
	l := cl.env.Lease(t, vm.LeaseName())
	if harness.LeaseHolder(l) != cl.a.HolderOf(src) || harness.LeaseToken(l) != token+1 {
		t.Fatalf("lease after the fall-back: %s token %d, want %s token %d", harness.LeaseHolder(l), harness.LeaseToken(l), cl.a.HolderOf(src), token+1)
	}
	if e := cl.env.Advertisement(t, vm, cl.a.Name).Spec.Containers[0]; e.HolderGeneration != token+1 {
		t.Fatalf("node-a's entry after the fall-back: %+v", e)
	}
	harness.Eventually(t, hangGuard, "the client reaches the VM on node-a", func() error { return wc.Ping(vm.Addr(false)) })
	cl.settled(t, vm, cl.a)
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.a.Underlay)
	for _, c := range routes.Changes() {
		if c.Deleted || c.Via != cl.a.Underlay {
			t.Errorf("node-c's route left node-a: %v", routes.Changes())
		}
	}
	if adv := cl.env.Advertisement(t, vm, cl.b.Name); adv != nil {
		t.Errorf("node-b's advertisement outlived the target's DEL")
	}
	if ifs := hostInterfaces(t, cl.b, vm); len(ifs) != 0 {
		t.Errorf("node-b kept %v", ifs)
	}
}

// TestTenMigrationsBackAndForthLeakNothing moves the attachment between
// two nodes ten times and checks that exactly the last holder's things
// remain: one record, one host interface, one advertisement with one live
// entry, one host route, one lease at the tenth token after the first.
func TestTenMigrationsBackAndForthLeakNothing(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "ten")
	cur := cl.a.Add(t, vm)
	wc := cl.client(t, vm)
	token := harness.LeaseToken(cl.env.Lease(t, vm.LeaseName()))
	from, to := cl.a, cl.b
	ctx := context.Background()
	for i := range 10 {
		m := cl.migration(t, vm, from, to, cur)
		if _, err := m.Run(t.Context()); err != nil {
			t.Fatalf("migration %d from %s to %s: %v", i+1, from.Name, to.Name, err)
		}
		cl.c.WaitRouteVia(t, vpc, vm.Prefix(), to.Underlay)
		cur, from, to = m.Target.Container, to, from
	}
	harness.Eventually(t, hangGuard, "the client reaches the VM", func() error { return wc.Ping(vm.Addr(false)) })
	holderNode, other := from, to
	l := cl.env.Lease(t, vm.LeaseName())
	if harness.LeaseHolder(l) != holderNode.HolderOf(cur) || harness.LeaseToken(l) != token+10 {
		t.Errorf("lease: %s token %d, want %s token %d", harness.LeaseHolder(l), harness.LeaseToken(l), holderNode.HolderOf(cur), token+10)
	}
	if n := len(records(t, holderNode, vm)); n != 1 {
		t.Errorf("%s has %d records of the VM, want 1", holderNode.Name, n)
	}
	if n := len(records(t, other, vm)); n != 0 {
		t.Errorf("%s has %d records of the VM, want 0", other.Name, n)
	}
	if ifs := hostInterfaces(t, holderNode, vm); len(ifs) != 1 {
		t.Errorf("%s has host interfaces %v, want one", holderNode.Name, ifs)
	}
	if ifs := hostInterfaces(t, other, vm); len(ifs) != 0 {
		t.Errorf("%s has host interfaces %v, want none", other.Name, ifs)
	}
	if adv := cl.env.Advertisement(t, vm, holderNode.Name); adv == nil || len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].Standby {
		t.Errorf("%s's advertisement: %+v", holderNode.Name, adv)
	}
	if adv := cl.env.Advertisement(t, vm, other.Name); adv != nil {
		t.Errorf("%s kept an advertisement: %+v", other.Name, adv.Spec)
	}
	if hostRoute(t, holderNode, vm.Prefix()) == nil {
		t.Errorf("%s has no host route to the VM", holderNode.Name)
	}
	if r := hostRoute(t, other, vm.Prefix()); r != nil {
		t.Errorf("%s kept a host route to the VM: %s", other.Name, r)
	}
	list, err := cl.env.API.Leases(harness.Namespace).List(ctx, metavListOptions(names.HolderNodeSelector(other.Name)))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("leases still labelled as held on %s: %d", other.Name, len(list.Items))
	}
}

// TestASwitchoverOfAWhenAvailableAttachmentChangesTheRouteOnceToo: the
// source's release takes its lease out of its node's watch, which must
// not drain its route before the target's higher generation replaces it.
func TestASwitchoverOfAWhenAvailableAttachmentChangesTheRouteOnceToo(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "gated")
	vm.Announce = "whenAvailable"
	src := cl.a.Add(t, vm)
	if r, err := cl.a.GalacticCNI("available", "--vpc", vpc, "--attachment", vm.Name, "--container", harness.ContainerID(src.Path)); err != nil || r.Code != 0 {
		t.Fatalf("available on node-a: %v %s", err, r)
	}
	wc := cl.client(t, vm)
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.a.Underlay)
	routes := watchRoute(t, cl.c, vm.Prefix())
	m := cl.migration(t, vm, cl.a, cl.b, src)
	m.BeforePromote = func() error {
		// Between release and promote node-c keeps the source's route,
		// through passes in which node-a's router would act on the release
		// and node-c's on what node-a sent.
		harness.WaitPasses(t, 2, cl.a.Router, cl.c.Router)
		if ch := routes.Changes(); len(ch) != 0 {
			return errors.New("node-c's route changed before promote")
		}
		return nil
	}
	if _, err := m.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	cl.c.WaitRouteVia(t, vpc, vm.Prefix(), cl.b.Underlay)
	harness.Eventually(t, hangGuard, "the client reaches the VM on node-b", func() error { return wc.Ping(vm.Addr(false)) })
	cl.settled(t, vm, cl.b)
	if ch := routes.Changes(); len(ch) != 1 || ch[0].Deleted || ch[0].Via != cl.b.Underlay {
		t.Fatalf("node-c's route: want one change to via %s, got %v", cl.b.Underlay, ch)
	}
}

// TestCheckExpectsNoHostRouteOnStandbyAndTheHostRouteOncePromoted: CHECK
// follows the record, not the stanza's standby: before promote the host
// route must be absent, after it present.
func TestCheckExpectsNoHostRouteOnStandbyAndTheHostRouteOncePromoted(t *testing.T) {
	cl := newCluster(t)
	vm := cl.vm(t, "check")
	src := cl.a.Add(t, vm)
	tgt := cl.b.Add(t, vm, "CAP_ARGS="+migration.StandbyCapArgs)
	check := func(n *harness.Routed, c *harness.Netns) error {
		_, err := n.CNITool("check", vm.Network(), c, ifName, "CAP_ARGS="+migration.StandbyCapArgs)
		return err
	}
	if err := check(cl.b, tgt); err != nil {
		t.Fatalf("CHECK of the standby target: %v", err)
	}
	flags := func(c *harness.Netns) []string {
		return []string{"--vpc", vpc, "--attachment", vm.Name, "--container", harness.ContainerID(c.Path)}
	}
	for _, step := range []struct {
		n    *harness.Routed
		verb string
		c    *harness.Netns
	}{{cl.a, "release", src}, {cl.b, "promote", tgt}} {
		if r, err := step.n.GalacticCNI(step.verb, flags(step.c)...); err != nil || r.Code != 0 {
			t.Fatalf("%s on %s: %v %s", step.verb, step.n.Name, err, r)
		}
	}
	if hostRoute(t, cl.b, vm.Prefix()) == nil {
		t.Fatal("promote installed no host route")
	}
	if err := check(cl.b, tgt); err != nil {
		t.Fatalf("CHECK of the promoted target: %v", err)
	}
	r := hostRoute(t, cl.b, vm.Prefix())
	if err := cl.b.Do(func() error { return netlink.RouteDel(r) }); err != nil {
		t.Fatal(err)
	}
	if err := check(cl.b, tgt); err == nil || !strings.Contains(err.Error(), vm.Addr(false).String()) {
		t.Fatalf("CHECK of the promoted target without its host route: %v, want it to name %s", err, vm.Addr(false))
	}
}
