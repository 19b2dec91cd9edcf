// Package cluster runs the shipped manifests on a three-node cluster as a
// cluster runs them: kube-apiserver with Node and RBAC authorization and
// NodeRestriction, kube-controller-manager and kube-scheduler, and one
// containerd and registered kubelet per node (each node a network
// namespace on the test fabric and a mount namespace of its own), applied
// with the real kubectl through a kustomize overlay that sets only the
// image, the fabric values and table routing (this kernel has no VRF).
// One cluster serves every test of the
// package, in order: install, kubectl logs and exec, pods across nodes, a
// move, a rolling update, uninstall.
package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
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
	// dir holds the images and overlays; removed with the cluster.
	dir string
	// installed is set once the DaemonSet is ready on every node.
	installed bool
	// workloads are the pods the pod test made, once they ping.
	workloads []*workload
	// tenant is namespace tenant-a with VPC blue, the workloads' and their
	// VPCAttachments', which galactic-controller allocates.
	tenant *harness.Tenant
}

var fx *fixture

func TestMain(m *testing.M) {
	harness.Main(m, func() {
		if fx != nil {
			fx.c.Close()
			fx.fabric.Close()
			harness.RemoveDir(fx.dir)
		}
	})
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
	// The first run builds the control plane, the kubelet and containerd
	// while other packages' tests load both cores; that takes as long as
	// it takes and must not eat the deadline of starting the cluster.
	if err := buildEverything(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := harness.StartCluster(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	fabric, err := harness.CreateClusterFabric()
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	fx = &fixture{c: c, fabric: fabric, nodes: map[string]*harness.ClusterNode{}}
	if fx.dir, err = harness.MkdirTemp("galactic-cluster-test-"); err != nil {
		t.Fatal(err)
	}
	if fx.overlay, err = fx.subdir("overlay"); err != nil {
		t.Fatal(err)
	}
	image, err := fx.subdir("image")
	if err != nil {
		t.Fatal(err)
	}
	if fx.archive, fx.ref, err = harness.MakeImage(image); err != nil {
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

func (f *fixture) subdir(name string) (string, error) {
	d := filepath.Join(f.dir, name)
	return d, os.MkdirAll(d, 0o755)
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

// requireWorkloads is requireInstalled for the tests that use the pod
// test's two workloads.
func requireWorkloads(t *testing.T) *fixture {
	t.Helper()
	f := requireInstalled(t)
	if len(f.workloads) != 2 {
		t.Skip("needs TestAnnotatedPodsOnTwoNodesGetTheirAddressesAdvertisedAndPingEachOther to pass first")
	}
	f.dumpOnFailure(t)
	return f
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
			// The galactic containers' own output, kept by the kubelet.
			logs, _ := filepath.Glob(filepath.Join(n.Kubelet.Dir, "pods-logs", harness.Namespace+"_galactic-node-*", "*", "*.log"))
			for _, l := range logs {
				if b, err := os.ReadFile(l); err == nil {
					t.Logf("%s %s:\n%s", name, strings.TrimPrefix(l, n.Kubelet.Dir), tail(string(b), 25))
				}
			}
		}
	})
}

func buildEverything() error {
	if _, err := harness.EnsureControlPlaneBinaries(os.Stderr); err != nil {
		return err
	}
	if _, err := harness.EnsureClusterBinaries(os.Stderr); err != nil {
		return err
	}
	if _, err := harness.EnsureCRIBinaries(os.Stderr); err != nil {
		return err
	}
	_, err := harness.EnsureKubelet(os.Stderr)
	return err
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
	f.requireImage(t, ctx, f.ref)
	if err := f.c.WaitControllerReady(ctx, 2); err != nil {
		t.Fatal(err)
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
	harness.Eventually(t, 2*time.Minute, "FRR's sessions with every node", func() error {
		states, err := f.fabric.PeerStates()
		if err != nil {
			return err
		}
		for _, name := range nodeNames {
			if states[f.nodes[name].Underlay.String()] != "Established" {
				return fmt.Errorf("%v", states)
			}
		}
		return nil
	})
	f.installed = !t.Failed()
}

// TestKubectlLogsAndExecReachAPodOnEveryNodeAndTheKubeletsCarryTheirRelease
// uses the cluster as an operator does: the API server reaches each
// node's kubelet for the galactic pod's logs and for a command in it, and
// every node reports the release its kubelet was built from.
func TestKubectlLogsAndExecReachAPodOnEveryNodeAndTheKubeletsCarryTheirRelease(t *testing.T) {
	f := requireInstalled(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	server, err := f.c.Kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(server.GitVersion, "v1.") {
		t.Errorf("the API server calls itself %q, not a release", server.GitVersion)
	}
	pods, err := f.c.Kube.CoreV1().Pods(harness.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=galactic-node"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range nodeNames {
		node, err := f.c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v := node.Status.NodeInfo.KubeletVersion; v != server.GitVersion {
			t.Errorf("%s's kubelet reports %q, the API server %q: both are built from one k8s.io/kubernetes release", name, v, server.GitVersion)
		}
		var pod string
		for _, p := range pods.Items {
			if p.Spec.NodeName == name {
				pod = p.Name
			}
		}
		if pod == "" {
			t.Errorf("no galactic pod on %s", name)
			continue
		}
		logs, err := f.c.Kubectl(ctx, "-n", harness.Namespace, "logs", pod, "-c", "router")
		if err != nil {
			t.Errorf("kubectl logs of %s's router: %v", name, err)
		} else if want := fmt.Sprintf(`"node":%q`, name); !strings.Contains(string(logs), `"component":"galactic-router"`) || !strings.Contains(string(logs), want) {
			t.Errorf("kubectl logs of %s's router does not show the router's log lines (%s):\n%s", name, want, tail(string(logs), 10))
		}
		out, err := f.c.Kubectl(ctx, "-n", harness.Namespace, "exec", pod, "-c", "router", "--", "galactic-router", "help")
		if err != nil {
			t.Errorf("kubectl exec in %s's router: %v", name, err)
		} else if !strings.Contains(string(out), "galactic-router drain") {
			t.Errorf("kubectl exec of galactic-router help in %s's router printed:\n%s", name, out)
		}
	}
}

// tenantA is the namespace of the workloads and their VPCAttachments.
const tenantA = "tenant-a"

// vpcPod is a VPC workload of tenant-a naming its VPCAttachment
// attachment, kept off the nodes of the other pods labelled spread.
func vpcPod(name, attachment string) *corev1.Pod {
	spread := map[string]string{"app": "ping"}
	p := harness.VPCPod(name, attachment)
	p.Namespace = tenantA
	p.Labels = spread
	p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: spread}, TopologyKey: "kubernetes.io/hostname"}},
	}}
	return p
}

// attachment makes VPCAttachment name requesting addr in tenant-a's VPC
// blue (the namespace and the VPC too, on first use) and waits until
// galactic-controller made it Ready. They stay until the uninstall test.
func (f *fixture) attachment(t *testing.T, name string, addr netip.Addr) *v1alpha1.VPCAttachment {
	t.Helper()
	if f.tenant == nil {
		env, err := f.c.Env()
		if err != nil {
			t.Fatal(err)
		}
		f.tenant = env.NewLastingTenant(t, tenantA, "blue", "10.20.0.0/24")
	}
	return f.tenant.Attach(t, name, "", addr.String())
}

// createPod creates p and waits until it is Ready; it returns the node
// the scheduler put it on.
func (f *fixture) createPod(t *testing.T, ctx context.Context, p *corev1.Pod) *harness.ClusterNode {
	t.Helper()
	if _, err := f.c.Kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return f.waitPodReady(t, ctx, p.Namespace, p.Name)
}

func (f *fixture) waitPodReady(t *testing.T, ctx context.Context, namespace, name string) *harness.ClusterNode {
	t.Helper()
	var node string
	harness.Eventually(t, 3*time.Minute, "pod "+name+" Ready", func() error {
		p, err := f.c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node = p.Spec.NodeName
		if podReady(p) {
			return nil
		}
		return fmt.Errorf("on %q, phase %s, conditions %+v", node, p.Status.Phase, p.Status.Conditions)
	})
	n := f.nodes[node]
	if n == nil {
		t.Fatalf("pod %s is on %q, not a cluster node", name, node)
	}
	return n
}

// deletePod deletes a pod and waits until it is gone.
func (f *fixture) deletePod(t *testing.T, ctx context.Context, namespace, name string) {
	t.Helper()
	if err := f.c.Kube.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	harness.Eventually(t, 2*time.Minute, "pod "+name+" gone", func() error {
		_, err := f.c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// workload is a pod of the package's tests, attached and reachable.
type workload struct {
	name, attachment string
	addr             netip.Addr
	node             *harness.ClusterNode
	netns            *harness.Netns
	// object is its VPCAttachment; the nodes name it by its data-plane names.
	object *v1alpha1.VPCAttachment
}

// dataplane are the nodes' names of the workload's attachment.
func (w *workload) dataplane() (string, string) {
	return w.object.Status.Dataplane.VPC, w.object.Status.Dataplane.Attachment
}

func TestAnnotatedPodsOnTwoNodesGetTheirAddressesAdvertisedAndPingEachOther(t *testing.T) {
	f := requireInstalled(t)
	f.dumpOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, err := f.c.Env()
	if err != nil {
		t.Fatal(err)
	}
	pods := []*workload{
		{name: "web-0", attachment: "web-0-net0", addr: netip.MustParseAddr("10.20.0.5")},
		{name: "web-1", attachment: "web-1-net0", addr: netip.MustParseAddr("10.20.0.6")},
	}
	for _, w := range pods {
		w.object = f.attachment(t, w.attachment, w.addr)
		if got := w.object.Status.Addresses; len(got) != 1 || got[0] != v1alpha1.Prefix(w.addr.String()+"/24") {
			t.Fatalf("galactic-controller gave %s the addresses %v, want %s/24", w.attachment, got, w.addr)
		}
		w.node = f.createPod(t, ctx, vpcPod(w.name, w.attachment))
		if w.netns, err = w.node.PodNetns(tenantA, w.name); err != nil {
			t.Fatal(err)
		}
	}
	if pods[0].node == pods[1].node {
		t.Fatalf("both pods on %s: the scheduler did not spread them", pods[0].node.Name)
	}
	for _, w := range pods {
		harness.Eventually(t, time.Minute, w.attachment+" advertised from "+w.node.Name, func() error {
			dpVPC, dpAtt := w.dataplane()
			advs := env.Advertisements(t, dpVPC, dpAtt)
			routes, err := f.fabric.EVPNRoutes()
			if err != nil {
				return err
			}
			_, fromNode := advs[w.node.Name]
			if len(advs) == 1 && fromNode && len(routes[netip.PrefixFrom(w.addr, 32)]) > 0 {
				return nil
			}
			return fmt.Errorf("advertisements %v, FRR paths %v", slices.Collect(maps.Keys(advs)), routes[netip.PrefixFrom(w.addr, 32)])
		})
	}
	for i, w := range pods {
		peer := pods[1-i]
		harness.Eventually(t, time.Minute, w.name+" pings "+peer.name, func() error {
			return w.netns.Ping(peer.addr)
		})
	}
	f.workloads = pods
}

// TestAPodOfAnotherNamespaceNeverStartsWithTenantAsNetworkAndTenantAIsUntouched:
// a pod in namespace mallory, on the node of tenant-a's web-0, names
// tenant-a's VPCAttachment, and another chooses VPC blue and web-0's
// address with annotations. Neither sandbox starts (the kubelet retries,
// and each event carries the CNI error naming the reason), and
// throughout, tenant-a's lease keeps its holder and token, its
// advertisement its entry, the other node its route, and pings between
// tenant-a's pods lose nothing.
func TestAPodOfAnotherNamespaceNeverStartsWithTenantAsNetworkAndTenantAIsUntouched(t *testing.T) {
	f := requireWorkloads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env, err := f.c.Env()
	if err != nil {
		t.Fatal(err)
	}
	web, peer := f.workloads[0], f.workloads[1]
	dpVPC, dpAtt := web.dataplane()
	prefix := netip.PrefixFrom(web.addr, 32)
	lease := env.Lease(t, names.Lease(dpVPC, dpAtt))
	adv := env.Advertisements(t, dpVPC, dpAtt)[web.node.Name]
	if len(adv.Spec.Containers) != 1 {
		t.Fatalf("web-0's advertisement has entries %+v", adv.Spec.Containers)
	}
	entry := adv.Spec.Containers[0]

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	routes, err := peer.node.WatchRoute(wctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := env.WatchLease(wctx, lease.Name)
	if err != nil {
		t.Fatal(err)
	}
	pinger, err := peer.netns.StartPinger(web.addr, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}

	const mallory = "mallory"
	if _, err := f.c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mallory}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.c.Kube.CoreV1().Namespaces().Delete(context.Background(), mallory, metav1.DeleteOptions{})
	})
	intruders := []struct {
		pod *corev1.Pod
		say []string
	}{
		{intruder("names-web-0", web.attachment, nil, web.node.Name),
			[]string{"VPCAttachment mallory/" + web.attachment, "does not exist in namespace mallory"}},
		{intruder("chooses-blue", "", map[string]string{"network.galactic.dev/vpc": "blue", "network.galactic.dev/addresses": web.addr.String() + "/24"}, web.node.Name),
			[]string{"pod annotation network.galactic.dev/", "is refused", "VPCAttachment"}},
	}
	for _, in := range intruders {
		if _, err := f.c.Kube.CoreV1().Pods(mallory).Create(ctx, in.pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Each sandbox fails, with the reason in the pod's events, more than
	// once (the kubelet retries); none becomes ready.
	for _, in := range intruders {
		harness.Eventually(t, 2*time.Minute, "pod mallory/"+in.pod.Name+"'s sandbox refused twice", func() error {
			evs, err := f.c.Kube.CoreV1().Events(mallory).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + in.pod.Name + ",reason=FailedCreatePodSandBox"})
			if err != nil {
				return err
			}
			var count int32
			var msg string
			for _, e := range evs.Items {
				count += max(e.Count, 1)
				msg = e.Message
			}
			for _, s := range in.say {
				if !strings.Contains(msg, s) {
					return fmt.Errorf("%d events, the last says %q, want %q", count, msg, s)
				}
			}
			if count < 2 {
				return fmt.Errorf("%d events: %s", count, msg)
			}
			t.Logf("pod mallory/%s: %d FailedCreatePodSandBox events, the last: %s", in.pod.Name, count, msg)
			return nil
		})
		p, err := f.c.Kube.CoreV1().Pods(mallory).Get(ctx, in.pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if podReady(p) || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod mallory/%s is %s (ready %v)", p.Name, p.Status.Phase, podReady(p))
		}
		if _, err := web.node.PodNetns(mallory, in.pod.Name); err == nil {
			t.Errorf("pod mallory/%s has a ready sandbox on %s", in.pod.Name, web.node.Name)
		}
	}
	for _, in := range intruders {
		f.deletePod(t, ctx, mallory, in.pod.Name)
	}

	st := pinger.Stop()
	if st.Lost > 0 || st.Received == 0 {
		t.Errorf("%s -> %s while mallory's pods were refused: %+v, want no reply lost", peer.name, web.name, st)
	}
	if ch := routes.Changes(); len(ch) != 0 {
		t.Errorf("%s's route to %s changed: %v", peer.node.Name, prefix, ch)
	}
	versions, err := leases.Versions()
	if err != nil {
		t.Fatal(err)
	}
	want := handoff.RecordFromLease(lease)
	for _, v := range versions {
		if v.Holder != want.HolderIdentity || v.Token != int64(want.LeaseTransitions) {
			t.Errorf("web-0's lease changed: %+v, was holder %q token %d", v, want.HolderIdentity, want.LeaseTransitions)
		}
	}
	now := env.Advertisements(t, dpVPC, dpAtt)
	if len(now) != 1 || len(now[web.node.Name].Spec.Containers) != 1 || !reflect.DeepEqual(now[web.node.Name].Spec.Containers[0], entry) {
		t.Errorf("web-0's advertisements changed: %+v, the entry was %+v", now, entry)
	}
	if err := peer.netns.Ping(web.addr); err != nil {
		t.Errorf("%s no longer reaches %s: %v", peer.name, web.name, err)
	}
}

// intruder is a pod of namespace mallory on node, naming attachment (if
// any) and carrying annotations.
func intruder(name, attachment string, annotations map[string]string, node string) *corev1.Pod {
	p := harness.VPCPod(name, attachment)
	p.Namespace = "mallory"
	if attachment == "" {
		delete(p.Annotations, netconf.AnnotationAttachment)
	}
	maps.Copy(p.Annotations, annotations)
	p.Spec.NodeSelector["kubernetes.io/hostname"] = node
	return p
}

func TestAMoveTheKubernetesWayChangesTheRouteAtTheThirdNodeOnceWithOneHolder(t *testing.T) {
	f := requireWorkloads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, err := f.c.Env()
	if err != nil {
		t.Fatal(err)
	}
	src, observer := f.workloads[0], f.workloads[1]
	var dst *harness.ClusterNode
	for _, n := range f.nodes {
		if n != src.node && n != observer.node {
			dst = n
		}
	}
	prefix := netip.PrefixFrom(src.addr, 32)
	dpVPC, _ := src.dataplane()
	if r, err := observer.node.KernelRoute(dpVPC, prefix); err != nil || r == nil || !gatewayIs(r.Gw, src.node.Underlay) {
		t.Fatalf("before the move %s routes %s by %+v (%v), want via %s", observer.node.Name, prefix, r, err, src.node.Underlay)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	routes, err := observer.node.WatchRoute(wctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := env.WatchLease(wctx, names.Lease(src.dataplane()))
	if err != nil {
		t.Fatal(err)
	}

	// Delete the pod and at once create its replacement on dst: with
	// handoff on, the replacement's ADD waits until the old pod's DEL has
	// released the attachment.
	if err := f.c.Kube.CoreV1().Pods(tenantA).Delete(ctx, src.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	moved := vpcPod(src.name+"-moved", src.attachment)
	moved.Labels, moved.Spec.Affinity = nil, nil
	moved.Spec.NodeSelector["kubernetes.io/hostname"] = dst.Name
	if n := f.createPod(t, ctx, moved); n != dst {
		t.Fatalf("the replacement runs on %s, want %s", n.Name, dst.Name)
	}
	f.workloads[0] = &workload{name: moved.Name, attachment: src.attachment, addr: src.addr, node: dst, object: src.object}
	if f.workloads[0].netns, err = dst.PodNetns(tenantA, moved.Name); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, observer.node.Name+" routing "+prefix.String()+" via "+dst.Name, func() error {
		r, err := observer.node.KernelRoute(dpVPC, prefix)
		if err == nil && r != nil && gatewayIs(r.Gw, dst.Underlay) {
			return nil
		}
		return fmt.Errorf("%+v %v", r, err)
	})
	harness.Eventually(t, time.Minute, observer.name+" pings the moved pod", func() error {
		return observer.netns.Ping(src.addr)
	})
	// The old node's withdrawal must not change the route again. Once FRR
	// holds only the new node's path, the withdrawal has gone out: a route
	// it held was replaced by the new path, and nothing is held.
	harness.Eventually(t, time.Minute, "FRR holding only "+dst.Name+"'s path for "+prefix.String(), func() error {
		routes, err := f.fabric.EVPNRoutes()
		if err != nil {
			return err
		}
		if ps := routes[prefix]; len(ps) != 1 || ps[0].NextHop != dst.Underlay.String() {
			return fmt.Errorf("paths %+v", ps)
		}
		return nil
	})
	if r, err := observer.node.KernelRoute(dpVPC, prefix); err != nil || r == nil || !gatewayIs(r.Gw, dst.Underlay) {
		t.Errorf("after the old node's withdrawal %s routes %s by %+v (%v), want via %s", observer.node.Name, prefix, r, err, dst.Underlay)
	}
	changes := routes.Changes()
	if len(changes) != 1 || changes[0].Deleted || changes[0].Via != dst.Underlay {
		t.Errorf("%s saw %d changes of %s, want one replace via %s: %v", observer.node.Name, len(changes), prefix, dst.Underlay, changes)
	}
	versions, err := leases.Versions()
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.OneHolder(versions); err != nil {
		t.Errorf("lease of %s: %v (%+v)", src.attachment, err, versions)
	}
	if last := versions[len(versions)-1]; !strings.HasPrefix(last.Holder, dst.Name) {
		t.Errorf("the lease's last holder is %q, want one on %s", last.Holder, dst.Name)
	}
}

func gatewayIs(gw []byte, want netip.Addr) bool {
	a, ok := netip.AddrFromSlice(gw)
	return ok && a.Unmap() == want
}

func TestARollingUpdateToAnotherBuildLosesNoReplyAndAPodCreatedMidRolloutStarts(t *testing.T) {
	f := requireWorkloads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// Another build of the same commit: another build time in every
	// layer, so another digest.
	image, err := f.subdir("image-2")
	if err != nil {
		t.Fatal(err)
	}
	archive, ref, err := harness.MakeImage(image, "SOURCE_DATE_EPOCH=1")
	if err != nil {
		t.Fatal(err)
	}
	if ref == f.ref {
		t.Fatalf("the second build has the first one's digest %s", ref)
	}
	for _, name := range nodeNames {
		if err := f.nodes[name].ImportImage(archive); err != nil {
			t.Fatal(err)
		}
	}
	// The attachment of the pod created mid-rollout, made beforehand: the
	// rollout replaces galactic-controller too.
	f.attachment(t, "web-2-net0", netip.MustParseAddr("10.20.0.7"))
	a, b := f.workloads[0], f.workloads[1]
	pa, err := a.netns.StartPinger(b.addr, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.netns.StartPinger(a.addr, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := f.subdir("overlay-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.WriteOverlay(overlay, ref, f.fabric); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Kubectl(ctx, "apply", "--server-side", "-k", overlay); err != nil {
		t.Fatal(err)
	}
	f.ref, f.overlay = ref, overlay

	// A pod created on a node while its galactic pod is being replaced.
	var mid string
	harness.Eventually(t, 5*time.Minute, "a galactic pod being replaced", func() error {
		pods, err := f.c.Kube.CoreV1().Pods(harness.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=galactic-node"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || (p.Spec.Containers[0].Image == ref && !podReady(&p)) {
				mid = p.Spec.NodeName
				return nil
			}
		}
		return fmt.Errorf("%d pods, none terminating or starting", len(pods.Items))
	})
	w := vpcPod("web-2", "web-2-net0")
	w.Labels, w.Spec.Affinity = nil, nil
	w.Spec.NodeSelector["kubernetes.io/hostname"] = mid
	if _, err := f.c.Kube.CoreV1().Pods(w.Namespace).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.c.WaitDaemonSetReady(ctx, len(nodeNames)); err != nil {
		t.Fatal(err)
	}
	f.requireImage(t, ctx, ref)
	if n := f.waitPodReady(t, ctx, w.Namespace, w.Name); n.Name != mid {
		t.Fatalf("web-2 runs on %s, want %s", n.Name, mid)
	}
	sa, sb := pa.Stop(), pb.Stop()
	t.Logf("during the rollout (web-2 created on %s): %s -> %s %+v; %s -> %s %+v", mid, a.name, b.name, sa, b.name, a.name, sb)
	for _, s := range []harness.PingerStats{sa, sb} {
		if s.Lost > 0 || s.Sent == 0 {
			t.Errorf("%d of %d replies lost during the rollout (longest outage %s)", s.Lost, s.Sent, s.LongestOutage)
		}
	}
}

// requireImage checks that the galactic pods are one per node, every
// container running ref.
func (f *fixture) requireImage(t *testing.T, ctx context.Context, ref string) {
	t.Helper()
	pods, err := f.c.Kube.CoreV1().Pods(harness.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=galactic-node"})
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		on = append(on, p.Spec.NodeName)
		for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			if ctr.Image != ref {
				t.Errorf("pod %s container %s runs %s, want %s", p.Name, ctr.Name, ctr.Image, ref)
			}
		}
	}
	slices.Sort(on)
	if !slices.Equal(on, nodeNames) {
		t.Fatalf("galactic pods on %v, want one on each of %v", on, nodeNames)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// TestUninstallAsDocumentedLeavesNothingOfGalacticOnAnyNode runs last: it
// removes galactic the way docs/install/installation.md says.
func TestUninstallAsDocumentedLeavesNothingOfGalacticOnAnyNode(t *testing.T) {
	f := requireInstalled(t)
	f.dumpOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// No workload uses the network any more; their DELs withdraw. Then
	// the tenants' VPCAttachments and VPCs go while galactic-controller
	// still runs to let them go.
	pods, err := f.c.Kube.CoreV1().Pods(tenantA).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		f.deletePod(t, ctx, p.Namespace, p.Name)
	}
	// As docs/operate/uninstall.md says.
	if _, err := f.c.Kubectl(ctx, "delete", "vpcattachments,vpcs", "--all", "--all-namespaces", "--wait", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Kubectl(ctx, "delete", "-k", f.overlay, "--wait"); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 3*time.Minute, "the galactic-system namespace gone", func() error {
		_, err := f.c.Kube.CoreV1().Namespaces().Get(ctx, harness.Namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	for _, name := range nodeNames {
		out, err := f.c.Kubectl(ctx, "debug", "node/"+name, "--image="+f.ref, "--profile=sysadmin", "--",
			"galactic-installer", "uninstall", "--root", "/host")
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(out), "debugging pod ")
		pod, _, _ := strings.Cut(rest, " ")
		harness.Eventually(t, 2*time.Minute, "the uninstall pod on "+name+" done", func() error {
			p, err := f.c.Kube.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("galactic-installer uninstall failed on %s: %+v", name, p.Status.ContainerStatuses)
			}
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
		f.deletePod(t, ctx, metav1.NamespaceDefault, pod)
	}
	for _, name := range nodeNames {
		n := f.nodes[name]
		for _, p := range []string{"/opt/cni/bin/galactic-cni", "/opt/cni/bin/galactic-bgp", "/etc/cni/net.d/10-galactic.conflist"} {
			if _, err := os.Lstat(n.HostPath(p)); err == nil {
				t.Errorf("%s: %s is left", name, p)
			}
		}
		// The kubelet made /etc/galactic for the hostPath
		// (DirectoryOrCreate); uninstall removes it once empty. No
		// attachment record may stay in the state dir, which uninstall
		// keeps by design with the lock, the GC's and the router's memory
		// and the log.
		if _, err := os.Lstat(n.HostPath("/etc/galactic")); err == nil {
			t.Errorf("%s: /etc/galactic is left", name)
		}
		if entries, err := os.ReadDir(n.HostPath("/var/lib/galactic/records")); len(entries) > 0 {
			t.Errorf("%s: /var/lib/galactic/records keeps %v (%v)", name, entries, err)
		}
		kept, _ := filepath.Glob(n.HostPath("/var/lib/galactic/*"))
		t.Logf("%s: the state dir keeps %v", name, kept)
		left, err := n.Leftovers()
		if err != nil {
			t.Fatal(err)
		}
		if out, err := n.Run("nft", "list", "table", "inet", "galactic"); err == nil {
			left = append(left, "nft table inet galactic:\n"+out)
		} else if !strings.Contains(out, "No such file or directory") {
			t.Errorf("%s: cannot tell whether the nftables table is gone: %v %s", name, err, out)
		}
		if len(left) > 0 {
			t.Errorf("%s keeps %v", name, left)
		}
	}
	leases, err := f.c.Kube.CoordinationV1().Leases(harness.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Items) > 0 {
		t.Errorf("%d galactic leases left", len(leases.Items))
	}
}
