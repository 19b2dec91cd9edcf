// Package objects tests the data path of object-backed attachments: pods
// and VMMs name VPCAttachments, nodes take nothing else as truth, identity
// is the attachment's UID, and a pod may have several.
package objects

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

var ctx = context.Background()

// setup is the package's environment with galactic-controller running:
// it allocates the tests' VPCs and attachments.
func setup(t *testing.T) *harness.Env {
	t.Helper()
	env := harness.Setup(t)
	env.StartController(t)
	return env
}

// handoffConf is a handoff stanza that waits briefly.
var handoffConf = map[string]any{"enabled": true, "waitSeconds": 5, "leaseSeconds": 30}

// podNetwork writes the conflist a CRI runtime would use for every pod on
// node: veth, table routing, the pod annotations capability, and
// galactic-bgp after galactic-cni.
func podNetwork(t *testing.T, node *harness.Node, withHandoff bool) {
	t.Helper()
	caps := map[string]bool{netconf.CapabilityPodAnnotations: true}
	cni := map[string]any{"type": "galactic-cni", "mode": "veth", "routing": "table", "capabilities": caps, "handoff": map[string]any{"enabled": false}}
	if withHandoff {
		cni["handoff"] = handoffConf
	}
	node.WriteConflist(t, map[string]any{"cniVersion": "1.1.0", "name": "pods", "plugins": []any{
		cni, map[string]any{"type": "galactic-bgp", "capabilities": caps},
	}})
}

// pod is a pod sandbox as a CRI runtime runs it: a netns, an ID, a
// namespace and name, and annotations.
type pod struct {
	*harness.Netns
	ns, name    string
	annotations map[string]string
}

func newPod(t *testing.T, ns, name string, annotations map[string]string) *pod {
	return &pod{Netns: harness.NewContainer(t), ns: ns, name: name, annotations: annotations}
}

func (p *pod) id() string { return harness.ContainerID(p.Path) }

// rt is the pod's runtime config as containerd passes it: CNI_ARGS with
// the pod's namespace and name, its annotations as a capability argument.
func (p *pod) rt() *libcni.RuntimeConf {
	rt := harness.RuntimeConf(p.Netns, "eth0")
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.ns}, {"K8S_POD_NAME", p.name}, {"K8S_POD_INFRA_CONTAINER_ID", rt.ContainerID}}
	rt.CapabilityArgs = map[string]any{netconf.CapabilityPodAnnotations: p.annotations}
	return rt
}

func (p *pod) add(node *harness.Node) (*current.Result, error) {
	res, err := harness.LibCNI{Node: node, Network: "pods"}.Add(ctx, p.rt())
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (p *pod) mustAdd(t *testing.T, node *harness.Node) *current.Result {
	t.Helper()
	res, err := p.add(node)
	if err != nil {
		t.Fatalf("ADD of pod %s/%s on %s: %v", p.ns, p.name, node.Name, err)
	}
	return res
}

func (p *pod) del(t *testing.T, node *harness.Node) {
	t.Helper()
	if err := (harness.LibCNI{Node: node, Network: "pods"}).Del(ctx, p.rt()); err != nil {
		t.Fatalf("DEL of pod %s/%s on %s: %v", p.ns, p.name, node.Name, err)
	}
}

func (p *pod) check(t *testing.T, node *harness.Node) {
	t.Helper()
	if err := (harness.LibCNI{Node: node, Network: "pods"}).Check(ctx, p.rt()); err != nil {
		t.Fatalf("CHECK of pod %s/%s on %s: %v", p.ns, p.name, node.Name, err)
	}
}

// cniError returns the CNI error of err, failing t when it is not one.
func cniError(t *testing.T, err error) *types.Error {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CNI error, got %v", err)
	}
	return e
}

// dataplane is an attachment's data-plane names.
func dataplane(a *v1alpha1.VPCAttachment) (vpc, att string) {
	return a.Status.Dataplane.VPC, a.Status.Dataplane.Attachment
}

// leaseOf is the attachment's handoff lease, nil when there is none.
func leaseOf(t *testing.T, env *harness.Env, a *v1alpha1.VPCAttachment) *coordinationv1.Lease {
	t.Helper()
	l, err := env.API.Leases(harness.Namespace).Get(ctx, names.Lease(dataplane(a)), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// advertisementOf is the attachment's advertisement of node, nil when
// there is none.
func advertisementOf(t *testing.T, env *harness.Env, a *v1alpha1.VPCAttachment, node string) *v1alpha1.BGPAdvertisement {
	t.Helper()
	vpc, att := dataplane(a)
	obj, err := env.API.BGPAdvertisements(harness.Namespace).Get(ctx, names.Advertisement(vpc, att, node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// hostLink is the node's host interface of the attachment (veth), nil
// when there is none.
func hostLink(t *testing.T, node *harness.Node, a *v1alpha1.VPCAttachment) netlink.Link {
	t.Helper()
	vpc, att := dataplane(a)
	var l netlink.Link
	if err := node.Do(func() error {
		var err error
		l, err = netlink.LinkByName(names.HostInterface(names.ModeVeth, vpc, att))
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			l, err = nil, nil
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// records are the node's records.
func records(t *testing.T, node *harness.Node) []state.Record {
	t.Helper()
	recs, err := state.NewStore(node.Settings.StateDir).List()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// snapshot is a node's links, rules and routes as `ip` prints them, but
// the IPv6 link-local ones the kernel adds on its own time.
func snapshot(t *testing.T, node *harness.Node) string {
	t.Helper()
	var out strings.Builder
	for _, args := range [][]string{{"-o", "link"}, {"rule"}, {"-6", "rule"}, {"route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}} {
		s, err := node.Run("ip", args...)
		if err != nil {
			t.Fatalf("ip %v on %s: %v: %s", args, node.Name, err, s)
		}
		for _, line := range strings.SplitAfter(s, "\n") {
			if !strings.Contains(line, "fe80:") {
				out.WriteString(line)
			}
		}
	}
	return out.String()
}

// leaseRecord is a lease as pkg/handoff reads it.
func leaseRecord(l *coordinationv1.Lease) handoff.Record { return handoff.RecordFromLease(l) }

// addr is the first address of an attachment's status.
func addr(a *v1alpha1.VPCAttachment) netip.Addr {
	return netip.MustParsePrefix(string(a.Status.Addresses[0])).Addr()
}

// writeSettings writes node.Settings back to its node config file.
func writeSettings(t *testing.T, node *harness.Node) {
	t.Helper()
	data, err := json.MarshalIndent(node.Settings, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(node.ConfigPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// routed is a node on the fabric with galactic-router running.
type routed struct {
	*harness.Node
	Underlay netip.Addr
}

func newRouted(t *testing.T, env *harness.Env, f *harness.Fabric, name string) *routed {
	t.Helper()
	n := forwardingNode(t, env, name)
	ul := f.Attach(t, n)
	n.StartRouter(t, f.FabricRouterConfig(ul), "--resync", "2s")
	return &routed{Node: n, Underlay: ul}
}

// forwardingNode is a node that forwards between its workloads, as
// galactic's nodes must.
func forwardingNode(t *testing.T, env *harness.Env, name string) *harness.Node {
	t.Helper()
	n := env.NewNode(t, name)
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("enabling forwarding: %v %s", err, out)
	}
	return n
}
