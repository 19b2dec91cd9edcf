// Package cluster runs the shipped manifests on a three-node cluster as a
// cluster runs them: kube-apiserver with Node and RBAC authorization and
// NodeRestriction, kube-controller-manager and kube-scheduler, and one
// containerd and registered kubelet per node (each node a network
// namespace on the test fabric and a mount namespace of its own), applied
// with the real kubectl through a kustomize overlay that sets only the
// image and the fabric values. One cluster serves every test of the
// package, in order: install, pods across nodes, a move, uninstall.
package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/test/harness"
)

var nodeNames = []string{"node-a", "node-b", "node-c"}

// fixture is the package's cluster, started by the first test.
type fixture struct {
	c       *harness.Cluster
	fabric  *harness.Fabric
	nodes   map[string]*harness.ClusterNode
	ref     string
	archive string
	overlay string
	// installed is set once the DaemonSet is ready on every node.
	installed bool
}

var fx *fixture

func TestMain(m *testing.M) {
	code := m.Run()
	if fx != nil {
		fx.c.Close()
		fx.fabric.Close()
	}
	os.Exit(code)
}

// setup starts the cluster on first use: the control plane, the fabric
// with FRR as reflector, `make image` and three nodes with it imported.
func setup(t *testing.T) *fixture {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the control plane, the kubelet and containerd on the first run")
	}
	harness.RequireRoot(t)
	harness.RequireFRR(t)
	if fx != nil {
		return fx
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := harness.StartCluster(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	fabric, err := harness.CreateFabric(harness.FabricOptions{ASN: 65010})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	fx = &fixture{c: c, fabric: fabric, nodes: map[string]*harness.ClusterNode{}, overlay: t.TempDir()}
	dir, err := os.MkdirTemp("", "galactic-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if fx.archive, fx.ref, err = harness.MakeImage(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range nodeNames {
		n, err := c.AddNode(ctx, fabric, fx.archive, name)
		if err != nil {
			t.Fatal(err)
		}
		fx.nodes[name] = n
	}
	if err := harness.WriteOverlay(fx.overlay, fx.ref, fabric); err != nil {
		t.Fatal(err)
	}
	return fx
}

// requireInstalled skips t when the install test did not get the
// DaemonSet ready.
func requireInstalled(t *testing.T) *fixture {
	t.Helper()
	f := setup(t)
	if !f.installed {
		t.Skip("needs TestKubectlApplyOfTheOverlayMakesTheDaemonSetReadyOnEveryNodeAndTheRoutersPeer to pass first")
	}
	return f
}

// eventually polls cond every 250 ms until it holds or limit passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, limit, detail)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (f *fixture) dumpOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		out, _ := f.c.Kubectl(context.Background(), "get", "pods", "-A", "-o", "wide")
		t.Logf("pods:\n%s", out)
		for _, name := range nodeNames {
			n := f.nodes[name]
			if n == nil {
				continue
			}
			t.Logf("%s kubelet log:\n%s", name, n.Kubelet.LogTail(30))
			t.Logf("%s containerd log:\n%s", name, n.Ctd.LogTail(20))
			if b, err := os.ReadFile(n.HostPath("/var/log/galactic/galactic.log")); err == nil {
				t.Logf("%s galactic log (tail):\n%s", name, tail(string(b), 30))
			}
		}
	})
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestKubectlApplyOfTheOverlayMakesTheDaemonSetReadyOnEveryNodeAndTheRoutersPeer(t *testing.T) {
	f := setup(t)
	f.dumpOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rendered, err := f.c.Kubectl(ctx, "kustomize", f.overlay)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rendered), "REPLACE_ME") || !strings.Contains(string(rendered), "image: "+f.ref) {
		t.Fatalf("the overlay does not set the image %s everywhere:\n%s", f.ref, rendered)
	}
	// A node without the dedicated label gets no galactic pod.
	plain := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-plain", Labels: map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/hostname": "node-plain"}}}
	if _, err := f.c.Kube.CoreV1().Nodes().Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Kubectl(ctx, "apply", "--server-side", "-k", f.overlay); err != nil {
		t.Fatal(err)
	}
	if err := f.c.WaitDaemonSetReady(ctx, len(nodeNames)); err != nil {
		t.Fatal(err)
	}
	pods, err := f.c.Kube.CoreV1().Pods(harness.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=galactic-node"})
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for _, p := range pods.Items {
		on = append(on, p.Spec.NodeName)
		for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			if ctr.Image != f.ref {
				t.Errorf("pod %s container %s runs %s, want %s", p.Name, ctr.Name, ctr.Image, f.ref)
			}
		}
	}
	slices.Sort(on)
	if !slices.Equal(on, nodeNames) {
		t.Fatalf("galactic pods on %v, want one on each of %v", on, nodeNames)
	}

	// The init container wrote into each node's own tree, and nothing into
	// this machine's.
	for _, name := range nodeNames {
		n := f.nodes[name]
		for _, p := range []string{"/opt/cni/bin/galactic-cni", "/opt/cni/bin/galactic-bgp", "/etc/cni/net.d/10-galactic.conflist",
			"/etc/galactic/node.json", "/etc/galactic/kubeconfig", "/etc/galactic/router.json"} {
			if _, err := os.Stat(n.HostPath(p)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	for _, p := range []string{"/etc/cni/net.d/10-galactic.conflist", "/opt/cni/bin/galactic-cni", "/etc/galactic"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists on this machine: a node wrote outside its own tree", p)
		}
	}
	// Every router has its session with the reflector.
	eventually(t, 2*time.Minute, "FRR's sessions with every node", func() (bool, string) {
		states, err := f.fabric.PeerStates()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range nodeNames {
			if states[f.nodes[name].Underlay.String()] != "Established" {
				return false, fmt.Sprint(states)
			}
		}
		return true, ""
	})
	f.installed = !t.Failed()
}
