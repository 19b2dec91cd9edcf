package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/test/harness"
)

// Rows of the cluster pod start table.
const (
	ClusterReference = "reference: tap + static IPAM"
	ClusterGalactic  = "galactic DaemonSet, VPCAttachment, handoff on"
)

// ClusterResult is one row of pod start through the whole cluster: the
// API, the scheduler, the kubelet, containerd and the node's conflist.
type ClusterResult struct {
	Name string
	// Ready is from the Pod's creation to its Ready condition as the API
	// shows it; FirstPing to the first answer from a pod on another node.
	Ready, FirstPing Sample
}

// ClusterBench is the cluster section: its rows and how long the cluster
// took to come up.
type ClusterBench struct {
	Rows []*ClusterResult
	// Bringup is from nothing (binaries cached) to the DaemonSet ready:
	// control plane, fabric, `make image`, the nodes, `kubectl apply -k`.
	Bringup time.Duration
	Skipped string
}

// clusterPodStart runs the harness cluster (two galactic nodes and one
// node with the reference conflist) and times pods, one at a time.
func (b *bench) clusterPodStart() error {
	res := &ClusterBench{}
	b.res.Cluster = res
	if _, err := os.Stat(harness.FRRBgpd); err != nil {
		res.Skipped = "needs FRR's bgpd"
		return nil
	}
	start := time.Now()
	c, err := harness.StartCluster(b.ctx, b.out)
	if err != nil {
		return err
	}
	b.undo = append(b.undo, c.Close)
	fabric, err := harness.CreateClusterFabric()
	if err != nil {
		return err
	}
	b.undo = append(b.undo, fabric.Close)
	dir := filepath.Join(b.dir, "cluster")
	archive, ref, err := harness.MakeImage(filepath.Join(dir, "image"))
	if err != nil {
		return err
	}
	nodes := map[string]*harness.ClusterNode{}
	for _, name := range []string{"node-a", "node-b", "node-ref"} {
		if nodes[name], err = c.AddNode(b.ctx, fabric, archive, name); err != nil {
			return err
		}
	}
	if err := b.referenceNode(c, nodes["node-ref"]); err != nil {
		return err
	}
	overlay := filepath.Join(dir, "overlay")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		return err
	}
	if err := harness.WriteOverlay(overlay, ref, fabric); err != nil {
		return err
	}
	if _, err := c.Kubectl(b.ctx, "apply", "--server-side", "-k", overlay); err != nil {
		return err
	}
	if err := c.WaitDaemonSetReady(b.ctx, 2); err != nil {
		return err
	}
	if err := c.WaitControllerReady(b.ctx, 2); err != nil {
		return err
	}
	res.Bringup = time.Since(start)
	b.say("cluster: up in %s (control plane, fabric, make image, three nodes, DaemonSet and controller ready)", res.Bringup.Round(time.Second))
	// The shipped DaemonSet attaches only VPCAttachments: every galactic
	// pod names one of the tenant's, which the controller Deployment
	// allocated before the pod is created.
	view, err := c.Env()
	if err != nil {
		return err
	}
	t, err := b.tenant(view.API, c.Kube, clusterTenant, "bench", "10.20.0.0/24")
	if err != nil {
		return err
	}

	// The peer every galactic pod pings is a resident pod on node-b; one
	// on node-a keeps the VPC's routing there, as on a node that runs
	// workloads.
	for _, r := range []struct{ pod, node, addr string }{{"resident-b", "node-b", "10.20.0.6"}, {"resident-a", "node-a", "10.20.0.7"}} {
		if _, err := t.attach(b.ctx, "bench-"+r.pod, r.addr); err != nil {
			return err
		}
		if _, _, err := b.startPod(c, clusterPod(r.pod, r.node, "bench-"+r.pod)); err != nil {
			return err
		}
	}
	gal, refRow := &ClusterResult{Name: ClusterGalactic}, &ClusterResult{Name: ClusterReference}
	res.Rows = []*ClusterResult{refRow, gal}
	total := b.opts.CRIWarmup + b.opts.CRIIterations
	for i := range total {
		// A new attachment and address each time: node-b learns each
		// route afresh, through the fabric.
		att := fmt.Sprintf("bench-%d", i)
		if _, err := t.attach(b.ctx, att, fmt.Sprintf("10.20.0.%d", 10+i)); err != nil {
			return err
		}
		p := clusterPod(att, "node-a", att)
		relistPhase(i)
		ready, netns, err := b.startPod(c, p)
		if err != nil {
			return err
		}
		created := time.Now().Add(-ready)
		if err := netns.PingUntil(netip.MustParseAddr("10.20.0.6"), 5*time.Millisecond, time.Now().Add(time.Minute)); err != nil {
			return fmt.Errorf("%s: first ping: %w", p.Name, err)
		}
		ping := time.Since(created)
		if err := b.deletePod(c, p.Namespace, p.Name); err != nil {
			return err
		}
		if err := t.detach(b.ctx, att); err != nil {
			return err
		}
		r := clusterPod(fmt.Sprintf("ref-%d", i), "node-ref", "")
		relistPhase(i)
		refReady, _, err := b.startPod(c, r)
		if err != nil {
			return err
		}
		if err := b.deletePod(c, r.Namespace, r.Name); err != nil {
			return err
		}
		if i >= b.opts.CRIWarmup {
			gal.Ready, gal.FirstPing = append(gal.Ready, ready), append(gal.FirstPing, ping)
			refRow.Ready = append(refRow.Ready, refReady)
		}
	}
	b.say("cluster: pod Ready p50 galactic %s, reference %s; first ping across nodes p50 %s", ms(gal.Ready.P50()), ms(refRow.Ready.P50()), ms(gal.FirstPing.P50()))
	return nil
}

// referenceNode makes n a plain node with the reference conflist: no
// dedicated label or taint (so no galactic pod), the upstream plugins and
// the tap + static conflist in its /opt/cni/bin and /etc/cni/net.d.
func (b *bench) referenceNode(c *harness.Cluster, n *harness.ClusterNode) error {
	node, err := c.Kube.CoreV1().Nodes().Get(b.ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	delete(node.Labels, harness.VPCNodeLabel)
	node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == harness.VPCNodeLabel })
	if _, err := c.Kube.CoreV1().Nodes().Update(b.ctx, node, metav1.UpdateOptions{}); err != nil {
		return err
	}
	conf, _ := json.Marshal(referenceConf("reference"))
	src := filepath.Join(b.dir, "10-reference.conflist")
	if err := os.WriteFile(src, conf, 0o644); err != nil {
		return err
	}
	args := []string{"-c", fmt.Sprintf("mkdir -p /opt/cni/bin /etc/cni/net.d && cp %s %s %s /opt/cni/bin/ && cp %s /etc/cni/net.d/",
		filepath.Join(b.env.BinDir, "tap"), filepath.Join(b.env.BinDir, "static"), filepath.Join(b.env.BinDir, "loopback"), src)}
	_, err = n.Exec("sh", args...)
	return err
}

// clusterTenant is the namespace of the galactic pods and their
// VPCAttachments.
const clusterTenant = "bench-tenant"

// clusterPod is a pod pinned to node; with an attachment it is a VPC
// workload of the tenant naming that VPCAttachment.
func clusterPod(name, node, attachment string) *corev1.Pod {
	p := harness.VPCPod(name, attachment)
	if attachment == "" {
		p.Annotations, p.Spec.Tolerations = nil, nil
	} else {
		p.Namespace = clusterTenant
	}
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	return p
}

// kubeletRelist is the period at which a kubelet relists its containers
// (the generic PLEG): a started container counts towards Ready at the
// next relist, so a pod's time to Ready depends on when in that period it
// was created.
const kubeletRelist = time.Second

// relistPhase waits until the wall clock's position within kubeletRelist
// is round i's: the golden-ratio sequence spreads any number of rounds
// evenly over the period. Each row's pods then meet their kubelet's
// relist at every point of its period alike, where the loop's own rhythm
// (each pod is created right after the other node's kubelet reported a
// deletion) would hold one row at one point.
func relistPhase(i int) {
	const golden = 0.6180339887498949
	want := time.Duration(math.Mod(float64(i)*golden, 1) * float64(kubeletRelist))
	now := time.Duration(time.Now().UnixNano()) % kubeletRelist
	time.Sleep((want - now + kubeletRelist) % kubeletRelist)
}

// startPod creates p, polls until it is Ready and returns the time that
// took and, for a VPC workload, its network namespace.
func (b *bench) startPod(c *harness.Cluster, p *corev1.Pod) (time.Duration, *harness.Netns, error) {
	start := time.Now()
	if _, err := c.Kube.CoreV1().Pods(p.Namespace).Create(b.ctx, p, metav1.CreateOptions{}); err != nil {
		return 0, nil, err
	}
	deadline := start.Add(3 * time.Minute)
	for {
		got, err := c.Kube.CoreV1().Pods(p.Namespace).Get(b.ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return 0, nil, err
		}
		if slices.ContainsFunc(got.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			took := time.Since(start)
			if p.Annotations == nil {
				return took, nil, nil
			}
			for _, n := range c.Nodes() {
				if n.Name == got.Spec.NodeName {
					netns, err := n.PodNetns(p.Namespace, p.Name)
					return took, netns, err
				}
			}
			return took, nil, fmt.Errorf("pod %s is on %q, not a cluster node", p.Name, got.Spec.NodeName)
		}
		if time.Now().After(deadline) {
			return 0, nil, fmt.Errorf("pod %s not Ready within 3 minutes: %+v", p.Name, got.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bench) deletePod(c *harness.Cluster, namespace, name string) error {
	pods := c.Kube.CoreV1().Pods(namespace)
	if err := pods.Delete(b.ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := pods.Get(b.ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s not gone within 2 minutes", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func renderCluster(w *strings.Builder, r *Results) {
	cb := r.Cluster
	if cb == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "cluster-pod-start")
	p("")
	if cb.Skipped != "" {
		p("Not measured: %s.", cb.Skipped)
		p("")
		return
	}
	p("The harness cluster ([the test harness](contributing/test-harness.md)): kube-apiserver, kube-controller-manager, kube-scheduler, and per node a containerd and a registered kubelet in the node's own network and mount namespaces. Two nodes run the galactic DaemonSet applied with `kubectl apply -k`; a third has no galactic and the reference conflist (`tap` + `static`) in its `/etc/cni/net.d`. A Pod pinned to a node is created through the API and polled every 20 ms until Ready; a galactic pod (handoff on, as the DaemonSet ships; it names a VPCAttachment of its namespace, which the controller Deployment made Ready before the pod's creation; a new attachment and address each time, so the other node learns its route through the fabric) then pings a resident pod on the other galactic node every 5 ms until the first answer; another resident pod keeps the VPC on the pod's node. One pod at a time, alternating, %d times each after %d warm-up rounds; each pod is created at its round's point of the second (a golden-ratio sequence), since a kubelet counts a started container towards Ready at its next relist, once a second, and the rounds then meet every point of that period alike for both rows. The cluster came up in %s (control plane, fabric, `make image`, three nodes, DaemonSet and controller ready; binaries cached).", r.Options.CRIIterations, r.Options.CRIWarmup, cb.Bringup.Round(time.Second))
	p("")
	p("| conflist | create → Ready p50 | p90 | p50 / ref | create → first ping across nodes p50 | p90 |")
	p("|---|---|---|---|---|---|")
	var ref *ClusterResult
	for _, row := range cb.Rows {
		if row.Name == ClusterReference && len(row.Ready) > 0 {
			ref = row
		}
	}
	for _, row := range cb.Rows {
		ra := Ratio(row.Ready.P50(), 0)
		if ref != nil {
			ra = Ratio(row.Ready.P50(), ref.Ready.P50())
		}
		ping50, ping90 := "n/a", "n/a"
		if len(row.FirstPing) > 0 {
			ping50, ping90 = ms(row.FirstPing.P50()), ms(row.FirstPing.P90())
		}
		p("| %s | %s | %s | %s | %s | %s |", row.Name, ms(row.Ready.P50()), ms(row.Ready.P90()), ratio(ra), ping50, ping90)
	}
	p("")
}
