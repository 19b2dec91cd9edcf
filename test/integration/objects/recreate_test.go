package objects

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/test/harness"
)

// galacticCNI runs a galactic-cni command on node.
func galacticCNI(t *testing.T, env *harness.Env, node *harness.Node, args ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", node.Netns.Name, filepath.Join(env.BinDir, "galactic-cni")}, args...)...)
	cmd.Env = append(os.Environ(), settings.EnvConfig+"="+node.ConfigPath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("galactic-cni %v: %v: %s", args, err, out)
	}
	return string(out)
}

func TestAnAttachmentDeletedAndRecreatedWithTheSameNameInheritsNothingOfItsPredecessor(t *testing.T) {
	env := harness.Setup(t)
	for _, policy := range []v1alpha1.ReclaimPolicy{v1alpha1.ReclaimDelete, v1alpha1.ReclaimRetain} {
		t.Run(string(policy), func(t *testing.T) {
			node := env.NewNode(t, "node-a")
			podNetwork(t, node, true)
			ns := "recreate-" + strings.ToLower(string(policy))
			tn := newTenant(t, env, ns, "blue", "10.20.0.0/16")
			old := tn.attach(t, "web", policy, "10.20.0.5")
			first := newPod(t, ns, "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
			first.mustAdd(t, node)
			galacticCNI(t, env, node, "available", "--namespace", ns, "--attachment", "web", "--container", first.id())
			oldLease := leaseOf(t, env, old)
			if st, _, _ := handoff.AvailabilityOf(oldLease, string(old.UID), names.Holder("node-a", first.id()), 1); st != metav1.ConditionTrue {
				t.Fatalf("the first holder's report: %s", st)
			}
			oldLink := hostLink(t, node, old)
			oldAdv := advertisementOf(t, env, old, "node-a")
			t.Cleanup(func() {
				// What galactic-controller deletes of a reclaimed attachment.
				_ = env.API.Leases(harness.Namespace).Delete(context.Background(), oldLease.Name, metav1.DeleteOptions{})
				_ = env.API.BGPAdvertisements(harness.Namespace).Delete(context.Background(), oldAdv.Name, metav1.DeleteOptions{})
			})

			// The first pod goes while the API server is out of reach: its
			// lease (held, available) and advertisement stay behind, as
			// after a node's crash. Then the attachment is deleted and made
			// again with the same name: a new UID.
			if err := node.SetAPIReachable(false); err != nil {
				t.Fatal(err)
			}
			first.del(t, node)
			if err := node.SetAPIReachable(true); err != nil {
				t.Fatal(err)
			}
			tn.remove(t, "web")
			recreated := tn.attach(t, "web", policy, "10.20.0.5")
			if recreated.UID == old.UID || recreated.Status.Dataplane.Attachment == old.Status.Dataplane.Attachment {
				t.Fatalf("the recreated attachment has the old identity: %s %s", recreated.UID, recreated.Status.Dataplane.Attachment)
			}

			second := newPod(t, ns, "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
			second.mustAdd(t, node)
			// A fresh lease history: another lease, token 1, not available.
			l := leaseOf(t, env, recreated)
			rec := leaseRecord(l)
			if l.Name == oldLease.Name || rec.LeaseTransitions != 1 || rec.HolderIdentity != names.Holder("node-a", second.id()) || rec.Identity.UID != string(recreated.UID) {
				t.Fatalf("the new holder's lease %s: %+v (the predecessor's is %s)", l.Name, rec, oldLease.Name)
			}
			if st, reason, _ := handoff.AvailabilityOf(l, string(recreated.UID), rec.HolderIdentity, 1); st != metav1.ConditionFalse || reason != handoff.ReasonAcquired {
				t.Fatalf("the new holder starts %s (%s), want not available", st, reason)
			}
			// The predecessor's lease is left to its own release, untouched.
			if now := leaseOf(t, env, old); now == nil || now.ResourceVersion != oldLease.ResourceVersion {
				t.Errorf("the predecessor's lease was written: %+v", now)
			}
			// Another host interface, carrying the new UID; the old one is gone.
			link := hostLink(t, node, recreated)
			if link == nil || link.Attrs().Name == oldLink.Attrs().Name || !strings.HasSuffix(link.Attrs().Alias, "/"+string(recreated.UID)) {
				t.Fatalf("the new host interface %v (alias %q), the predecessor's %s", link, aliasOf(link), oldLink.Attrs().Name)
			}
			if hostLink(t, node, old) != nil {
				t.Errorf("the predecessor's host interface %s is still there", oldLink.Attrs().Name)
			}
			// Its own advertisement, its own entry; the predecessor's is left alone.
			adv := advertisementOf(t, env, recreated, "node-a")
			if adv == nil || adv.Name == oldAdv.Name || adv.Labels[v1alpha1.LabelAttachmentUID] != string(recreated.UID) ||
				len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != second.id() || adv.Spec.Containers[0].AttachmentUID != string(recreated.UID) || adv.Spec.Containers[0].HolderGeneration != 1 {
				t.Fatalf("the new advertisement: %+v", adv)
			}
			if now := advertisementOf(t, env, old, "node-a"); now == nil || now.ResourceVersion != oldAdv.ResourceVersion {
				t.Errorf("the predecessor's advertisement was written: %+v", now)
			}
			if policy == v1alpha1.ReclaimRetain && addr(recreated) != addr(old) {
				t.Errorf("under Retain the address is %s, was %s", addr(recreated), addr(old))
			}
			if err := node.Ping(addr(recreated)); err != nil {
				t.Errorf("the node does not reach the new holder: %v", err)
			}
			second.check(t, node)
			second.del(t, node)
		})
	}
}

func aliasOf(l netlink.Link) string {
	if l == nil {
		return ""
	}
	return l.Attrs().Alias
}
