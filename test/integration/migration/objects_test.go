package migration

import (
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	handoffpkg "github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/test/harness"
)

// objectAttachments makes VPC blue (10.20.0.0/24) in namespace ns and one
// VPCAttachment per name and address, made Ready by galactic-controller.
func objectAttachments(t *testing.T, env *harness.Env, ns string, addrs map[string]string) map[string]*v1alpha1.VPCAttachment {
	t.Helper()
	env.StartController(t)
	tn := env.NewTenant(t, ns, vpc, "10.20.0.0/24")
	out := map[string]*v1alpha1.VPCAttachment{}
	for name, addr := range addrs {
		out[name] = tn.Attach(t, name, "", addr)
	}
	return out
}

// TestALiveMigrationOfAnObjectBackedAttachmentKeepsOneHolderAndChangesTheRouteOnce
// is the live migration of a qemu guest whose VMM names a VPCAttachment:
// the standby target is in the same namespace, the lease (the attachment's
// data-plane name, labelled with its UID) has one holder at every version,
// node-c's route changes once, and the guest and its TCP connection go on.
func TestALiveMigrationOfAnObjectBackedAttachmentKeepsOneHolderAndChangesTheRouteOnce(t *testing.T) {
	cl := newCluster(t)
	as := guestAssets(t)
	objs := objectAttachments(t, cl.env, "tenant-mig", map[string]string{"vm": "10.20.0.5", "client": "10.20.0.7"})
	handoff := &harness.Handoff{WaitSeconds: waitSeconds, LeaseSeconds: 60}
	vmAtt := harness.Attachment{VPC: vpc, Name: "vm", Addresses: []string{"10.20.0.5/24"}, Mode: "tap",
		Handoff: handoff, PodAnnotations: true, Object: objs["vm"]}
	l := cl.bootVMOf(t, as, vmAtt)
	clientAtt := harness.Attachment{VPC: vpc, Name: "client", Addresses: []string{"10.20.0.7/24"},
		Handoff: handoff, PodAnnotations: true, Object: objs["client"]}
	wc := cl.c.Add(t, clientAtt)
	harness.Eventually(t, hangGuard, "the client reaches the guest", func() error { return wc.Ping(vmAtt.Addr(false)) })
	conn := dialEcho(t, wc, vmAtt)
	if err := conn.roundTrip(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	before, err := l.qemu.Source.UptimeNow(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lease := cl.env.Lease(t, vmAtt.LeaseName())
	if rec := handoffpkg.RecordFromLease(lease); rec.Identity.UID != vmAtt.UID() || rec.Identity.Namespace != "tenant-mig" {
		t.Fatalf("the guest's lease %s carries identity %+v", lease.Name, rec.Identity)
	}
	token := harness.LeaseToken(lease)

	leases := cl.watchLease(t, vmAtt)
	routes := watchRoute(t, cl.c, vmAtt.Prefix())
	pinger := harness.Ping(t, wc, vmAtt.Addr(false))
	pinger.WaitReplies(t, 20)
	m := cl.migration(t, vmAtt, cl.a, cl.b, l.src)
	m.Namespace, m.VPC = "tenant-mig", ""
	m.VMM = l.qemu
	m.AfterStandby = func() error {
		// The standby target built its tap of the same attachment, with
		// the same UID, and holds nothing yet.
		if ifs := hostInterfaces(t, cl.b, vmAtt); len(ifs) != 1 {
			t.Errorf("node-b's standby interfaces of the guest: %v", ifs)
		}
		if h := harness.LeaseHolder(cl.env.Lease(t, vmAtt.LeaseName())); h != cl.a.HolderOf(l.src) {
			t.Errorf("the lease moved at the standby ADD: holder %q", h)
		}
		return nil
	}
	if _, err := m.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, hangGuard, "the guest answers on node-b", func() error { return wc.Ping(vmAtt.Addr(false)) })
	if err := conn.roundTrip(20 * time.Second); err != nil {
		t.Fatalf("the TCP connection did not survive the migration: %v", err)
	}
	cl.settled(t, vmAtt, cl.b)
	st := pinger.Stop()
	after, err := l.qemu.Target.UptimeNow(10 * time.Second)
	if err != nil || after <= before {
		t.Errorf("the guest's uptime %s before, %s after (%v)", before, after, err)
	}
	ch := routes.Changes()
	if len(ch) != 1 || ch[0].Deleted || ch[0].Via != cl.b.Underlay {
		t.Fatalf("node-c's route: want one change to via %s, got %v", cl.b.Underlay, ch)
	}
	versions, err := leases.Versions()
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.OneHolder(versions); err != nil {
		t.Fatalf("%v in %+v", err, versions)
	}
	if last := versions[len(versions)-1]; last.Holder != cl.b.HolderOf(m.Target.Container) || last.Token != token+1 {
		t.Fatalf("lease after the migration: %+v", last)
	}
	adv := cl.advertisement(t, vmAtt, cl.b)
	if adv == nil || adv.Labels[v1alpha1.LabelAttachmentUID] != vmAtt.UID() || len(adv.Spec.Containers) != 1 ||
		adv.Spec.Containers[0].AttachmentUID != vmAtt.UID() || adv.Spec.Containers[0].HolderGeneration != token+1 {
		t.Fatalf("node-b's advertisement after the promote: %+v", adv)
	}
	if cl.advertisement(t, vmAtt, cl.a) != nil || len(hostInterfaces(t, cl.a, vmAtt)) != 0 {
		t.Error("node-a kept the guest's advertisement or tap after its DEL")
	}
	t.Logf("blackout %s, lost %d of %d", st.LongestGap, st.Lost, st.Sent)
}
