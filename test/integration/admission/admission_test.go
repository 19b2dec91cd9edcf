// Package admission tests installer/manifests/admission.yaml against the
// real API server: a node's credential writes only that node's
// advertisements, statuses and lease holds.
package admission

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// noNodeClaim is the part of the policy's refusal of a credential bound to
// no node that docs/install/installation.md quotes.
const noNodeClaim = "galactic-node credentials must be bound to a node"

// identity is one credential's clients.
type identity struct {
	api  *client.Clients
	kube kubernetes.Interface
}

func as(t *testing.T, env *harness.Env, token string) identity {
	t.Helper()
	cfg := env.TokenConfig(token)
	api, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return identity{api: api, kube: kube}
}

func asNode(t *testing.T, env *harness.Env, node string) identity {
	t.Helper()
	token, err := env.NodeToken(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	return as(t, env, token)
}

// advertisement is what galactic-bgp writes for attachment on node.
func advertisement(attachment, node string) *v1alpha1.BGPAdvertisement {
	return &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement("blue", attachment, node), Labels: names.AdvertisementLabels("blue", attachment, node)},
		Spec: v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: attachment, Node: node, Prefixes: []v1alpha1.Prefix{"10.20.0.9/32"},
			Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "net0", Netns: "/var/run/netns/x", Prefixes: []v1alpha1.Prefix{"10.20.0.9/32"}}}},
	}
}

// refused fails t unless err is the policy's refusal and names want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want refused", what)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: %v, want the admission policy's refusal", what, err)
		return
	}
	if !strings.Contains(err.Error(), harness.AdmissionPolicy) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: refused with %q, want the policy %s saying %q", what, err, harness.AdmissionPolicy, want)
		return
	}
	t.Logf("%s: %v", what, err)
}

func cleanupAdvertisement(t *testing.T, env *harness.Env, name string) {
	t.Cleanup(func() {
		_ = env.API.BGPAdvertisements(harness.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func TestANodeWritesItsOwnAdvertisementAndStatusButNoOtherNodes(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	a := asNode(t, env, "node-a")
	advs := a.api.BGPAdvertisements(harness.Namespace)

	// Everything galactic-bgp, galactic-gc and galactic-router write for
	// their own node.
	own := advertisement("own-0", "node-a")
	cleanupAdvertisement(t, env, own.Name)
	got, err := advs.Create(ctx, own, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-a creating its own advertisement: %v", err)
	}
	got.Spec.Prefixes = append(got.Spec.Prefixes, "fd20::9/128")
	got.Spec.Containers[0].Prefixes = got.Spec.Prefixes
	if got, err = advs.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a updating its own advertisement: %v", err)
	}
	got.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAnnounced, Message: "test", LastTransitionTime: metav1.Now()}}
	if got, err = advs.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a writing its own advertisement's status: %v", err)
	}

	// The same on node-b's advertisement.
	theirs := advertisement("theirs-0", "node-b")
	cleanupAdvertisement(t, env, theirs.Name)
	_, err = advs.Create(ctx, theirs.DeepCopy(), metav1.CreateOptions{})
	refused(t, "node-a creating node-b's advertisement", err, "node node-a may write only its own BGPAdvertisements")
	stored, err := env.API.BGPAdvertisements(harness.Namespace).Create(ctx, theirs, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the administrator creating node-b's advertisement: %v", err)
	}
	changed := stored.DeepCopy()
	changed.Spec.Prefixes = []v1alpha1.Prefix{"10.20.0.66/32"}
	changed.Spec.Containers[0].Prefixes = changed.Spec.Prefixes
	_, err = advs.Update(ctx, changed, metav1.UpdateOptions{})
	refused(t, "node-a updating node-b's advertisement", err, "has spec.node node-b")
	status := stored.DeepCopy()
	status.Status.Conditions = got.Status.Conditions
	_, err = advs.UpdateStatus(ctx, status, metav1.UpdateOptions{})
	refused(t, "node-a writing node-b's advertisement's status", err, "has spec.node node-b")

	// Taking node-b's advertisement over by changing spec.node (and the
	// label with it), and the reverse.
	hijack := stored.DeepCopy()
	hijack.Spec.Node = "node-a"
	hijack.Labels = names.AdvertisementLabels("blue", "theirs-0", "node-a")
	_, err = advs.Update(ctx, hijack, metav1.UpdateOptions{})
	refused(t, "node-a changing spec.node of node-b's advertisement to node-a", err, "is immutable: it is node-b, not node-a")
	giveAway := got.DeepCopy()
	giveAway.Spec.Node = "node-b"
	_, err = advs.Update(ctx, giveAway, metav1.UpdateOptions{})
	refused(t, "node-a changing spec.node of its own advertisement", err, "has spec.node node-b")

	// What names the object never changes, and the label and name say the
	// node too: another node's router and GC select by the label.
	moved := got.DeepCopy()
	moved.Spec.Attachment = "other-0"
	_, err = advs.Update(ctx, moved, metav1.UpdateOptions{})
	refused(t, "node-a changing spec.attachment", err, "spec.vpc and spec.attachment of "+own.Name+" are immutable")
	mislabelled := advertisement("own-1", "node-a")
	mislabelled.Labels[v1alpha1.LabelNode] = "node-b"
	cleanupAdvertisement(t, env, mislabelled.Name)
	_, err = advs.Create(ctx, mislabelled, metav1.CreateOptions{})
	refused(t, "node-a creating its advertisement labelled node-b", err, "must carry the label network.galactic.dev/node=node-a")
	misnamed := advertisement("own-2", "node-a")
	misnamed.Name = names.Advertisement("blue", "own-2", "node-b")
	cleanupAdvertisement(t, env, misnamed.Name)
	_, err = advs.Create(ctx, misnamed, metav1.CreateOptions{})
	refused(t, "node-a creating its advertisement under node-b's name", err, "should be blue.own-2.node-a")

	// Deleting another node's advertisement stays allowed: galactic-bgp ADD
	// removes a moved instance's leftovers, guarded by UID and
	// resourceVersion.
	rv := stored.ResourceVersion
	if err := advs.Delete(ctx, stored.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &stored.UID, ResourceVersion: &rv}}); err != nil {
		t.Errorf("node-a deleting node-b's leftover with preconditions: %v", err)
	}
}

func TestANodeHoldsLeasesOnlyAsItselfAndReleasesOnlyItsOwnHold(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	a := asNode(t, env, "node-a")
	leases := a.api.Leases(harness.Namespace)
	lock := func(name string) *handoff.Lock {
		t.Cleanup(func() {
			_ = env.Kube.CoordinationV1().Leases(harness.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		})
		l, err := handoff.New(leases, harness.Namespace, name, handoff.Options{LeaseDuration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// A free lease: acquire, report available, renew, release, as
	// galactic-cni, a runtime and galactic-gc do.
	free := lock(names.Lease("blue", "free-0"))
	g, err := free.Acquire(ctx, names.Holder("node-a", "c1"))
	if err != nil {
		t.Fatalf("node-a taking a free lease: %v", err)
	}
	if err := free.SetAvailable(ctx, g.Holder, g.Token, true, "Ready"); err != nil {
		t.Errorf("node-a reporting its hold available: %v", err)
	}
	if err := free.Renew(ctx, g); err != nil {
		t.Errorf("node-a renewing its hold: %v", err)
	}
	if err := free.Release(ctx, g); err != nil {
		t.Errorf("node-a releasing its hold: %v", err)
	}

	// node-b's hold, written by the administrator with node-b's label.
	heldName := names.Lease("blue", "held-0")
	held := lock(heldName)
	bHolder := names.Holder("node-b", "c9")
	now := metav1.NewMicroTime(time.Now())
	seconds := int32(1)
	lease := handoff.LeaseFromRecord(harness.Namespace, heldName, "", handoff.RecordFromSpec(coordinationv1.LeaseSpec{
		HolderIdentity: &bHolder, LeaseDurationSeconds: &seconds, AcquireTime: &now, RenewTime: &now, LeaseTransitions: new(int32(3)),
	}))
	stored, err := env.Kube.CoordinationV1().Leases(harness.Namespace).Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the administrator creating node-b's hold: %v", err)
	}

	// Writing node-b as holder, or clearing or reporting node-b's hold.
	theirs := stored.DeepCopy()
	theirs.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	_, err = leases.Update(ctx, theirs, metav1.UpdateOptions{})
	refused(t, "node-a renewing node-b's hold", err, "may hold a lease only as node-a/<containerID>, not as node-b/c9")
	cleared := stored.DeepCopy()
	cleared.Spec.HolderIdentity = nil
	cleared.Labels = nil
	_, err = leases.Update(ctx, cleared, metav1.UpdateOptions{})
	refused(t, "node-a clearing node-b's hold", err, "may release only its own hold: lease "+heldName+" is held by node-b/c9")
	if err := held.SetAvailable(ctx, bHolder, 3, false, "Drained"); err == nil || !strings.Contains(err.Error(), harness.AdmissionPolicy) {
		t.Errorf("node-a reporting node-b's hold unavailable: %v, want the policy's refusal", err)
	}
	_, err = leases.Create(ctx, handoff.LeaseFromRecord(harness.Namespace, names.Lease("blue", "claimed-0"), "", handoff.Record{HolderIdentity: bHolder, LeaseDurationSeconds: 5}), metav1.CreateOptions{})
	refused(t, "node-a creating a lease held by node-b", err, "not as node-b/c9")
	mislabelled := handoff.LeaseFromRecord(harness.Namespace, names.Lease("blue", "claimed-1"), "", handoff.Record{HolderIdentity: names.Holder("node-a", "c2"), LeaseDurationSeconds: 5})
	mislabelled.Labels[names.LabelHolderNode] = "node-b"
	t.Cleanup(func() {
		_ = env.Kube.CoordinationV1().Leases(harness.Namespace).Delete(ctx, mislabelled.Name, metav1.DeleteOptions{})
	})
	_, err = leases.Create(ctx, mislabelled, metav1.CreateOptions{})
	refused(t, "node-a holding a lease labelled node-b", err, "must carry the label network.galactic.dev/holder-node=node-a")

	// Once node-b's hold expires (nobody renews it), node-a takes it over:
	// the takeover writes node-a as holder, which it may.
	g, err = held.Acquire(ctx, names.Holder("node-a", "c3"))
	if err != nil {
		t.Fatalf("node-a taking over node-b's expired hold: %v", err)
	}
	if g.Token != 4 {
		t.Errorf("takeover token %d, want 4", g.Token)
	}
}

func TestATokenWithoutTheNodeClaimIsRefusedWithTheDocumentedFix(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	token, err := env.UnboundToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := as(t, env, token)
	// It is the node's service account: RBAC lets it read, which is not
	// admission's business.
	if _, err := u.api.BGPAdvertisements(harness.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing with an unbound token: %v", err)
	}
	own := advertisement("unbound-0", "node-a")
	cleanupAdvertisement(t, env, own.Name)
	_, err = u.api.BGPAdvertisements(harness.Namespace).Create(ctx, own, metav1.CreateOptions{})
	refused(t, "creating an advertisement with a token bound to no node", err, noNodeClaim)
	for _, want := range []string{"authentication.kubernetes.io/node-name", "galactic-installer", "--bound-object-kind Node"} {
		if err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not name %q", err, want)
		}
	}
	stored, err := env.API.BGPAdvertisements(harness.Namespace).Create(ctx, advertisement("unbound-1", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cleanupAdvertisement(t, env, stored.Name)
	err = u.api.BGPAdvertisements(harness.Namespace).Delete(ctx, stored.Name, metav1.DeleteOptions{})
	refused(t, "deleting an advertisement with a token bound to no node", err, noNodeClaim)
	_, err = u.api.Leases(harness.Namespace).Create(ctx, handoff.LeaseFromRecord(harness.Namespace, names.Lease("blue", "unbound-0"), "", handoff.Record{HolderIdentity: names.Holder("node-a", "c1"), LeaseDurationSeconds: 5}), metav1.CreateOptions{})
	refused(t, "taking a lease with a token bound to no node", err, noNodeClaim)

	// The message is the one the installation guide tells operators about.
	doc, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "install", "installation.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), noNodeClaim) {
		t.Errorf("docs/install/installation.md does not quote the refusal %q", noNodeClaim)
	}
}

func TestAnAdministratorAndOtherIdentitiesAreNotRestricted(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	advs := env.API.BGPAdvertisements(harness.Namespace)
	for _, node := range []string{"node-a", "node-b"} {
		adv := advertisement("admin-0", node)
		cleanupAdvertisement(t, env, adv.Name)
		got, err := advs.Create(ctx, adv, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the administrator creating %s's advertisement: %v", node, err)
		}
		got.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNoVNI, Message: "admin", LastTransitionTime: metav1.Now()}}
		if _, err := advs.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Errorf("the administrator writing %s's status: %v", node, err)
		}
	}
	// Repairing a node's record by hand, spec.node included.
	got, err := advs.Get(ctx, names.Advertisement("blue", "admin-0", "node-b"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Node = "node-c"
	if _, err := advs.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the administrator changing spec.node: %v", err)
	}
	leases := env.API.Leases(harness.Namespace)
	name := names.Lease("blue", "admin-0")
	t.Cleanup(func() {
		_ = env.Kube.CoordinationV1().Leases(harness.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
	lease, err := leases.Create(ctx, handoff.LeaseFromRecord(harness.Namespace, name, "", handoff.Record{HolderIdentity: names.Holder("node-b", "c1"), LeaseDurationSeconds: 5}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the administrator writing node-b as holder: %v", err)
	}
	lease.Spec.HolderIdentity = nil
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Errorf("the administrator clearing node-b's hold: %v", err)
	}
}

// The harness gives every node its own credential; the API server sees it
// as the node's service account bound to that node.
func TestEveryHarnessNodeAuthenticatesAsItsOwnNode(t *testing.T) {
	env := harness.Setup(t)
	n := env.NewNode(t, "node-whoami")
	cfg, err := client.LoadConfig(n.Settings.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	if want := "system:serviceaccount:" + harness.Namespace + ":" + harness.ServiceAccount; u.Username != want {
		t.Errorf("node kubeconfig authenticates as %q, want %q", u.Username, want)
	}
	if got := u.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-whoami" {
		t.Errorf("node kubeconfig's node claim %v, want [node-whoami]", got)
	}
}

// A node name that is no label value is labelled by its hash, and one that
// makes the advertisement's name too long is named by its hash; CEL cannot
// hash, so the policy takes the hash's shape, and consumers check spec.node.
func TestALongNodeNameWritesItsOwnAdvertisementAndLeaseUnderItsHashedNames(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	label := strings.Repeat("x", 60)
	for _, node := range []string{
		"node-" + label + ".example", // label hashed
		strings.Join([]string{label, label, label, strings.Repeat("y", 56)}, "."), // label and name hashed
	} {
		n := asNode(t, env, node)
		adv := advertisement("long-0", node)
		cleanupAdvertisement(t, env, adv.Name)
		if adv.Labels[v1alpha1.LabelNode] == node {
			t.Fatalf("%d-character node name labelled as itself", len(node))
		}
		if _, err := n.api.BGPAdvertisements(harness.Namespace).Create(ctx, adv, metav1.CreateOptions{}); err != nil {
			t.Errorf("a node called %d characters creating its own advertisement %s: %v", len(node), adv.Name, err)
		}
		name := names.Lease("blue", "long-0")
		t.Cleanup(func() {
			_ = env.Kube.CoordinationV1().Leases(harness.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		})
		l, err := handoff.New(n.api.Leases(harness.Namespace), harness.Namespace, name, handoff.Options{LeaseDuration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		g, err := l.Acquire(ctx, names.Holder(node, "c1"))
		if err != nil {
			t.Errorf("a node called %d characters taking a free lease: %v", len(node), err)
			continue
		}
		if err := l.Release(ctx, g); err != nil {
			t.Errorf("a node called %d characters releasing its lease: %v", len(node), err)
		}
	}
}

// The DaemonSet pod's token buys the node its own credential: a token
// bound to its Node, which carries the node claim this policy reads and
// stays valid after the pod is gone (a rollout deletes the old pod before
// the new one runs). It cannot buy another node's, nor a token that names
// no node.
func TestAPodTokenBuysATokenBoundToItsOwnNodeOnlyAndThatTokenOutlivesThePod(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	const node = "node-rollout"
	podToken, err := env.NodeToken(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	pod := as(t, env, podToken)
	sa := pod.kube.CoreV1().ServiceAccounts(harness.Namespace)
	seconds := int64(3600)
	request := func(bound *authenticationv1.BoundObjectReference) (string, error) {
		tr, err := sa.CreateToken(ctx, harness.ServiceAccount, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds, BoundObjectRef: bound}}, metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		return tr.Status.Token, nil
	}
	if _, err := env.NodeBoundToken(ctx, "node-other"); err != nil { // the Node exists
		t.Fatal(err)
	}
	_, err = request(harness.NodeRef("node-other"))
	refused(t, "a token bound to another node", err, "may request only tokens bound to its own Node")
	_, err = request(nil)
	refused(t, "a token bound to nothing", err, "may request only tokens bound to its own Node")
	_, err = request(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "galactic-node-" + node})
	refused(t, "a token bound to a pod", err, "may request only tokens bound to its own Node")
	nodeToken, err := request(harness.NodeRef(node))
	if err != nil {
		t.Fatalf("a token bound to its own Node: %v", err)
	}

	// The DaemonSet pod goes, as in a rollout.
	podName := "galactic-node-" + node
	if err := env.Kube.CoreV1().Pods(harness.Namespace).Delete(ctx, podName, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, "the deleted pod's token refused", func() error {
		_, err := pod.api.BGPAdvertisements(harness.Namespace).List(ctx, metav1.ListOptions{})
		if apierrors.IsUnauthorized(err) {
			return nil
		}
		return fmt.Errorf("it still authenticates: %v", err)
	})
	n := as(t, env, nodeToken)
	review, err := n.kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the node-bound token after its pod went: %v", err)
	}
	if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != node {
		t.Fatalf("node claim of the node-bound token %v, want [%s]", got, node)
	}
	own := advertisement("rollout-0", node)
	cleanupAdvertisement(t, env, own.Name)
	if _, err := n.api.BGPAdvertisements(harness.Namespace).Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the node-bound token writing its node's advertisement after the pod went: %v", err)
	}
	other := advertisement("rollout-1", "node-other")
	cleanupAdvertisement(t, env, other.Name)
	_, err = n.api.BGPAdvertisements(harness.Namespace).Create(ctx, other, metav1.CreateOptions{})
	refused(t, "the node-bound token writing another node's advertisement", err, "may write only its own BGPAdvertisements")
	// And it renews itself, as galactic-installer run does.
	n2 := as(t, env, nodeToken).kube.CoreV1().ServiceAccounts(harness.Namespace)
	if _, err := n2.CreateToken(ctx, harness.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds, BoundObjectRef: harness.NodeRef(node)}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the node-bound token renewing itself: %v", err)
	}
}
