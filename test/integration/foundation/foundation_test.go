package foundation

import (
	"context"
	"strconv"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

func advertisement(vpc, att, node string, prefixes ...v1alpha1.Prefix) *v1alpha1.BGPAdvertisement {
	return &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{
			Name:   names.Advertisement(vpc, att, node),
			Labels: names.AdvertisementLabels(vpc, att, node),
		},
		Spec: v1alpha1.BGPAdvertisementSpec{
			VPC: vpc, Attachment: att, Node: node, Prefixes: prefixes,
			Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "net0", Netns: "/var/run/netns/x", Prefixes: prefixes}},
		},
	}
}

func TestTheAPIServerGuardsEveryWriteWithResourceVersionAndPreconditions(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	advs := env.API.BGPAdvertisements(harness.Namespace)

	created, err := advs.Create(ctx, advertisement("blue", "web-0-net0", "node-a", "10.20.0.5/32", "fd20::5/128"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = advs.Delete(ctx, created.Name, metav1.DeleteOptions{}) })

	// A write carrying the resourceVersion it read wins once.
	first := created.DeepCopy()
	first.Spec.Prefixes = []v1alpha1.Prefix{"10.20.0.5/32"}
	first.Spec.Containers[0].Prefixes = first.Spec.Prefixes
	updated, err := advs.Update(ctx, first, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update with the current resourceVersion: %v", err)
	}

	// The same stale resourceVersion again is a conflict.
	stale := created.DeepCopy()
	stale.Spec.Prefixes = []v1alpha1.Prefix{"fd20::5/128"}
	if _, err := advs.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update with a stale resourceVersion: want a conflict, got %v", err)
	}

	// Delete with preconditions that no longer match is a conflict and deletes nothing.
	staleRV := created.ResourceVersion
	err = advs.Delete(ctx, created.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID, ResourceVersion: &staleRV}})
	if !apierrors.IsConflict(err) {
		t.Fatalf("delete with a stale resourceVersion precondition: want a conflict, got %v", err)
	}
	if _, err := advs.Get(ctx, created.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the advertisement must survive a failed guarded delete: %v", err)
	}

	// With the current UID and resourceVersion the delete goes through.
	rv := updated.ResourceVersion
	if err := advs.Delete(ctx, created.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &updated.UID, ResourceVersion: &rv}}); err != nil {
		t.Fatalf("guarded delete: %v", err)
	}
}

func TestTheCRDRejectsInvalidAndDuplicatePrefixes(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	advs := env.API.BGPAdvertisements(harness.Namespace)

	for _, tc := range []struct {
		name     string
		prefixes []v1alpha1.Prefix
		want     string
	}{
		{"an invalid prefix", []v1alpha1.Prefix{"10.20.0.300/32"}, "must be a CIDR"},
		{"a duplicate prefix", []v1alpha1.Prefix{"10.20.0.5/32", "10.20.0.5/32"}, "Duplicate value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := advs.Create(ctx, advertisement("blue", "bad-prefix", "node-a", tc.prefixes...), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an Invalid error mentioning %q, got %v", tc.want, err)
			}
		})
	}
}

func TestCNIToolRunsAChainInsideANodeNamespace(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	container := harness.NewContainer(t)
	if out, err := container.Run("ip", "link", "set", "lo", "down"); err != nil {
		t.Fatalf("lo down: %v %s", err, out)
	}
	node.WriteConflist(t, map[string]any{
		"cniVersion": "1.1.0",
		"name":       "lo-only",
		"plugins":    []any{map[string]any{"type": "loopback"}},
	})
	if _, err := node.CNITool("add", "lo-only", container, "lo"); err != nil {
		t.Fatal(err)
	}
	out, err := container.Run("ip", "-o", "link", "show", "lo")
	if err != nil || !strings.Contains(out, "UP") {
		t.Fatalf("loopback should be up after ADD: %v %s", err, out)
	}
	if _, err := node.CNITool("del", "lo-only", container, "lo"); err != nil {
		t.Fatal(err)
	}
}

func TestANodeReachesTheAPIServerOnlyThroughItsForwarder(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	probe := func() error {
		_, err := node.Run("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+strconv.Itoa(env.CP.Port))
		return err
	}
	if err := probe(); err != nil {
		t.Fatalf("node should reach the API server: %v", err)
	}
	if err := node.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	if err := probe(); err == nil {
		t.Fatal("a cut node must not reach the API server")
	}
	if err := node.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	if err := probe(); err != nil {
		t.Fatalf("node should reach the API server again: %v", err)
	}
}
