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
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
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
// before VPCAttachments: the node chooses VPC, addresses and VNI. mode is
// veth unless it says tap (a VMM's).
type inline struct {
	vpc, name string
	vni       int
	address   string
	mode      string
}

func (a inline) network() string { return a.vpc + "-" + a.name }

func (a inline) prefix() netip.Prefix {
	p := netip.MustParsePrefix(a.address)
	return netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
}

func (a inline) modeOf() string {
	if a.mode == "" {
		return names.ModeVeth
	}
	return a.mode
}

func (a inline) hostIf() string { return names.HostInterface(a.modeOf(), a.vpc, a.name) }

func (a inline) conflist() map[string]any {
	return map[string]any{"cniVersion": "1.1.0", "name": a.network(), "plugins": []any{
		map[string]any{"type": "galactic-cni", "vpc": a.vpc, "attachment": a.name, "mode": a.modeOf(), "routing": "table",
			"addresses": []string{a.address}, "handoff": map[string]any{"enabled": true, "waitSeconds": 20, "leaseSeconds": 3600}},
		map[string]any{"type": "galactic-bgp", "vpc": a.vpc, "attachment": a.name, "vni": a.vni},
	}}
}

// objectConflist names the VPCAttachment ns/name, as a VMM's stanza does
// once its attachment is an object: nothing of its network.
func (a inline) objectConflist(ns string) map[string]any {
	return map[string]any{"cniVersion": "1.1.0", "name": a.network(), "plugins": []any{
		map[string]any{"type": "galactic-cni", "namespace": ns, "attachment": a.name, "mode": a.modeOf(), "routing": "table",
			"handoff": map[string]any{"enabled": true, "waitSeconds": 20, "leaseSeconds": 3600}},
		map[string]any{"type": "galactic-bgp", "namespace": ns, "attachment": a.name},
	}}
}

// workload is an inline attachment of the adoption scenario on its node,
// with the sandbox its runtime passed to ADD and, on a tap, the qemu
// guest; peer is the other node, whose route to it must not move.
type workload struct {
	inline
	node, peer *harness.Node
	c          *harness.Netns
	guest      *vm.Guest
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

// TestAdoptTurnsInlineAttachmentsIntoObjectsAndKeepsTheirLeasesInterfacesAndRoutes
// adopts, on two routed nodes, inline attachments the real plugins made:
// two containers and a qemu guest on a tap. Pings from node B's container
// to the workloads on node A run throughout and none is lost; every host
// interface keeps its ifindex, every lease its holder and token, every
// address stays, no route moves; then each workload's next ADD (an
// upgrade) names its VPCAttachment and gets it.
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
	works := []*workload{
		{inline: web, node: a, peer: b, c: addInline(t, env, a, web)},
		{inline: db, node: b, peer: a, c: addInline(t, env, b, db)},
	}
	if as, why := qemuGuests(t); as != nil {
		guest := inline{vpc: "green", name: "vm", vni: 10300, address: "10.40.0.7/16", mode: names.ModeTap}
		c, g := addGuest(t, env, a, guest, as)
		works = append(works, &workload{inline: guest, node: a, peer: b, c: c, guest: g})
	} else {
		t.Logf("adopting without a qemu guest: %s", why)
	}
	dbC := works[1].c
	for _, w := range works {
		waitObject(t, waitLimit, fmt.Sprintf("%s's route to %s", w.peer.Name, w.name), func() (*string, error) {
			r := routeOf(t, w.peer, "green", w.prefix())
			return &r, nil
		}, func(r *string) error {
			if *r == "none" {
				return errors.New("no route")
			}
			return nil
		})
	}

	// What must not change: every lease, host interface and peer route,
	// and the pings from db to the workloads on node A.
	leaseBefore := map[string]*coordinationv1.Lease{}
	ifBefore := map[string]int{}
	routeBefore := map[string]string{}
	for _, w := range works {
		l, err := f.kube.CoordinationV1().Leases(harness.Namespace).Get(ctx, names.Lease("green", w.name), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		leaseBefore[w.name] = l
		ifBefore[w.name] = ifindex(t, w.node, w.hostIf())
		routeBefore[w.name] = routeOf(t, w.peer, "green", w.prefix())
	}
	watches := map[*harness.Node]*harness.RouteWatch{}
	for _, n := range []*harness.Node{a, b} {
		w, err := n.WatchRoutes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		watches[n] = w
	}
	frrFrom := fab.LogOffset()
	pingers := map[string]*harness.Pinger{}
	for _, w := range works {
		if w.node == a {
			harness.Eventually(t, waitLimit, "db reaches "+w.name+" before adoption", func() error { return dbC.Ping(w.prefix().Addr()) })
			pingers[w.name] = harness.Ping(t, dbC, w.prefix().Addr())
		}
	}
	for _, p := range pingers {
		p.WaitReplies(t, 20)
	}

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
	atts := map[string]*v1alpha1.VPCAttachment{}
	for _, w := range works {
		att := f.waitAttachment(t, ns, w.name, readyAttachment)
		if got := fmt.Sprint(att.Spec.Addresses, att.Status.Addresses, att.Status.VNI, *att.Status.Dataplane); got != fmt.Sprintf("[%s] [%s] 10300 {green %s}", w.prefix().Addr(), w.address, w.name) {
			t.Errorf("VPCAttachment %s: spec.addresses, status.addresses, vni, dataplane = %s", w.name, got)
		}
		addr, err := f.api.VPCAddresses(ns).Get(ctx, names.VPCAddressName("green", w.prefix().Addr()), metav1.GetOptions{})
		if err != nil || addr.Spec.AttachmentUID != att.UID || addr.Spec.State != v1alpha1.AddressBound {
			t.Errorf("VPCAddress of %s: %+v, %v", w.name, addr, err)
		}
		for node, adv := range env.Advertisements(t, "green", w.name) {
			if adv.Labels[v1alpha1.LabelAttachmentUID] != string(att.UID) || adv.Labels[v1alpha1.LabelNamespace] != ns {
				t.Errorf("advertisement of %s on %s has labels %v, want the attachment's UID %s and namespace %s", w.name, node, adv.Labels, att.UID, ns)
			}
			for _, e := range adv.Spec.Containers {
				if e.AttachmentUID != string(att.UID) {
					t.Errorf("advertisement of %s on %s: entry %s has attachmentUID %q, want %s", w.name, node, e.ContainerID, e.AttachmentUID, att.UID)
				}
			}
		}
		before := leaseBefore[w.name]
		atts[w.name] = f.waitAttachment(t, ns, w.name, func(att *v1alpha1.VPCAttachment) error {
			if h := att.Status.Holder; h == nil || h.Node != w.node.Name || h.Generation != int64(*before.Spec.LeaseTransitions) {
				return fmt.Errorf("holder %+v, want %s at generation %d", att.Status.Holder, w.node.Name, *before.Spec.LeaseTransitions)
			}
			return condition(att.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue, "")
		})

		// The lease is the one the workload holds: same holder, same
		// token, now the attachment's.
		lease, err := f.kube.CoordinationV1().Leases(harness.Namespace).Get(ctx, names.Lease("green", w.name), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if lease.UID != before.UID || *lease.Spec.HolderIdentity != *before.Spec.HolderIdentity || *lease.Spec.LeaseTransitions != *before.Spec.LeaseTransitions ||
			lease.Labels[v1alpha1.LabelAttachmentUID] != string(att.UID) || lease.Labels[v1alpha1.LabelNamespace] != ns {
			t.Errorf("%s's lease after adoption: UID %s holder %s token %d labels %v; before: UID %s holder %s token %d", w.name,
				lease.UID, *lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions, lease.Labels, before.UID, *before.Spec.HolderIdentity, *before.Spec.LeaseTransitions)
		} else {
			t.Logf("%s: lease %s holder %s token %d before and after adoption, now labelled with UID %s", w.name, lease.Name, *lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions, att.UID)
		}
		if got := ifindex(t, w.node, w.hostIf()); got != ifBefore[w.name] {
			t.Errorf("%s's host interface %s has ifindex %d, was %d", w.name, w.hostIf(), got, ifBefore[w.name])
		} else {
			t.Logf("%s: host interface %s on %s has ifindex %d before and after adoption, address %s", w.name, w.hostIf(), w.node.Name, got, att.Status.Addresses[0])
		}
	}

	// Routing did not move: the peers' routes are the same, the kernels
	// saw no change of them, FRR no update of the prefixes, and the pings
	// went on. Both routers have passed over the labelled advertisements
	// (a pass that was under way when adopt wrote them may predate them:
	// two).
	harness.WaitPasses(t, 2, ra, rb)
	for _, w := range works {
		if got := routeOf(t, w.peer, "green", w.prefix()); got != routeBefore[w.name] {
			t.Errorf("%s's route to %s is %s, was %s", w.peer.Name, w.name, got, routeBefore[w.name])
		}
		if ch := watches[w.peer].ChangesOf(w.prefix()); len(ch) > 0 {
			t.Errorf("%s's route to %s changed during adoption: %v", w.peer.Name, w.name, ch)
		}
		if u, err := fab.CountUpdates(frrFrom, w.prefix()); err != nil || len(u.Announced)+len(u.Withdrawn) > 0 {
			t.Errorf("FRR saw updates of %s during adoption: %+v %v", w.prefix(), u, err)
		}
		if w.guest != nil && w.guest.Exited() {
			t.Errorf("qemu of %s exited during adoption: %s", w.name, w.guest.Stderr())
		}
	}
	for _, w := range works {
		p := pingers[w.name]
		if p == nil {
			continue
		}
		st := p.Stop()
		t.Logf("pings from db to %s throughout adoption: sent %d, received %d, lost %d, longest gap %s", w.name, st.Sent, st.Received, st.Lost, st.LongestGap)
		if st.Lost > 0 || st.Received == 0 {
			t.Errorf("pings from db to %s throughout adoption: %d of %d lost (longest outage %s)", w.name, st.Lost, st.Sent, st.LongestOutage)
		}
	}

	// Each workload is upgraded: its runtime stops it (a guest powers
	// off), the DEL of its inline ADD, then an ADD that names the
	// VPCAttachment. It gets the same host interface name and address,
	// the UID everywhere, and its node holds the lease again.
	for _, w := range works {
		att, before := atts[w.name], leaseBefore[w.name]
		if w.guest != nil {
			if err := w.guest.Poweroff(bootGuard); err != nil {
				t.Fatalf("powering %s off: %v\nconsole:\n%s", w.name, err, w.guest.Console())
			}
		}
		w.node.WriteConflist(t, w.conflist())
		if out, err := w.node.CNITool("del", w.network(), w.c, "net0"); err != nil {
			t.Fatalf("DEL of the adopted inline %s: %v %s", w.name, err, out)
		}
		// The runtime removes the sandbox; what the inline DEL left of it
		// in the adopted advertisement goes with the node GC's next pass.
		w.c.Delete()
		w.node.MustGC(t)
		w.c = harness.NewContainer(t)
		w.node.WriteConflist(t, w.objectConflist(ns))
		if out, err := w.node.CNITool("add", w.network(), w.c, "net0"); err != nil {
			t.Fatalf("ADD of %s by its VPCAttachment: %v %s", w.name, err, out)
		}
		if _, alias := linkOf(t, w.node, w.hostIf()); alias != names.AliasOf("green", w.name, string(att.UID)) {
			t.Errorf("%s's host interface %s has ifalias %q after the ADD by object, want %q", w.name, w.hostIf(), alias, names.AliasOf("green", w.name, string(att.UID)))
		}
		adv := env.Advertisements(t, "green", w.name)[w.node.Name]
		if len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != harness.ContainerID(w.c.Path) || adv.Spec.Containers[0].AttachmentUID != string(att.UID) {
			t.Errorf("%s's advertisement after the ADD by object: %+v", w.name, adv.Spec.Containers)
		}
		f.waitAttachment(t, ns, w.name, func(att *v1alpha1.VPCAttachment) error {
			if h := att.Status.Holder; h == nil || h.Node != w.node.Name || h.Generation <= int64(*before.Spec.LeaseTransitions) {
				return fmt.Errorf("holder %+v, want %s after generation %d", att.Status.Holder, w.node.Name, *before.Spec.LeaseTransitions)
			}
			return condition(att.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue, "")
		})
	}
	harness.Eventually(t, waitLimit, "db's new container reaches web's", func() error {
		return works[1].c.Ping(web.prefix().Addr())
	})

	// Again: nothing left to do, nothing written.
	generations := func(vpcVersion string) []string {
		out := []string{vpcVersion}
		for _, w := range works {
			att, _ := f.api.VPCAttachments(ns).Get(ctx, w.name, metav1.GetOptions{})
			out = append(out, att.Spec.VPC+"/"+att.Name+"@"+fmt.Sprint(att.Generation))
		}
		return out
	}
	before := generations(vpc.ResourceVersion)
	out, err = f.adopt(env, "--namespace", ns)
	if err != nil || strings.Contains(out, "created") || strings.Contains(out, "labelled with") {
		t.Errorf("a second adopt: %v\n%s", err, out)
	}
	vpc2, _ := f.api.VPCs(ns).Get(ctx, "green", metav1.GetOptions{})
	if after := generations(vpc2.ResourceVersion); !slices.Equal(before, after) {
		t.Errorf("a second adopt changed the objects: %v, then %v", before, after)
	}
}
