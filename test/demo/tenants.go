package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// The tenants step: namespaces tenant-a and tenant-b each have a VPC named
// blue over blue's network, with attachments web and peer of the same
// names and addresses in both. tenant-a's web is on node-a and its peer
// on node-b, tenant-b's the other way round, so each of those nodes holds
// 10.20.0.5 of one tenant and 10.20.0.6 of the other.
var (
	tenantNames    = []string{"tenant-a", "tenant-b"}
	tenantNetwork  = v1alpha1.CIDR("10.20.0.0/24")
	webAddr        = netip.MustParseAddr("10.20.0.5")
	peerAddr       = netip.MustParseAddr("10.20.0.6")
	tenantPings    = 5
	tenantsMarker  = []byte("galactic") // the payload of the harness's pings
	tenantsPlacing = map[string]map[string]string{
		"tenant-a": {"web": "node-a", "peer": "node-b"},
		"tenant-b": {"web": "node-b", "peer": "node-a"},
	}
)

// Tenants is what the tenants step observed.
type Tenants struct {
	// Objects are the four attachments' identities as the nodes and the
	// API hold them.
	Objects []TenantObject
	// Pings are the pings sent from each workload to the address its own
	// tenant's other workload holds (as does the other tenant's workload
	// on the sender's node), counted at both receivers.
	Pings []TenantPing
}

// TenantObject is one attachment: its VPC's VNI, its data-plane names,
// the lease and the advertisement that carry its UID.
type TenantObject struct {
	Name, Node                        string // tenant/attachment, where it runs
	VNI                               int32
	DataplaneVPC, DataplaneAttachment string
	HostInterface                     string
	Lease, Advertisement              string
}

// TenantPing is one sender's pings: how many it sent, how many its own
// tenant's receiver got, how many the other tenant's workload of the same
// address got.
type TenantPing struct {
	From             string
	To               netip.Addr
	Sent, Own, Other int
}

func (t Tenants) summary() string {
	var sent, own, other int
	for _, p := range t.Pings {
		sent, own, other = sent+p.Sent, own+p.Own, other+p.Other
	}
	vnis, leases, advs := map[int32]bool{}, map[string]bool{}, map[string]bool{}
	for _, o := range t.Objects {
		vnis[o.VNI], leases[o.Lease], advs[o.Advertisement] = true, true, true
	}
	return fmt.Sprintf("%d pings across nodes: %d at their tenant's receivers, %d at the other tenant's of the same address; %d attachments, %d VNIs, %d leases, %d advertisements",
		sent, own, other, len(t.Objects), len(vnis), len(leases), len(advs))
}

// tenantWorkload is one tenant's attachment and its workload.
type tenantWorkload struct {
	tenant, name, node string
	obj                *v1alpha1.VPCAttachment
	att                harness.Attachment
	netns              *harness.Netns
	capture            *harness.Capture
}

func (w *tenantWorkload) String() string { return w.tenant + "/" + w.name }

// tenants runs the two tenants' workloads through galactic-controller's
// objects: each pair pings across nodes, neither reaches the other
// tenant's, and no name the nodes or the API use is shared between them.
func (d *demo) tenants() error {
	d.say("== two tenants: namespaces tenant-a and tenant-b, each with a VPC blue over %s, attachments web (%s) and peer (%s)", tenantNetwork, webAddr, peerAddr)
	if _, err := d.env.EnsureController(); err != nil {
		return err
	}
	d.say("galactic-controller runs and leads: it allocates VNIs, data-plane names and addresses")
	tns := map[string]*harness.Tenant{}
	var ws []*tenantWorkload
	for _, ns := range tenantNames {
		tn, err := d.env.CreateTenant(d.ctx, ns, "blue", tenantNetwork)
		if err != nil {
			return err
		}
		tns[ns] = tn
		d.undo = append(d.undo, func() { forgetTenant(tn, ws) })
		d.say("%s: VPC blue Ready: VNI %d, data-plane name %s", ns, tn.VPC.Status.VNI, tn.VPC.Status.DataplaneName)
		for _, c := range []struct {
			name string
			addr netip.Addr
		}{{"web", webAddr}, {"peer", peerAddr}} {
			obj, err := tn.CreateAttachment(d.ctx, c.name, "", c.addr.String())
			if err != nil {
				return err
			}
			w := &tenantWorkload{tenant: ns, name: c.name, node: tenantsPlacing[ns][c.name], obj: obj}
			w.att = harness.Attachment{VPC: "blue", Name: c.name, Addresses: []string{string(obj.Status.Addresses[0])},
				Handoff: withHandoff, MTU: mtu, Object: obj}
			ws = append(ws, w)
			d.say("%s: VPCAttachment %s Ready: %s, VNI %d, data plane %s/%s", ns, c.name, obj.Status.Addresses[0], obj.Status.VNI,
				obj.Status.Dataplane.VPC, obj.Status.Dataplane.Attachment)
		}
	}
	data, _ := json.Marshal(ws[0].att.Conflist())
	d.say("each node gets the conflists of its workloads; their stanzas name the object by namespace and name, e.g. %s's:", ws[0])
	d.show(string(data))
	for _, w := range ws {
		if err := d.nodes[w.node].WriteConflistFile(w.att.Conflist()); err != nil {
			return err
		}
		c, err := d.add(w.node, w.att)
		if err != nil {
			return err
		}
		w.netns = c
		if w.capture, err = c.Capture(tenantsMarker); err != nil {
			return err
		}
		d.undo = append(d.undo, w.capture.Close)
	}

	for _, ns := range tenantNames {
		web, peer := find(ws, ns, "web"), find(ws, ns, "peer")
		if err := d.until(routeLimit, ns+"'s peer on "+peer.node+" reaching its web on "+web.node, func() error { return peer.netns.Ping(webAddr) }); err != nil {
			return err
		}
		if err := d.until(routeLimit, ns+"'s web on "+web.node+" reaching its peer on "+peer.node, func() error { return web.netns.Ping(peerAddr) }); err != nil {
			return err
		}
		d.say("%s: peer on %s and web on %s ping each other across the fabric", ns, peer.node, web.node)
	}
	if err := d.tenantRoutes(ws); err != nil {
		return err
	}

	// Each sender's destination is held on its own node by the other
	// tenant's workload: the pings must cross the fabric to their own.
	rep := &d.report.Tenants
	for _, c := range []struct{ from, to, other *tenantWorkload }{
		{find(ws, "tenant-a", "peer"), find(ws, "tenant-a", "web"), find(ws, "tenant-b", "web")},
		{find(ws, "tenant-b", "peer"), find(ws, "tenant-b", "web"), find(ws, "tenant-a", "web")},
		{find(ws, "tenant-a", "web"), find(ws, "tenant-a", "peer"), find(ws, "tenant-b", "peer")},
		{find(ws, "tenant-b", "web"), find(ws, "tenant-b", "peer"), find(ws, "tenant-a", "peer")},
	} {
		addr := c.to.att.Addr(false)
		ownBefore, otherBefore := c.to.capture.Received(0, ifName), c.other.capture.Received(0, ifName)
		for range tenantPings {
			if err := c.from.netns.Ping(addr); err != nil {
				return fmt.Errorf("%s on %s pinging %s: %w", c.from, c.from.node, addr, err)
			}
		}
		p := TenantPing{From: c.from.String(), To: addr, Sent: tenantPings,
			Own: c.to.capture.Received(0, ifName) - ownBefore, Other: c.other.capture.Received(0, ifName) - otherBefore}
		rep.Pings = append(rep.Pings, p)
		d.say("%s on %s pings %s %d times: %s on %s received %d, %s on %s (same address, other tenant, sender's node) received %d",
			c.from, c.from.node, addr, p.Sent, c.to, c.to.node, p.Own, c.other, c.other.node, p.Other)
	}

	for _, w := range ws {
		o, err := d.tenantObject(w)
		if err != nil {
			return err
		}
		rep.Objects = append(rep.Objects, o)
		d.say("%s on %s: VNI %d, host interface %s, lease %s, advertisement %s", o.Name, o.Node, o.VNI, o.HostInterface, o.Lease, o.Advertisement)
	}
	errs := checkTenants(*rep)

	// The workloads go, then their objects: the controller lets each go
	// once nothing uses it.
	for _, w := range ws {
		w.capture.Close()
		if _, err := d.cnitool(w.node, "del", w.att, w.netns); err != nil {
			return err
		}
		w.netns.Delete()
	}
	for _, ns := range tenantNames {
		if err := tns[ns].Delete(d.ctx, find(ws, ns, "web").obj, find(ws, ns, "peer").obj); err != nil {
			return err
		}
	}
	d.say("the workloads deleted (DEL), then their VPCAttachments and VPCs: galactic-controller let them go")
	if err := d.until(10*time.Second, "nothing of the tenants left on the nodes", func() error {
		for _, name := range []string{"node-a", "node-b"} {
			if l, err := d.leftovers(name); err != nil || len(l) > 0 {
				return fmt.Errorf("%s: %q %v", name, l, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	d.say("no galactic device or rule left on any node")
	return errors.Join(errs...)
}

// tenantRoutes waits until FRR holds each tenant's web and peer prefixes
// under the tenant's own route target, from the node it runs on, and
// shows them.
func (d *demo) tenantRoutes(ws []*tenantWorkload) error {
	var lines []string
	err := d.until(routeLimit, "FRR holding each tenant's routes under its own route target", func() error {
		routes, err := d.fabric.EVPNRoutes()
		if err != nil {
			return err
		}
		lines = nil
		for _, w := range ws {
			p := w.att.Prefix()
			paths := vpcPaths(routes[p], int(w.obj.Status.VNI))
			if len(paths) != 1 || d.nodeName(paths[0].NextHop) != w.node {
				return fmt.Errorf("%s %s: paths %+v", w, p, paths)
			}
			lines = append(lines, fmt.Sprintf("%s %s: route target %d:%d, next hop %s (%s)", w, p, harness.FabricASN, w.obj.Status.VNI, paths[0].NextHop, w.node))
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.say("FRR holds both tenants' 10.20.0.5/32 and 10.20.0.6/32, each under its tenant's route target:")
	d.show(strings.Join(lines, "\n"))
	return nil
}

// tenantObject reads the lease and the advertisement of w's attachment
// and checks that they carry its UID.
func (d *demo) tenantObject(w *tenantWorkload) (TenantObject, error) {
	dp := w.obj.Status.Dataplane
	o := TenantObject{Name: w.String(), Node: w.node, VNI: w.obj.Status.VNI, DataplaneVPC: dp.VPC, DataplaneAttachment: dp.Attachment,
		HostInterface: w.att.HostIf()}
	uid := string(w.obj.UID)
	l, err := d.env.API.Leases(harness.Namespace).Get(d.ctx, w.att.LeaseName(), metav1.GetOptions{})
	if err != nil {
		return o, fmt.Errorf("%s's lease: %w", w, err)
	}
	if l.Labels[v1alpha1.LabelAttachmentUID] != uid || l.Labels[v1alpha1.LabelNamespace] != w.tenant {
		return o, fmt.Errorf("expected %s's lease %s labelled with its UID %s and namespace, got %v", w, l.Name, uid, l.Labels)
	}
	o.Lease = l.Name
	adv, err := d.env.API.BGPAdvertisements(harness.Namespace).Get(d.ctx, names.Advertisement(dp.VPC, dp.Attachment, w.node), metav1.GetOptions{})
	if err != nil {
		return o, fmt.Errorf("%s's advertisement: %w", w, err)
	}
	if adv.Labels[v1alpha1.LabelAttachmentUID] != uid || adv.Spec.VNI != w.obj.Status.VNI {
		return o, fmt.Errorf("expected %s's advertisement %s labelled with its UID %s and VNI %d, got %v and %d", w, adv.Name, uid, w.obj.Status.VNI, adv.Labels, adv.Spec.VNI)
	}
	o.Advertisement = adv.Name
	return o, nil
}

// checkTenants is what the step expects of what it observed: every ping
// at its own tenant's receiver and none at the other's, the two tenants'
// VNIs and VPC data-plane names different, and no two attachments
// sharing a data-plane name, host interface, lease or advertisement.
func checkTenants(t Tenants) []error {
	var errs []error
	for _, p := range t.Pings {
		errs = append(errs,
			expect(p.Own >= p.Sent, "%s's %d pings of %s all at its tenant's receiver, got %d", p.From, p.Sent, p.To, p.Own),
			expect(p.Other == 0, "none of %s's pings of %s at the other tenant's workload, got %d", p.From, p.To, p.Other))
	}
	vpcs := map[string]map[string]bool{} // tenant -> VNIs and VPC data-plane names
	seen := map[string]string{}
	for _, o := range t.Objects {
		tenant := strings.SplitN(o.Name, "/", 2)[0]
		if vpcs[tenant] == nil {
			vpcs[tenant] = map[string]bool{}
		}
		vpcs[tenant][fmt.Sprint(o.VNI)], vpcs[tenant][o.DataplaneVPC] = true, true
		for _, n := range []string{o.DataplaneVPC + "/" + o.DataplaneAttachment, o.HostInterface, o.Lease, o.Advertisement} {
			if prev, ok := seen[n]; ok {
				errs = append(errs, fmt.Errorf("expected %s and %s to share no name, both have %s", prev, o.Name, n))
			}
			seen[n] = o.Name
		}
	}
	for k := range vpcs["tenant-a"] {
		errs = append(errs, expect(!vpcs["tenant-b"][k], "tenant-a's and tenant-b's VPC blue not to share VNI or data-plane name %s", k))
	}
	return append(errs, expect(len(t.Objects) == 4 && len(t.Pings) == 4, "4 attachments and 4 senders, got %d and %d", len(t.Objects), len(t.Pings)))
}

func find(ws []*tenantWorkload, tenant, name string) *tenantWorkload {
	for _, w := range ws {
		if w.tenant == tenant && w.name == name {
			return w
		}
	}
	panic("no workload " + tenant + "/" + name)
}

// forgetTenant deletes what a failed step left of a tenant in the API
// (these objects only, not successors of their names); the nodes' own
// teardown removes the rest.
func forgetTenant(tn *harness.Tenant, ws []*tenantWorkload) {
	ctx := context.Background()
	for _, w := range ws {
		if w.tenant == tn.Namespace {
			uid := w.obj.UID
			_ = tn.Env.API.VPCAttachments(tn.Namespace).Delete(ctx, w.obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}
	}
	uid := tn.VPC.UID
	_ = tn.Env.API.VPCs(tn.Namespace).Delete(ctx, tn.VPC.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}
