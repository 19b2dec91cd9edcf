package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

var (
	nodesEnv     *harness.Env
	nodesEnvErr  error
	nodesEnvOnce sync.Once
)

// nodes is an environment for harness nodes on the fixture's cluster:
// the real plugins and routers, under the nodes' own credentials.
func (f *fixture) nodes(t *testing.T) *harness.Env {
	t.Helper()
	nodesEnvOnce.Do(func() {
		nodesEnv, nodesEnvErr = harness.NewEnvOn(context.Background(), f.c.ControlPlane)
		if nodesEnvErr == nil {
			f.release = append(f.release, nodesEnv.Release)
		}
	})
	if nodesEnvErr != nil {
		t.Fatal(nodesEnvErr)
	}
	return nodesEnv
}

// inline is an attachment made by the plugins from a conflist stanza, as
// before VPCAttachments: the node chooses VPC, addresses and VNI.
type inline struct {
	vpc, name string
	vni       int
	address   string
}

func (a inline) network() string { return a.vpc + "-" + a.name }

func (a inline) prefix() netip.Prefix {
	p := netip.MustParsePrefix(a.address)
	return netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
}

func (a inline) conflist() map[string]any {
	return map[string]any{"cniVersion": "1.1.0", "name": a.network(), "plugins": []any{
		map[string]any{"type": "galactic-cni", "vpc": a.vpc, "attachment": a.name, "mode": "veth", "routing": "table",
			"addresses": []string{a.address}, "handoff": map[string]any{"enabled": true, "waitSeconds": 20, "leaseSeconds": 3600}},
		map[string]any{"type": "galactic-bgp", "vpc": a.vpc, "attachment": a.name, "vni": a.vni},
	}}
}

// objectConflist names the VPCAttachment ns/name, as a VMM's stanza does
// once its attachment is an object: nothing of its network.
func (a inline) objectConflist(ns string) map[string]any {
	return map[string]any{"cniVersion": "1.1.0", "name": a.network(), "plugins": []any{
		map[string]any{"type": "galactic-cni", "namespace": ns, "attachment": a.name, "mode": "veth", "routing": "table",
			"handoff": map[string]any{"enabled": true, "waitSeconds": 20, "leaseSeconds": 3600}},
		map[string]any{"type": "galactic-bgp", "namespace": ns, "attachment": a.name},
	}}
}

// linkOf is the index and ifalias of a link in a node.
func linkOf(t *testing.T, n *harness.Node, name string) (int, string) {
	t.Helper()
	var idx int
	var alias string
	if err := n.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			idx, alias = l.Attrs().Index, l.Attrs().Alias
		}
		return err
	}); err != nil {
		t.Fatalf("%s on %s: %v", name, n.Name, err)
	}
	return idx, alias
}

// routedNode is a harness node on the fabric running galactic-router.
func routedNode(t *testing.T, env *harness.Env, fab *harness.Fabric, name string) (*harness.Node, *harness.Router) {
	t.Helper()
	n := env.NewNode(t, name)
	ul := fab.Attach(t, n)
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		t.Fatalf("enabling forwarding: %v %s", err, out)
	}
	r := n.StartRouter(t, fab.FabricRouterConfig(ul), "--resync", "2s")
	return n, r
}

func addInline(t *testing.T, env *harness.Env, n *harness.Node, a inline) *harness.Netns {
	t.Helper()
	c := harness.NewContainer(t)
	n.WriteConflist(t, a.conflist())
	if out, err := n.CNITool("add", a.network(), c, "net0"); err != nil {
		t.Fatalf("ADD %s on %s: %v %s", a.name, n.Name, err, out)
	}
	env.ForgetAttachment(t, a.vpc, a.name)
	return c
}

func ifindex(t *testing.T, n *harness.Node, name string) int {
	t.Helper()
	idx, _ := linkOf(t, n, name)
	return idx
}

// routeOf describes node's kernel route for p in vpc's routing domain.
func routeOf(t *testing.T, n *harness.Node, vpc string, p netip.Prefix) string {
	t.Helper()
	r, err := n.KernelRoute(vpc, p)
	if err != nil {
		t.Fatal(err)
	}
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("via %v dev %d proto %d", r.Gw, r.LinkIndex, r.Protocol)
}

// adopt runs `galactic-controller adopt` as a cluster administrator.
func (f *fixture) adopt(env *harness.Env, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(env.BinDir, "galactic-controller"), append([]string{"adopt", "--kubeconfig", f.c.AdminKubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestAdoptTurnsInlineAttachmentsIntoObjectsAndKeepsTheirLeasesInterfacesAndRoutes(t *testing.T) {
	f := setup(t)
	harness.RequireFRR(t)
	env := f.nodes(t)
	ctx := context.Background()
	ns := f.tenant(t, "adopted")
	fab := harness.NewFabric(t)
	a, ra := routedNode(t, env, fab, "adopt-a")
	b, rb := routedNode(t, env, fab, "adopt-b")
	web := inline{vpc: "green", name: "web", vni: 10300, address: "10.40.0.5/16"}
	db := inline{vpc: "green", name: "db", vni: 10300, address: "10.40.0.9/16"}
	webC, dbC := addInline(t, env, a, web), addInline(t, env, b, db)
	waitObject(t, waitLimit, "node B's route to web", func() (*string, error) {
		r := routeOf(t, b, "green", web.prefix())
		return &r, nil
	}, func(r *string) error {
		if *r == "none" {
			return errors.New("no route")
		}
		return nil
	})
	if err := dbC.Ping(web.prefix().Addr()); err != nil {
		t.Fatalf("db does not reach web before adoption: %v", err)
	}

	// What must not change.
	leaseBefore, err := f.kube.CoordinationV1().Leases(harness.Namespace).Get(ctx, names.Lease("green", "web"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hostIf := names.HostInterface(names.ModeVeth, "green", "web")
	ifBefore := ifindex(t, a, hostIf)
	routeBefore := routeOf(t, b, "green", web.prefix())
	watch, err := b.WatchRoute(t.Context(), web.prefix())
	if err != nil {
		t.Fatal(err)
	}
	frrFrom := fab.LogOffset()

	// Bad input is refused, naming the key, and writes nothing.
	if out, err := f.adopt(env, "--namespace", ns, "--vpc-networks", "green=10.50.0.0/16"); err == nil ||
		!strings.Contains(out, "inline attachment green/db: address 10.40.0.9 (advertisement green.db.adopt-b) is outside VPC green's networks 10.50.0.0/16: add its network to --vpc-networks green") {
		t.Fatalf("adopt with the wrong networks: %v\n%s", err, out)
	}
	if l, _ := f.api.VPCs(ns).List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
		t.Fatalf("a refused adopt made %d VPCs", len(l.Items))
	}

	out, err := f.adopt(env, "--namespace", ns, "--vpc-networks", "green=10.40.0.0/16")
	if err != nil {
		t.Fatalf("adopt: %v\n%s", err, out)
	}
	t.Logf("adopt:\n%s", out)

	vpc, err := f.api.VPCs(ns).Get(ctx, "green", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := readyVPC(vpc); err != nil || vpc.Status.VNI != 10300 || vpc.Spec.VNI == nil || *vpc.Spec.VNI != 10300 || vpc.Status.DataplaneName != "green" {
		t.Errorf("VPC %s/green: %v, spec.vni %v, status %+v; want Ready with VNI 10300 and the data-plane name green", ns, err, vpc.Spec.VNI, vpc.Status)
	}
	for _, in := range []inline{web, db} {
		att := f.waitAttachment(t, ns, in.name, readyAttachment)
		if got := fmt.Sprint(att.Spec.Addresses, att.Status.Addresses, att.Status.VNI, *att.Status.Dataplane); got != fmt.Sprintf("[%s] [%s] 10300 {green %s}", in.prefix().Addr(), in.address, in.name) {
			t.Errorf("VPCAttachment %s: spec.addresses, status.addresses, vni, dataplane = %s", in.name, got)
		}
		addr, err := f.api.VPCAddresses(ns).Get(ctx, names.VPCAddressName("green", in.prefix().Addr()), metav1.GetOptions{})
		if err != nil || addr.Spec.AttachmentUID != att.UID || addr.Spec.State != v1alpha1.AddressBound {
			t.Errorf("VPCAddress of %s: %+v, %v", in.name, addr, err)
		}
		for node, adv := range env.Advertisements(t, "green", in.name) {
			if adv.Labels[v1alpha1.LabelAttachmentUID] != string(att.UID) || adv.Labels[v1alpha1.LabelNamespace] != ns {
				t.Errorf("advertisement of %s on %s has labels %v, want the attachment's UID %s and namespace %s", in.name, node, adv.Labels, att.UID, ns)
			}
			for _, e := range adv.Spec.Containers {
				if e.AttachmentUID != string(att.UID) {
					t.Errorf("advertisement of %s on %s: entry %s has attachmentUID %q, want %s", in.name, node, e.ContainerID, e.AttachmentUID, att.UID)
				}
			}
		}
	}
	webAtt := f.waitAttachment(t, ns, "web", func(att *v1alpha1.VPCAttachment) error {
		if h := att.Status.Holder; h == nil || h.Node != a.Name || h.Generation != int64(*leaseBefore.Spec.LeaseTransitions) {
			return fmt.Errorf("holder %+v, want %s at generation %d", att.Status.Holder, a.Name, *leaseBefore.Spec.LeaseTransitions)
		}
		return condition(att.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue, "")
	})

	// The lease is the one the workload holds: same holder, same token,
	// now the attachment's.
	lease, err := f.kube.CoordinationV1().Leases(harness.Namespace).Get(ctx, names.Lease("green", "web"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.UID != leaseBefore.UID || *lease.Spec.HolderIdentity != *leaseBefore.Spec.HolderIdentity || *lease.Spec.LeaseTransitions != *leaseBefore.Spec.LeaseTransitions ||
		lease.Labels[v1alpha1.LabelAttachmentUID] != string(webAtt.UID) || lease.Labels[v1alpha1.LabelNamespace] != ns {
		t.Errorf("lease after adoption: UID %s holder %s token %d labels %v; before: UID %s holder %s token %d",
			lease.UID, *lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions, lease.Labels, leaseBefore.UID, *leaseBefore.Spec.HolderIdentity, *leaseBefore.Spec.LeaseTransitions)
	}
	if got := ifindex(t, a, hostIf); got != ifBefore {
		t.Errorf("web's host interface %s has ifindex %d, was %d", hostIf, got, ifBefore)
	}

	// Routing did not move: node B's route is the same, the kernel saw no
	// change of it, FRR no update of the prefix, and traffic flows.
	// Both routers have passed over the labelled advertisements (a pass
	// that was under way when adopt wrote them may predate them: two).
	harness.WaitPasses(t, 2, ra, rb)
	if got := routeOf(t, b, "green", web.prefix()); got != routeBefore {
		t.Errorf("node B's route to web is %s, was %s", got, routeBefore)
	}
	if ch := watch.ChangesOf(web.prefix()); len(ch) > 0 {
		t.Errorf("node B's route to web changed during adoption: %v", ch)
	}
	if u, err := fab.CountUpdates(frrFrom, web.prefix()); err != nil || len(u.Announced)+len(u.Withdrawn) > 0 {
		t.Errorf("FRR saw updates of %s during adoption: %+v %v", web.prefix(), u, err)
	}
	if err := dbC.Ping(web.prefix().Addr()); err != nil {
		t.Errorf("db does not reach web after adoption: %v", err)
	}

	// The workload restarts: the DEL of its inline ADD, then an ADD that
	// names the VPCAttachment. It gets the same host interface name and
	// address, the UID everywhere, and the route comes back to node A.
	a.WriteConflist(t, web.conflist())
	if out, err := a.CNITool("del", web.network(), webC, "net0"); err != nil {
		t.Fatalf("DEL of the adopted inline web: %v %s", err, out)
	}
	// The runtime removes the sandbox; what the inline DEL left of it in
	// the adopted advertisement goes with the node GC's next pass.
	webC.Delete()
	a.MustGC(t)
	webC2 := harness.NewContainer(t)
	a.WriteConflist(t, web.objectConflist(ns))
	if out, err := a.CNITool("add", web.network(), webC2, "net0"); err != nil {
		t.Fatalf("ADD of web by its VPCAttachment: %v %s", err, out)
	}
	if _, alias := linkOf(t, a, hostIf); alias != names.AliasOf("green", "web", string(webAtt.UID)) {
		t.Errorf("web's host interface %s has ifalias %q after the ADD by object, want %q", hostIf, alias, names.AliasOf("green", "web", string(webAtt.UID)))
	}
	adv := env.Advertisements(t, "green", "web")[a.Name]
	if len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != harness.ContainerID(webC2.Path) || adv.Spec.Containers[0].AttachmentUID != string(webAtt.UID) {
		t.Errorf("web's advertisement after the ADD by object: %+v", adv.Spec.Containers)
	}
	f.waitAttachment(t, ns, "web", func(att *v1alpha1.VPCAttachment) error {
		if h := att.Status.Holder; h == nil || h.Node != a.Name || h.Generation <= int64(*leaseBefore.Spec.LeaseTransitions) {
			return fmt.Errorf("holder %+v, want %s after generation %d", att.Status.Holder, a.Name, *leaseBefore.Spec.LeaseTransitions)
		}
		return condition(att.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue, "")
	})
	harness.Eventually(t, waitLimit, "db reaches web's new container", func() error {
		return dbC.Ping(web.prefix().Addr())
	})

	// Again: nothing left to do, nothing written.
	before := []string{vpc.ResourceVersion}
	for _, n := range []string{"db", "web"} {
		att, _ := f.api.VPCAttachments(ns).Get(ctx, n, metav1.GetOptions{})
		before = append(before, att.Spec.VPC+"/"+att.Name+"@"+fmt.Sprint(att.Generation))
	}
	out, err = f.adopt(env, "--namespace", ns)
	if err != nil || strings.Contains(out, "created") || strings.Contains(out, "labelled with") {
		t.Errorf("a second adopt: %v\n%s", err, out)
	}
	vpc2, _ := f.api.VPCs(ns).Get(ctx, "green", metav1.GetOptions{})
	after := []string{vpc2.ResourceVersion}
	for _, n := range []string{"db", "web"} {
		att, _ := f.api.VPCAttachments(ns).Get(ctx, n, metav1.GetOptions{})
		after = append(after, att.Spec.VPC+"/"+att.Name+"@"+fmt.Sprint(att.Generation))
	}
	if !slices.Equal(before, after) {
		t.Errorf("a second adopt changed the objects: %v, then %v", before, after)
	}
}
