// Package cluster runs the shipped manifests on a control plane as a
// cluster runs it: kube-apiserver with Node and RBAC authorization and
// NodeRestriction, kube-controller-manager and kube-scheduler, applied with
// the real kubectl through a kustomize overlay that sets only the image and
// the fabric values.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/test/harness"
)

// overlay writes a kustomize overlay of installer/manifests into dir that
// sets the image (by digest) and the router's fabric values, nothing else.
func overlay(t *testing.T, dir, imageRef string) {
	t.Helper()
	rel, err := filepath.Rel(dir, filepath.Join(harness.RepoRoot(), "installer", "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	name, digest, ok := strings.Cut(imageRef, "@")
	if !ok {
		t.Fatalf("image reference %q is not by digest", imageRef)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: galactic.example/galactic
  newName: %s
  digest: %s
patches:
- path: fabric.yaml
`, rel, name, digest)
	fabric := `apiVersion: v1
kind: ConfigMap
metadata:
  name: galactic-router
  namespace: galactic-system
data:
  router.json: |
    {
      "asn": 65010,
      "routeTargetASN": 65000,
      "listenPort": -1,
      "gracefulRestart": { "enabled": true, "restartSeconds": 120 },
      "withdrawHoldSeconds": 10,
      "peers": [ { "address": "192.0.2.1", "asn": 65010, "holdSeconds": 9, "keepaliveSeconds": 3 } ],
      "metricsAddress": "127.0.0.1:9655"
    }
`
	for f, data := range map[string]string{"kustomization.yaml": k, "fabric.yaml": fabric} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// makeImage runs `make image` into a directory of its own and returns the
// image's reference by digest.
func makeImage(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("make", "image", "BIN="+bin)
	cmd.Dir = harness.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	ref, err := os.ReadFile(filepath.Join(bin, "galactic-image.ref"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ref))
}

func TestKubectlApplyOfTheOverlayPutsTheDaemonSetOnEveryDedicatedNodeAndNowhereElse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kube-controller-manager, kube-scheduler and kubectl on the first run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, err := harness.StartCluster(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	ref := makeImage(t)
	dir := t.TempDir()
	overlay(t, dir, ref)
	rendered, err := c.Kubectl(ctx, "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rendered), "REPLACE_ME") || !strings.Contains(string(rendered), "image: "+ref) {
		t.Fatalf("the overlay does not set the image %s everywhere:\n%s", ref, rendered)
	}
	if _, err := c.Kubectl(ctx, "apply", "--server-side", "-k", dir); err != nil {
		t.Fatal(err)
	}
	dedicated := []string{"node-a", "node-b", "node-c"}
	taint := harness.VPCNodeTaint()
	for _, n := range append(slices.Clone(dedicated), "node-plain") {
		// The labels a kubelet registers with, and the dedicated nodes' own.
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/hostname": n}}}
		if n != "node-plain" {
			node.Labels[harness.VPCNodeLabel] = "true"
			node.Spec.Taints = []corev1.Taint{taint}
		}
		if _, err := c.Kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The DaemonSet controller makes one pod per dedicated node, pinned to
	// it by node affinity, with the image by digest.
	var got []string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := c.Kube.CoreV1().Pods(harness.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=galactic-node"})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, p := range pods.Items {
			got = append(got, affinityNode(p))
			for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
				if ctr.Image != ref {
					t.Fatalf("pod %s container %s runs %s, want %s", p.Name, ctr.Name, ctr.Image, ref)
				}
			}
		}
		slices.Sort(got)
		if slices.Equal(got, dedicated) {
			break
		}
		if time.Now().After(deadline) {
			ds, _ := c.Kubectl(ctx, "-n", harness.Namespace, "describe", "daemonset", "galactic-node")
			t.Fatalf("DaemonSet pods for nodes %v, want one for each of %v\n%s", got, dedicated, ds)
		}
		time.Sleep(500 * time.Millisecond)
	}
	ds, err := c.Kube.AppsV1().DaemonSets(harness.Namespace).Get(ctx, "galactic-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.DesiredNumberScheduled != int32(len(dedicated)) {
		t.Errorf("DaemonSet wants %d pods, want %d (the dedicated nodes only)", ds.Status.DesiredNumberScheduled, len(dedicated))
	}
}

// affinityNode is the node a DaemonSet pod is pinned to.
func affinityNode(p corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}
