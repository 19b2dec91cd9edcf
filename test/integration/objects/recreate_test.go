package objects

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/api/meta"
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
	env := setup(t)
	for _, policy := range []v1alpha1.ReclaimPolicy{v1alpha1.ReclaimDelete, v1alpha1.ReclaimRetain} {
		t.Run(string(policy), func(t *testing.T) {
			node := env.NewNode(t, "node-a")
			podNetwork(t, node, true)
			ns := "recreate-" + strings.ToLower(string(policy))
			tn := env.NewTenant(t, ns, "blue", "10.20.0.0/16")
			// Under Retain the controller picks the address, and gives the
			// successor the same one; under Delete it is requested.
			var want []string
			if policy == v1alpha1.ReclaimDelete {
				want = []string{"10.20.0.5"}
			}
			old := tn.Attach(t, "web", policy, want...)
			first := newPod(t, ns, "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
			first.mustAdd(t, node)
			galacticCNI(t, env, node, "available", "--namespace", ns, "--attachment", "web", "--container", first.id())
			oldLease := leaseOf(t, env, old)
			if st, _, _ := handoff.AvailabilityOf(oldLease, string(old.UID), names.Holder("node-a", first.id()), 1); st != metav1.ConditionTrue {
				t.Fatalf("the first holder's report: %s", st)
			}
			oldLink := hostLink(t, node, old)
			oldAdv := advertisementOf(t, env, old, "node-a")

			// The first pod goes while the API server is out of reach: its
			// lease (held, available) and advertisement entry stay behind,
			// as after a node's crash. Deleting the attachment waits while
			// they are live.
			if err := node.SetAPIReachable(false); err != nil {
				t.Fatal(err)
			}
			first.del(t, node)
			if err := node.SetAPIReachable(true); err != nil {
				t.Fatal(err)
			}
			if err := env.API.VPCAttachments(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			harness.Eventually(t, 30*time.Second, "the deleted attachment held while in use", func() error {
				a, err := env.API.VPCAttachments(ns).Get(ctx, "web", metav1.GetOptions{})
				if err != nil {
					return err
				}
				c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionHolderAvailable)
				if a.DeletionTimestamp == nil || c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonHolderTerminating {
					return fmt.Errorf("deleting %v, HolderAvailable %+v", a.DeletionTimestamp, c)
				}
				return nil
			})
			// Released by their own rules: the sandbox's network namespace
			// goes, galactic-gc prunes the dead entry, and the lease
			// expires; then the controller reclaims the attachment.
			first.Delete()
			gcOnce(t, env, node)
			tn.WaitGone(t, "web", 2*time.Minute)
			if leaseOf(t, env, old) != nil || advertisementOf(t, env, old, "node-a") != nil {
				t.Fatal("the reclaimed attachment's lease or advertisement is left")
			}

			recreated := tn.Attach(t, "web", policy, want...)
			if recreated.UID == old.UID || recreated.Status.Dataplane.Attachment == old.Status.Dataplane.Attachment {
				t.Fatalf("the recreated attachment has the old identity: %s %s", recreated.UID, recreated.Status.Dataplane.Attachment)
			}
			second := newPod(t, ns, "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
			second.mustAdd(t, node)
			// The node's hint names the predecessor's UID: not used.
			if lastLeaseReadWithAttachment(t, node) {
				t.Fatal("the ADD of the recreated attachment used the lease its predecessor's hint names")
			}
			// A fresh lease history: another lease, token 1, not available.
			l := leaseOf(t, env, recreated)
			rec := leaseRecord(l)
			if l.Name == oldLease.Name || rec.LeaseTransitions != 1 || rec.HolderIdentity != names.Holder("node-a", second.id()) || rec.Identity.UID != string(recreated.UID) {
				t.Fatalf("the new holder's lease %s: %+v (the predecessor's was %s)", l.Name, rec, oldLease.Name)
			}
			if st, reason, _ := handoff.AvailabilityOf(l, string(recreated.UID), rec.HolderIdentity, 1); st != metav1.ConditionFalse || reason != handoff.ReasonAcquired {
				t.Fatalf("the new holder starts %s (%s), want not available", st, reason)
			}
			harness.Eventually(t, 30*time.Second, "the recreated attachment's status shows its holder not available", func() error {
				a, err := env.API.VPCAttachments(ns).Get(ctx, "web", metav1.GetOptions{})
				if err != nil {
					return err
				}
				c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionHolderAvailable)
				if a.Status.Holder == nil || a.Status.Holder.Node != "node-a" || a.Status.Holder.Generation != 1 || c == nil || c.Status != metav1.ConditionFalse {
					return fmt.Errorf("holder %+v, HolderAvailable %+v", a.Status.Holder, c)
				}
				return nil
			})
			// Another host interface, carrying the new UID.
			link := hostLink(t, node, recreated)
			if link == nil || link.Attrs().Name == oldLink.Attrs().Name || !strings.HasSuffix(link.Attrs().Alias, "/"+string(recreated.UID)) {
				t.Fatalf("the new host interface %v (alias %q), the predecessor's %s", link, aliasOf(link), oldLink.Attrs().Name)
			}
			if hostLink(t, node, old) != nil {
				t.Errorf("the predecessor's host interface %s is still there", oldLink.Attrs().Name)
			}
			// Its own advertisement, its own entry.
			adv := advertisementOf(t, env, recreated, "node-a")
			if adv == nil || adv.Name == oldAdv.Name || adv.Labels[v1alpha1.LabelAttachmentUID] != string(recreated.UID) ||
				len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != second.id() || adv.Spec.Containers[0].AttachmentUID != string(recreated.UID) || adv.Spec.Containers[0].HolderGeneration != 1 {
				t.Fatalf("the new advertisement: %+v", adv)
			}
			if policy == v1alpha1.ReclaimRetain && addr(recreated) != addr(old) {
				t.Errorf("under Retain the address is %s, was %s", addr(recreated), addr(old))
			}
			if err := node.Ping(addr(recreated)); err != nil {
				t.Errorf("the node does not reach the new holder: %v", err)
			}
			second.check(t, node)
			second.del(t, node)
			// A restart in place: the hint is the attachment's own, and its
			// lease is read beside it.
			third := newPod(t, ns, "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
			third.mustAdd(t, node)
			if !lastLeaseReadWithAttachment(t, node) {
				t.Fatal("the restart's ADD did not read the lease beside the attachment")
			}
			if rec := leaseRecord(leaseOf(t, env, recreated)); rec.LeaseTransitions != 2 || rec.HolderIdentity != names.Holder("node-a", third.id()) {
				t.Fatalf("the restart's lease: %+v", rec)
			}
			third.del(t, node)
		})
	}
}

// lastLeaseReadWithAttachment is what the node log's last acquisition of a
// lease says of its read: whether it was read beside the attachment.
func lastLeaseReadWithAttachment(t *testing.T, node *harness.Node) bool {
	t.Helper()
	data, err := os.ReadFile(node.Settings.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var l struct {
			Msg  string `json:"msg"`
			Read *bool  `json:"leaseReadWithAttachment"`
		}
		if json.Unmarshal([]byte(lines[i]), &l) == nil && l.Msg == "handoff lease acquired" && l.Read != nil {
			return *l.Read
		}
	}
	t.Fatal("no lease acquisition in the node log")
	return false
}

// gcOnce runs one galactic-gc pass on node.
func gcOnce(t *testing.T, env *harness.Env, node *harness.Node) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", node.Netns.Name, filepath.Join(env.BinDir, "galactic-gc"), "--config", node.ConfigPath, "--once")
	cmd.Env = append(os.Environ(), node.Environ()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("galactic-gc --once on %s: %v\n%s", node.Name, err, out)
	}
}

func aliasOf(l netlink.Link) string {
	if l == nil {
		return ""
	}
	return l.Attrs().Alias
}
