package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
)

// Attachment is one VPC attachment a test adds to nodes: its network
// config list is galactic-cni then, unless NoBGP, galactic-bgp. A test
// that needs the chain to differ between nodes (another wait, say) adds a
// modified copy.
type Attachment struct {
	VPC, Name string
	// Mode is veth (the default) or tap.
	Mode      string
	Addresses []string
	// Routing is table (the default: this kernel has no VRF) or vrf.
	Routing string
	// Handoff turns the handoff lease on; nil turns it off.
	Handoff *Handoff
	// Allowed is galactic-cni's allowedSourcePrefixes.
	Allowed []string
	// MTU is galactic-cni's mtu; 0 leaves it out.
	MTU int
	// PodAnnotations declares the pod-annotations capability, through
	// which a runtime passes network.galactic.dev/standby.
	PodAnnotations bool
	// VNI and Announce are galactic-bgp's vni and announce; zero values
	// leave them out.
	VNI      int64
	Announce string
	// NoBGP leaves galactic-bgp out of the chain.
	NoBGP bool
	// IfName is CNI_IFNAME (default net0).
	IfName string
	// Object, when set, is the VPCAttachment (named Name) that the stanzas
	// name by namespace and name instead of VPC, Addresses and VNI; the
	// node names the attachment by the object's data-plane names. VPC and
	// Addresses still name the conflist and the addresses tests expect.
	Object *v1alpha1.VPCAttachment
}

// DataplaneVPC is the VPC's name on a node: the object's data-plane name
// for an object-backed attachment, else VPC.
func (a Attachment) DataplaneVPC() string {
	if a.Object != nil {
		return a.Object.Status.Dataplane.VPC
	}
	return a.VPC
}

// DataplaneName is the attachment's name on a node.
func (a Attachment) DataplaneName() string {
	if a.Object != nil {
		return a.Object.Status.Dataplane.Attachment
	}
	return a.Name
}

// UID is the object's UID, empty for an inline attachment.
func (a Attachment) UID() string {
	if a.Object != nil {
		return string(a.Object.UID)
	}
	return ""
}

// Alias is the ifalias of the attachment's host interface.
func (a Attachment) Alias() string {
	return names.AliasOf(a.DataplaneVPC(), a.DataplaneName(), a.UID())
}

// Handoff is galactic-cni's handoff: how long an ADD waits for another
// holder to release the lease, and how long the lease lasts.
type Handoff struct {
	WaitSeconds, LeaseSeconds int
}

// Network is the name of the attachment's network config list.
func (a Attachment) Network() string { return a.VPC + "-" + a.Name }

// Interface is the container's interface name.
func (a Attachment) Interface() string {
	if a.IfName == "" {
		return "net0"
	}
	return a.IfName
}

func (a Attachment) mode() string {
	if a.Mode == "" {
		return names.ModeVeth
	}
	return a.Mode
}

// HostIf is the attachment's host interface on a node.
func (a Attachment) HostIf() string {
	return names.HostInterface(a.mode(), a.DataplaneVPC(), a.DataplaneName())
}

// LeaseName is the attachment's handoff lease.
func (a Attachment) LeaseName() string { return names.Lease(a.DataplaneVPC(), a.DataplaneName()) }

// Conflist is the attachment's network config list.
func (a Attachment) Conflist() map[string]any {
	routing := a.Routing
	if routing == "" {
		routing = "table"
	}
	cni := map[string]any{
		"type": "galactic-cni", "vpc": a.VPC, "attachment": a.Name, "mode": a.mode(),
		"routing": routing, "addresses": a.Addresses,
		// Handoff is on unless a config says otherwise.
		"handoff": map[string]any{"enabled": false},
	}
	if h := a.Handoff; h != nil {
		cni["handoff"] = map[string]any{"enabled": true, "waitSeconds": h.WaitSeconds, "leaseSeconds": h.LeaseSeconds}
	}
	if a.Allowed != nil {
		cni["allowedSourcePrefixes"] = a.Allowed
	}
	if a.MTU != 0 {
		cni["mtu"] = a.MTU
	}
	if a.PodAnnotations {
		cni["capabilities"] = map[string]bool{netconf.CapabilityPodAnnotations: true}
	}
	if a.Object != nil {
		// A VMM's stanza names its VPCAttachment, nothing of its network.
		delete(cni, "vpc")
		delete(cni, "addresses")
		cni["namespace"] = a.Object.Namespace
	}
	plugins := []any{cni}
	if !a.NoBGP {
		bgp := map[string]any{"type": "galactic-bgp", "vpc": a.VPC, "attachment": a.Name}
		if a.VNI != 0 {
			bgp["vni"] = a.VNI
		}
		if a.Announce != "" {
			bgp["announce"] = a.Announce
		}
		if a.Object != nil {
			bgp = map[string]any{"type": "galactic-bgp", "namespace": a.Object.Namespace, "attachment": a.Name}
		}
		plugins = append(plugins, bgp)
	}
	return map[string]any{"cniVersion": "1.1.0", "name": a.Network(), "plugins": plugins}
}

// Prefixes are the attachment's host prefixes (/32 and /128).
func (a Attachment) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range a.Addresses {
		p := netip.MustParsePrefix(s)
		out = append(out, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	return out
}

// Prefix is the attachment's first host prefix.
func (a Attachment) Prefix() netip.Prefix { return a.Prefixes()[0] }

// Addrs are the attachment's addresses.
func (a Attachment) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, p := range a.Prefixes() {
		out = append(out, p.Addr())
	}
	return out
}

// Addr is the attachment's first address of the family of v6.
func (a Attachment) Addr(v6 bool) netip.Addr {
	for _, p := range a.Prefixes() {
		if p.Addr().Is6() == v6 {
			return p.Addr()
		}
	}
	panic(fmt.Sprintf("attachment %s has no IPv6=%v address", a.Name, v6))
}

// Install writes the attachment's config list into the node's net.d.
func (n *Node) Install(t testing.TB, a Attachment) {
	t.Helper()
	n.WriteConflist(t, a.Conflist())
}

// Add installs the attachment and runs its ADD with cnitool for a new
// container, which it returns; t fails when the ADD does. extraEnv is
// added to cnitool's environment (CAP_ARGS, say).
func (n *Node) Add(t testing.TB, a Attachment, extraEnv ...string) *Netns {
	t.Helper()
	c := NewContainer(t)
	n.AddIn(t, a, c, extraEnv...)
	return c
}

// AddIn is Add for the container c.
func (n *Node) AddIn(t testing.TB, a Attachment, c *Netns, extraEnv ...string) {
	t.Helper()
	if out, err := n.TryAdd(t, a, c, extraEnv...); err != nil {
		t.Fatalf("ADD %s on %s: %v %s", a.Name, n.Name, err, out)
	}
}

// TryAdd installs the attachment and runs its ADD for c, returning
// cnitool's output and error; extraEnv is added to cnitool's environment.
func (n *Node) TryAdd(t testing.TB, a Attachment, c *Netns, extraEnv ...string) (string, error) {
	t.Helper()
	n.Install(t, a)
	return n.CNITool("add", a.Network(), c, a.Interface(), extraEnv...)
}

// Del installs the attachment and runs its DEL for c; t fails when the
// DEL does.
func (n *Node) Del(t testing.TB, a Attachment, c *Netns) {
	t.Helper()
	n.Install(t, a)
	if out, err := n.CNITool("del", a.Network(), c, a.Interface()); err != nil {
		t.Fatalf("DEL %s on %s: %v %s", a.Name, n.Name, err, out)
	}
}

// AddInBackground starts the attachment's ADD for c (installed first)
// and returns a channel that gets its error once it is done: for an ADD
// that waits for a handoff lease.
func (n *Node) AddInBackground(t testing.TB, a Attachment, c *Netns) <-chan error {
	t.Helper()
	n.Install(t, a)
	done := make(chan error, 1)
	go func() {
		out, err := n.CNITool("add", a.Network(), c, a.Interface())
		if err != nil {
			err = fmt.Errorf("ADD %s on %s: %w %s", a.Name, n.Name, err, out)
		}
		done <- err
	}()
	return done
}

// WaitingFor is the holder an ADD on the node is waiting on for lease
// name: while an ADD waits, galactic-cni keeps its observation of the
// held lease in the node's state dir (handoff's ObservationDir), and it
// removes it once it holds the lease. Empty when no ADD waits.
func (n *Node) WaitingFor(lease string) string {
	key := url.PathEscape(n.Settings.Namespace + "/" + lease)
	data, err := os.ReadFile(filepath.Join(n.Settings.StateDir, "handoff", key+".json"))
	if err != nil {
		return ""
	}
	var o struct {
		Holder string `json:"holder"`
	}
	if json.Unmarshal(data, &o) != nil {
		return ""
	}
	return o.Holder
}

// HolderOf is the handoff holder identity of container c on the node.
func (n *Node) HolderOf(c *Netns) string { return names.Holder(n.Name, ContainerID(c.Path)) }

// Advertisements returns every node's advertisement of vpc's attachment,
// by node.
func (e *Env) Advertisements(t testing.TB, vpc, attachment string) map[string]v1alpha1.BGPAdvertisement {
	t.Helper()
	list, err := e.API.BGPAdvertisements(Namespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, attachment)})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1alpha1.BGPAdvertisement{}
	for _, adv := range list.Items {
		out[adv.Spec.Node] = adv
	}
	return out
}

// ForgetAttachment deletes the attachment's lease and advertisements when
// t ends, since the package's tests share one API server.
func (e *Env) ForgetAttachment(t testing.TB, vpc, attachment string) {
	t.Cleanup(func() {
		ctx := context.Background()
		_ = e.API.Leases(Namespace).Delete(ctx, names.Lease(vpc, attachment), metav1.DeleteOptions{})
		_ = e.API.BGPAdvertisements(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, attachment)})
	})
}

// RuntimeAdd installs the attachment and runs its ADD for c in this
// process through libcni, as a container runtime does: the result comes
// typed. t fails when the ADD does; TryRuntimeAdd returns the error,
// which keeps its CNI code.
func (n *Node) RuntimeAdd(t testing.TB, a Attachment, c *Netns) *current.Result {
	t.Helper()
	res, err := n.TryRuntimeAdd(t, a, c)
	if err != nil {
		t.Fatalf("ADD of %s on %s: %v", a.Name, n.Name, err)
	}
	return res
}

// TryRuntimeAdd is RuntimeAdd returning the error.
func (n *Node) TryRuntimeAdd(t testing.TB, a Attachment, c *Netns) (*current.Result, error) {
	t.Helper()
	n.Install(t, a)
	res, err := LibCNI{Node: n, Network: a.Network()}.Add(context.Background(), RuntimeConf(c, a.Interface()))
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// RuntimeDel is RuntimeAdd's DEL (libcni keeps the ADD's result for it).
func (n *Node) RuntimeDel(t testing.TB, a Attachment, c *Netns) {
	t.Helper()
	n.Install(t, a)
	if err := (LibCNI{Node: n, Network: a.Network()}).Del(context.Background(), RuntimeConf(c, a.Interface())); err != nil {
		t.Fatalf("DEL of %s on %s: %v", a.Name, n.Name, err)
	}
}
