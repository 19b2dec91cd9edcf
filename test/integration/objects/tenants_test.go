package objects

import (
	"net/netip"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// marker is the payload of harness pings: a receiver that counts it
// counted one of them.
var marker = []byte("galactic")

func TestTwoTenantsVPCBlueWithTheSameNamesAndAddressesOnTwoNodesEachReachOnlyTheirOwnPeer(t *testing.T) {
	env := setup(t)
	harness.RequireFRR(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	b := newRouted(t, env, f, "node-b")
	for _, n := range []*routed{a, b} {
		podNetwork(t, n.Node, true)
	}
	// Each tenant: VPC blue, "web" at 10.20.0.5 and "peer" at 10.20.0.6.
	// tenant-a's web is on node-a and its peer on node-b; tenant-b's the
	// other way round, so each node holds 10.20.0.5 of one tenant and
	// 10.20.0.6 of the other.
	ta := env.NewTenant(t, "tenant-a", "blue", "10.20.0.0/16")
	tb := env.NewTenant(t, "tenant-b", "blue", "10.20.0.0/16")
	webA, peerA := ta.Attach(t, "web", v1alpha1.ReclaimDelete, "10.20.0.5"), ta.Attach(t, "peer", v1alpha1.ReclaimDelete, "10.20.0.6")
	webB, peerB := tb.Attach(t, "web", v1alpha1.ReclaimDelete, "10.20.0.5"), tb.Attach(t, "peer", v1alpha1.ReclaimDelete, "10.20.0.6")

	podWebA := newPod(t, "tenant-a", "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
	podPeerB := newPod(t, "tenant-b", "peer-0", map[string]string{"network.galactic.dev/attachment": "peer"})
	podWebB := newPod(t, "tenant-b", "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
	podPeerA := newPod(t, "tenant-a", "peer-0", map[string]string{"network.galactic.dev/attachment": "peer"})
	podWebA.mustAdd(t, a.Node)
	podPeerB.mustAdd(t, a.Node)
	podWebB.mustAdd(t, b.Node)
	podPeerA.mustAdd(t, b.Node)

	// Distinct leases and advertisements, each labelled with its own UID.
	seenLease, seenAdv := map[string]bool{}, map[string]bool{}
	for _, c := range []struct {
		a    *v1alpha1.VPCAttachment
		node string
	}{{webA, "node-a"}, {peerB, "node-a"}, {webB, "node-b"}, {peerA, "node-b"}} {
		l, adv := leaseOf(t, env, c.a), advertisementOf(t, env, c.a, c.node)
		if l == nil || adv == nil {
			t.Fatalf("%s/%s: lease %v, advertisement %v", c.a.Namespace, c.a.Name, l != nil, adv != nil)
		}
		if rec := leaseRecord(l); rec.Identity.UID != string(c.a.UID) || rec.Identity.Namespace != c.a.Namespace {
			t.Errorf("lease %s carries identity %+v, not %s/%s's", l.Name, rec.Identity, c.a.Namespace, c.a.UID)
		}
		if adv.Labels[v1alpha1.LabelAttachmentUID] != string(c.a.UID) || adv.Labels[v1alpha1.LabelNamespace] != c.a.Namespace || adv.Spec.VNI != c.a.Status.VNI {
			t.Errorf("advertisement %s: labels %v, vni %d", adv.Name, adv.Labels, adv.Spec.VNI)
		}
		if seenLease[l.Name] || seenAdv[adv.Name] {
			t.Errorf("%s/%s shares lease %s or advertisement %s with another tenant's attachment", c.a.Namespace, c.a.Name, l.Name, adv.Name)
		}
		seenLease[l.Name], seenAdv[adv.Name] = true, true
	}
	if names.HostInterface(names.ModeVeth, webA.Status.Dataplane.VPC, webA.Status.Dataplane.Attachment) == names.HostInterface(names.ModeVeth, webB.Status.Dataplane.VPC, webB.Status.Dataplane.Attachment) {
		t.Error("the tenants' web attachments share a host interface name")
	}

	// Every receiver of 10.20.0.5 and 10.20.0.6 counts the pings it gets.
	var caps []*harness.Capture
	for _, p := range []*pod{podWebA, podWebB, podPeerA, podPeerB} {
		c, err := p.Capture(marker)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		caps = append(caps, c)
	}
	count := func() [4]int {
		var n [4]int
		for i, c := range caps {
			n[i] = c.Received(0, "eth0")
		}
		return n
	}
	five, six := netip.MustParseAddr("10.20.0.5"), netip.MustParseAddr("10.20.0.6")
	harness.Eventually(t, 30*time.Second, "tenant-a's peer reaches tenant-a's web on the other node", func() error { return podPeerA.Ping(five) })
	harness.Eventually(t, 30*time.Second, "tenant-b's peer reaches tenant-b's web on the other node", func() error { return podPeerB.Ping(five) })

	// Each ping reaches its own tenant's workload across the fabric and
	// never the other tenant's of the same address, which is on the
	// sender's own node.
	for _, c := range []struct {
		what       string
		from       *pod
		to         netip.Addr
		own, other int
	}{
		{"tenant-a's peer to its web", podPeerA, five, 0, 1},
		{"tenant-b's peer to its web", podPeerB, five, 1, 0},
		{"tenant-a's web to its peer", podWebA, six, 2, 3},
		{"tenant-b's web to its peer", podWebB, six, 3, 2},
	} {
		before := count()
		for range 5 {
			if err := c.from.Ping(c.to); err != nil {
				t.Fatalf("%s: %v", c.what, err)
			}
		}
		after := count()
		if after[c.own] < before[c.own]+5 {
			t.Errorf("%s: the receiver got %d of 5 pings (web-a, web-b, peer-a, peer-b: %v -> %v)", c.what, after[c.own]-before[c.own], before, after)
		}
		if after[c.other] != before[c.other] {
			t.Errorf("%s: the other tenant's workload received pings (web-a, web-b, peer-a, peer-b: %v -> %v)", c.what, before, after)
		}
	}
	for _, p := range []struct {
		p    *pod
		node *routed
	}{{podWebA, a}, {podPeerB, a}, {podWebB, b}, {podPeerA, b}} {
		p.p.del(t, p.node.Node)
	}
}
