package objects

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAPodWithTwoAttachmentsPingsOverBothAndItsReAddWithBSwappedForCKeepsA(t *testing.T) {
	env := setup(t)
	node := forwardingNode(t, env, "node-a")
	podNetwork(t, node, true)
	// Three VPCs of one tenant, a peer pod in each.
	blue := env.NewTenant(t, "tenant-a", "blue", "10.20.0.0/16")
	green := env.NewTenant(t, "tenant-a", "green", "10.30.0.0/16")
	red := env.NewTenant(t, "tenant-a", "red", "10.40.0.0/16")
	a, b, c := blue.Attach(t, "a", v1alpha1.ReclaimDelete, "10.20.0.5"), green.Attach(t, "b", v1alpha1.ReclaimDelete, "10.30.0.5"), red.Attach(t, "c", v1alpha1.ReclaimDelete, "10.40.0.5")
	var peers []*pod
	for _, tn := range []*harness.Tenant{blue, green, red} {
		peer := tn.Attach(t, tn.VPC.Name+"-peer", v1alpha1.ReclaimDelete, map[string]string{"blue": "10.20.0.6", "green": "10.30.0.6", "red": "10.40.0.6"}[tn.VPC.Name])
		p := newPod(t, "tenant-a", peer.Name, map[string]string{"network.galactic.dev/attachment": peer.Name})
		p.mustAdd(t, node)
		peers = append(peers, p)
	}

	multi := newPod(t, "tenant-a", "multi-0", map[string]string{"network.galactic.dev/attachments": "a,b"})
	res := multi.mustAdd(t, node)
	// One result: the host and container interfaces of both, each address
	// on its own container interface.
	var ifNames []string
	for _, i := range res.Interfaces {
		if i.Sandbox != "" {
			ifNames = append(ifNames, i.Name)
		}
	}
	if !slices.Equal(ifNames, []string{"eth0", "net1"}) || len(res.Interfaces) != 4 || len(res.IPs) != 2 ||
		res.Interfaces[*res.IPs[0].Interface].Name != "eth0" || res.Interfaces[*res.IPs[1].Interface].Name != "net1" ||
		res.IPs[0].Address.String() != "10.20.0.5/16" || res.IPs[1].Address.String() != "10.30.0.5/16" {
		t.Fatalf("the ADD's result: %+v", res)
	}
	for _, to := range []string{"10.20.0.6", "10.30.0.6"} {
		if err := multi.Ping(netip.MustParseAddr(to)); err != nil {
			t.Fatalf("the pod does not reach %s: %v\n%s", to, err, show(multi.Netns, "ip", "route"))
		}
	}
	// Each attachment is held, announced and recorded on its own.
	for _, x := range []struct {
		att    *v1alpha1.VPCAttachment
		ifName string
	}{{a, "eth0"}, {b, "net1"}} {
		l, adv := leaseOf(t, env, x.att), advertisementOf(t, env, x.att, "node-a")
		if l == nil || leaseRecord(l).HolderIdentity != names.Holder("node-a", multi.id()) {
			t.Fatalf("%s's lease: %+v", x.att.Name, l)
		}
		if adv == nil || len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].IfName != x.ifName || adv.Spec.Containers[0].AttachmentUID != string(x.att.UID) {
			t.Fatalf("%s's advertisement: %+v", x.att.Name, adv)
		}
	}
	multi.check(t, node)

	// The replacement list swaps b for c. a goes on as it is, pinged
	// every 10 ms throughout.
	linkA, leaseA := hostLink(t, node, a), leaseRecord(leaseOf(t, env, a))
	pinger, err := multi.StartPinger(netip.MustParseAddr("10.20.0.6"), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	multi.annotations = map[string]string{"network.galactic.dev/attachments": "a,c"}
	res = multi.mustAdd(t, node)
	time.Sleep(300 * time.Millisecond)
	st := pinger.Stop()
	if st.Lost != 0 || st.Received == 0 {
		t.Errorf("pings over a during the re-ADD: %+v, want none lost", st)
	}
	if now := hostLink(t, node, a); now == nil || now.Attrs().Index != linkA.Attrs().Index {
		t.Errorf("a's host interface changed: ifindex %d -> %v", linkA.Attrs().Index, now)
	}
	if now := leaseRecord(leaseOf(t, env, a)); now.LeaseTransitions != leaseA.LeaseTransitions || now.HolderIdentity != leaseA.HolderIdentity {
		t.Errorf("a's lease changed hands or token: %+v -> %+v", leaseA, now)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.String() != "10.20.0.5/16" || res.IPs[1].Address.String() != "10.40.0.5/16" {
		t.Errorf("the re-ADD's addresses: %+v", res.IPs)
	}
	// b is gone: interface, hold and advertisement; c is there on net1.
	if hostLink(t, node, b) != nil || leaseRecord(leaseOf(t, env, b)).HolderIdentity != "" || advertisementOf(t, env, b, "node-a") != nil {
		t.Errorf("b is left: interface %v, lease %+v, advertisement %v", hostLink(t, node, b), leaseRecord(leaseOf(t, env, b)), advertisementOf(t, env, b, "node-a"))
	}
	if adv := advertisementOf(t, env, c, "node-a"); adv == nil || len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].IfName != "net1" {
		t.Errorf("c's advertisement: %+v", adv)
	}
	if err := multi.Ping(netip.MustParseAddr("10.40.0.6")); err != nil {
		t.Errorf("the pod does not reach c's peer over net1: %v", err)
	}
	if err := multi.Ping(netip.MustParseAddr("10.30.0.6")); err == nil {
		t.Error("the pod still reaches b's peer")
	}
	multi.check(t, node)

	// DEL removes every attachment of the pod.
	multi.del(t, node)
	for _, x := range []*v1alpha1.VPCAttachment{a, c} {
		if hostLink(t, node, x) != nil || leaseRecord(leaseOf(t, env, x)).HolderIdentity != "" || advertisementOf(t, env, x, "node-a") != nil {
			t.Errorf("%s is left after DEL", x.Name)
		}
	}
	for _, p := range peers {
		p.del(t, node)
	}
	if recs := records(t, node); len(recs) != 0 {
		t.Errorf("records left: %+v", recs)
	}
}

// show runs a command in a namespace for a failure message.
func show(n *harness.Netns, args ...string) string {
	out, _ := n.Run(args[0], args[1:]...)
	return out
}
