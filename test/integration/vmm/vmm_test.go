// Package vmm runs real VMs on galactic taps: qemu, started inside a node
// namespace on the tap galactic-cni created, boots a Debian kernel with a
// busybox init (test/vm) that takes the attachment's addresses and the
// gateways of the ADD result, answers ping and runs an echo service. The
// tests show that traffic flows through the tap, that the GC's judgement
// of "a VMM holds it" is right for a real VMM, and that upgrades and a
// busy tap behave with real guests.
package vmm

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAQEMUGuestOnAGalacticTapServesAVethWorkloadOfItsVPCOverIPv4AndIPv6(t *testing.T) {
	env, as := setup(t)
	node := routingNode(t, env, "vmm-serve")
	guestAtt := newAttachment(t, env, "serve-vm", names.ModeTap, 0, "10.70.0.5/24", "fd70::5/64")
	peerAtt := newAttachment(t, env, "serve-peer", names.ModeVeth, 0, "10.70.0.7/24", "fd70::7/64")

	sandbox, peer := harness.NewContainer(t), harness.NewContainer(t)
	g := boot(t, as, node, node.RuntimeAdd(t, guestAtt, sandbox))
	node.RuntimeAdd(t, peerAtt, peer)
	if got := g.MTU(); got != mtu {
		t.Errorf("the guest's NIC has MTU %d, the attachment's is %d", got, mtu)
	}
	if st, ok := node.InspectTap(t, guestAtt.HostIf()); !ok || !st.Carrier || !slices.Contains(st.Holders, g.Pid) {
		t.Fatalf("tap %s: present %v, carrier %v, holders %v; want qemu (pid %d) holding it", guestAtt.HostIf(), ok, st.Carrier, st.Holders, g.Pid)
	}
	checkServes(t, peer, g, guestAtt.Addrs())

	poweroff(t, g)
	node.RuntimeDel(t, guestAtt, sandbox)
	node.RuntimeDel(t, peerAtt, peer)
	if _, ok := node.InspectTap(t, guestAtt.HostIf()); ok {
		t.Errorf("DEL left tap %s behind", guestAtt.HostIf())
	}
}

func TestTheGCKeepsATapWhileQEMURunsAndAfterACrashAndAMoveReclaimsItOnTheSecondPass(t *testing.T) {
	env, as := setup(t)
	nodeA, nodeB := env.NewNode(t, "vmm-crash-a"), env.NewNode(t, "vmm-crash-b")
	a := newAttachment(t, env, "crash", names.ModeTap, 0, "10.71.0.5/24", "fd71::5/64")
	c1 := harness.NewContainer(t)
	g := boot(t, as, nodeA, nodeA.RuntimeAdd(t, a, c1))
	st, _ := nodeA.InspectTap(t, a.HostIf())
	index := st.Index

	for pass := 1; pass <= 5; pass++ {
		out := nodeA.MustGC(t)
		st, ok := nodeA.InspectTap(t, a.HostIf())
		if !ok || st.Index != index || !slices.Contains(st.Holders, g.Pid) {
			t.Fatalf("pass %d while qemu runs: tap present %v, ifindex %d (was %d), holders %v (qemu is %d)\n%s", pass, ok, st.Index, index, st.Holders, g.Pid, out)
		}
		if l := keptLine(out, a.HostIf()); l != "" {
			t.Fatalf("pass %d judged the tap qemu holds detached: %s", pass, l)
		}
	}

	// The VM crashes with its sandbox, no DEL runs, and the attachment is
	// started on node-b, whose ADD deletes node-a's advertisement.
	g.Kill()
	if st, ok := nodeA.InspectTap(t, a.HostIf()); !ok || st.Held() {
		t.Fatalf("after SIGKILL of qemu: tap present %v, carrier %v, holders %v; want it there and detached", ok, st.Carrier, st.Holders)
	}
	c1.Delete()
	nodeB.RuntimeAdd(t, a, harness.NewContainer(t))
	if advs := env.Advertisements(t, vpc, a.Name); len(advs) != 1 || advs[nodeB.Name].Name == "" {
		t.Fatalf("after the move only node-b should advertise the attachment, got %d advertisements", len(advs))
	}

	out := nodeA.MustGC(t)
	if _, ok := nodeA.InspectTap(t, a.HostIf()); !ok || !strings.Contains(keptLine(out, a.HostIf()), `"reason":"first-sighting"`) {
		t.Fatalf("the first pass after the crash must keep the tap as a first sighting (present %v):\n%s", ok, out)
	}
	out = nodeA.MustGC(t)
	if _, ok := nodeA.InspectTap(t, a.HostIf()); ok || !strings.Contains(out, "reclaimed detached tap") {
		t.Fatalf("the second pass must reclaim the tap (present %v):\n%s", ok, out)
	}
}

func TestAfterAGracefulPoweroffTheGCKeepsATapItsNodeStillAdvertises(t *testing.T) {
	env, as := setup(t)
	node := env.NewNode(t, "vmm-off")
	a := newAttachment(t, env, "off", names.ModeTap, 0, "10.72.0.5/24", "fd72::5/64")
	c := harness.NewContainer(t)
	g := boot(t, as, node, node.RuntimeAdd(t, a, c))
	poweroff(t, g)
	st, ok := node.InspectTap(t, a.HostIf())
	if !ok || st.Held() {
		t.Fatalf("after the poweroff: tap present %v, carrier %v, holders %v; want it there and detached", ok, st.Carrier, st.Holders)
	}
	for pass := 1; pass <= 3; pass++ {
		out := node.MustGC(t)
		now, ok := node.InspectTap(t, a.HostIf())
		if !ok || now.Index != st.Index {
			t.Fatalf("pass %d reclaimed (or replaced) a tap its node still advertises:\n%s", pass, out)
		}
		want := `"reason":"live-record"`
		if pass == 1 {
			want = `"reason":"first-sighting"`
		}
		if l := keptLine(out, a.HostIf()); !strings.Contains(l, want) {
			t.Errorf("pass %d should keep the detached tap with %s, logged %q", pass, want, l)
		}
	}
	if adv := env.Advertisements(t, vpc, a.Name)[node.Name]; len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != harness.ContainerID(c.Path) {
		t.Fatalf("the node's advertisement should keep the container's entry: %+v", adv.Spec)
	}
}

func TestAnUpgradeInPlaceWithRealVMsServesTheSameAddressesAndRaisesTheTokenByOne(t *testing.T) {
	env, as := setup(t)
	node := routingNode(t, env, "vmm-upgrade")
	a := newAttachment(t, env, "upgrade", names.ModeTap, 60, "10.73.0.5/24", "fd73::5/64")
	peerAtt := newAttachment(t, env, "upgrade-peer", names.ModeVeth, 0, "10.73.0.7/24", "fd73::7/64")
	peer := harness.NewContainer(t)
	node.RuntimeAdd(t, peerAtt, peer)

	c1 := harness.NewContainer(t)
	g1 := boot(t, as, node, node.RuntimeAdd(t, a, c1))
	checkServes(t, peer, g1, a.Addrs())
	before := env.Lease(t, a.LeaseName())
	if harness.LeaseHolder(before) != names.Holder(node.Name, harness.ContainerID(c1.Path)) {
		t.Fatalf("the old runtime should hold the lease, holder %q", harness.LeaseHolder(before))
	}
	oldTap, _ := node.InspectTap(t, a.HostIf())

	poweroff(t, g1)
	node.RuntimeDel(t, a, c1)
	c2 := harness.NewContainer(t)
	res := node.RuntimeAdd(t, a, c2)
	if res.Interfaces[0].Name != oldTap.Name {
		t.Fatalf("the replacement's tap is %s, its predecessor's was %s", res.Interfaces[0].Name, oldTap.Name)
	}
	g2 := boot(t, as, node, res)
	checkServes(t, peer, g2, a.Addrs())

	after := env.Lease(t, a.LeaseName())
	if harness.LeaseHolder(after) != names.Holder(node.Name, harness.ContainerID(c2.Path)) {
		t.Errorf("the replacement should hold the lease, holder %q", harness.LeaseHolder(after))
	}
	if harness.LeaseToken(after) != harness.LeaseToken(before)+1 {
		t.Errorf("lease token %d -> %d, want a rise by one", harness.LeaseToken(before), harness.LeaseToken(after))
	}
	adv := env.Advertisements(t, vpc, a.Name)[node.Name]
	if len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != harness.ContainerID(c2.Path) || adv.Spec.Containers[0].HolderGeneration != harness.LeaseToken(after) {
		t.Errorf("the advertisement should hold only the replacement's entry with token %d: %+v", harness.LeaseToken(after), adv.Spec.Containers)
	}
	poweroff(t, g2)
	node.RuntimeDel(t, a, c2)
	node.RuntimeDel(t, peerAtt, peer)
}

func TestAReplacementsAddWhileQEMUHoldsTheTapFailsWithTryAgainLaterNamingQEMUsPidAndSucceedsAfterThePoweroff(t *testing.T) {
	env, as := setup(t)
	node := env.NewNode(t, "vmm-busy")
	// Handoff off: with it on, the lease would turn the replacement away
	// before the tap does; this is the guard for when the lease lets it in.
	a := newAttachment(t, env, "busy", names.ModeTap, 0, "10.74.0.5/24", "fd74::5/64")
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	g := boot(t, as, node, node.RuntimeAdd(t, a, c1))
	kernelBefore, recsBefore := node.Snapshot(t), node.Records(t)
	advBefore := env.Advertisements(t, vpc, a.Name)[node.Name]

	_, err := node.TryRuntimeAdd(t, a, c2)
	e := harness.CNIError(t, err)
	if e.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD while qemu holds the tap: code %d (%s), want %d", e.Code, e.Msg, types.ErrTryAgainLater)
	}
	if !strings.Contains(e.Msg, "another runtime holds interface "+a.HostIf()) || !strings.Contains(e.Msg, "["+strconv.Itoa(g.Pid)+"]") {
		t.Errorf("the error should name the tap and qemu's pid %d: %s", g.Pid, e.Msg)
	}
	if after := node.Snapshot(t); after != kernelBefore {
		t.Errorf("the refused ADD changed the node's links, rules or routes:\nbefore:\n%s\nafter:\n%s", kernelBefore, after)
	}
	if recs := node.Records(t); !reflect.DeepEqual(recs, recsBefore) {
		t.Errorf("the refused ADD changed the node records: %+v -> %+v", recsBefore, recs)
	}
	if adv := env.Advertisements(t, vpc, a.Name)[node.Name]; adv.ResourceVersion != advBefore.ResourceVersion {
		t.Errorf("the refused ADD wrote the advertisement: resourceVersion %s -> %s", advBefore.ResourceVersion, adv.ResourceVersion)
	}
	// The running guest did not notice: the node still reaches it.
	for _, addr := range a.Addrs() {
		if err := node.Ping(addr); err != nil {
			t.Errorf("after the refused ADD the guest does not answer on %s: %v", addr, err)
		}
	}

	before, _ := node.InspectTap(t, a.HostIf())
	poweroff(t, g)
	res, err := node.TryRuntimeAdd(t, a, c2)
	if err != nil {
		t.Fatalf("the same ADD once the guest has powered off: %v", err)
	}
	if now, _ := node.InspectTap(t, a.HostIf()); now.Index != before.Index {
		t.Errorf("the replacement should adopt the tap (ifindex %d), not recreate it (ifindex %d)", before.Index, now.Index)
	}
	g2 := boot(t, as, node, res)
	for _, addr := range a.Addrs() {
		if err := node.Ping(addr); err != nil {
			t.Errorf("the replacement's guest does not answer on %s: %v", addr, err)
		}
	}
	poweroff(t, g2)
}
