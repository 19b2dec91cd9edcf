package availability

import (
	"context"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/test/harness"
)

// runtimeAccount is a runtime's own identity, bound to the galactic-runtime
// Role as docs/concepts/handoff-and-availability.md shows.
const runtimeAccount = "vmm-supervisor"

// runtimeToken binds runtimeAccount to the shipped Role and returns a
// token of it from the TokenRequest API.
func runtimeToken(t *testing.T, env *harness.Env) string {
	t.Helper()
	ctx := context.Background()
	if err := harness.ApplyManifests(ctx, env.CP.Admin, filepath.Join(harness.RepoRoot(), "installer", "manifests", "runtime-rbac.yaml")); err != nil {
		t.Fatalf("applying runtime-rbac.yaml: %v", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: runtimeAccount, Namespace: harness.Namespace}}
	if _, err := env.Kube.CoreV1().ServiceAccounts(harness.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: runtimeAccount, Namespace: harness.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "galactic-runtime"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: runtimeAccount, Namespace: harness.Namespace}},
	}
	if _, err := env.Kube.RbacV1().RoleBindings(harness.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token, err := env.Token(ctx, runtimeAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func TestARuntimeBoundToTheRuntimeRoleCanReportButCannotWriteAdvertisements(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	tok := runtimeToken(t, env)
	cfg := env.TokenConfig(tok)
	api, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The command under the runtime's own kubeconfig, on a node where
	// galactic-cni (with the node's identity) attached the container.
	a := newAttachment(t, env, "rbac", 10, 60)
	node := env.NewNode(t, "node-a")
	c1 := harness.NewContainer(t)
	node.AddIn(t, a, c1)
	kubeconfig := filepath.Join(node.Dir, "runtime-kubeconfig")
	if err := harness.WriteKubeconfig(kubeconfig, env.CP.Server, env.CP.CAFile, &clientcmdapi.AuthInfo{Token: tok}); err != nil {
		t.Fatal(err)
	}
	asRuntime := []string{settings.EnvKubeconfig + "=" + kubeconfig}
	if r := report(t, a, node, "available", c1, asRuntime); r.code != exitOK {
		t.Fatalf("available as the runtime: exit %d: %s", r.code, r.stderr)
	}
	checkAvailability(t, env, a, node.HolderOf(c1), 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	if r := report(t, a, node, "unavailable", c1, asRuntime, "--reason", "ShuttingDown"); r.code != exitOK {
		t.Fatalf("unavailable as the runtime: exit %d: %s", r.code, r.stderr)
	}
	checkAvailability(t, env, a, node.HolderOf(c1), 1, metav1.ConditionFalse, "ShuttingDown")

	// The library under the same identity: one get, one update.
	leases := api.Leases(harness.Namespace)
	lock, err := handoff.New(leases, harness.Namespace, a.LeaseName(), handoff.Options{LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.SetAvailable(ctx, node.HolderOf(c1), 1, true, "Serving"); err != nil {
		t.Fatalf("SetAvailable as the runtime: %v", err)
	}
	checkAvailability(t, env, a, node.HolderOf(c1), 1, metav1.ConditionTrue, "Serving")

	other := "galactic-rbac-other"
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	adv := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement(vpc, "rbac-x", "node-a"), Labels: names.AdvertisementLabels(vpc, "rbac-x", "node-a")},
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: vpc, Attachment: "rbac-x", Node: "node-a"},
	}
	existing := names.Advertisement(vpc, a.Name, node.Name)
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"create an advertisement", func() error {
			_, err := api.BGPAdvertisements(harness.Namespace).Create(ctx, adv, metav1.CreateOptions{})
			return err
		}},
		{"update an advertisement", func() error {
			got, err := env.API.BGPAdvertisements(harness.Namespace).Get(ctx, existing, metav1.GetOptions{})
			if err != nil {
				return err
			}
			got.Spec.Prefixes = nil
			_, err = api.BGPAdvertisements(harness.Namespace).Update(ctx, got, metav1.UpdateOptions{})
			return err
		}},
		{"delete an advertisement", func() error {
			return api.BGPAdvertisements(harness.Namespace).Delete(ctx, existing, metav1.DeleteOptions{})
		}},
		{"update an advertisement's status", func() error {
			got, err := env.API.BGPAdvertisements(harness.Namespace).Get(ctx, existing, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = api.BGPAdvertisements(harness.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
			return err
		}},
		{"create a lease", func() error {
			_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "av.rbac-new"}}, metav1.CreateOptions{})
			return err
		}},
		{"delete a lease", func() error {
			return leases.Delete(ctx, a.LeaseName(), metav1.DeleteOptions{})
		}},
		{"list leases", func() error {
			_, err := leases.List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get a lease in another namespace", func() error {
			_, err := api.Leases(other).Get(ctx, a.LeaseName(), metav1.GetOptions{})
			return err
		}},
	} {
		if err := c.call(); !apierrors.IsForbidden(err) {
			t.Errorf("the runtime must be forbidden to %s, got %v", c.what, err)
		}
	}

	review, err := kube.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx,
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: harness.Namespace}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("rules review: %v", err)
	}
	var got []string
	for _, r := range review.Status.ResourceRules {
		for _, g := range r.APIGroups {
			if g != "coordination.k8s.io" && g != v1alpha1.SchemeGroupVersion.Group && g != "*" {
				continue
			}
			for _, res := range r.Resources {
				got = append(got, g+"/"+res+":"+strings.Join(slices.Sorted(slices.Values(r.Verbs)), ","))
			}
		}
	}
	sort.Strings(got)
	if want := []string{"coordination.k8s.io/leases:get,update"}; !slices.Equal(got, want) {
		t.Errorf("the runtime's rules in %s: got %v, want %v", harness.Namespace, got, want)
	}
	node.Del(t, a, c1)
}
