package migration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
)

func TestMain(m *testing.M) { harness.Main(m) }

const (
	vpc    = "blue"
	vni    = 10100
	ifName = "net0"
	// hangGuard bounds waits for something that must happen; it is never
	// a speed limit.
	hangGuard = 30 * time.Second
	// waitSeconds is the attachment's handoff.waitSeconds: how long a
	// promote waits on a source that did not release.
	waitSeconds = 3
)

// routed is a node on the fabric with galactic-router running.
type routed struct {
	*harness.Node
	Underlay netip.Addr
}

func newRouted(t *testing.T, env *harness.Env, f *harness.Fabric, name string) *routed {
	t.Helper()
	n := env.NewNode(t, name)
	ul := f.Attach(t, n)
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("enabling forwarding: %v %s", err, out)
	}
	n.StartRouter(t, f.FabricRouterConfig(ul), "--resync", "2s")
	return &routed{Node: n, Underlay: ul}
}

// cluster is three routed nodes: the VM moves between a and b, c is the
// client's node.
type cluster struct {
	env     *harness.Env
	f       *harness.Fabric
	a, b, c *routed
}

func newCluster(t *testing.T) *cluster {
	env := harness.Setup(t)
	harness.RequireFRR(t)
	f := harness.NewFabric(t)
	return &cluster{env: env, f: f, a: newRouted(t, env, f, "node-a"), b: newRouted(t, env, f, "node-b"), c: newRouted(t, env, f, "node-c")}
}

// attachment is the migrating VM's attachment, or the client's.
type attachment struct {
	name    string
	address string
	mode    string
	// announce is galactic-bgp's; empty is always.
	announce string
	// object is the VPCAttachment of an object-backed attachment: the
	// stanzas name it, and the node names it by its data-plane names.
	object *v1alpha1.VPCAttachment
}

// domain is the attachment's VPC on the node: its routing domain.
func (a attachment) domain() string {
	if a.object != nil {
		return a.object.Status.Dataplane.VPC
	}
	return vpc
}

// nodeName is the attachment's name on the node.
func (a attachment) nodeName() string {
	if a.object != nil {
		return a.object.Status.Dataplane.Attachment
	}
	return a.name
}

func (a attachment) uid() string {
	if a.object != nil {
		return string(a.object.UID)
	}
	return ""
}

// vm is the migrating attachment of one test; its lease and
// advertisements go when the test ends (the API server is the package's).
func (cl *cluster) vm(t *testing.T, name string) attachment {
	t.Helper()
	cl.env.ForgetAttachment(t, vpc, name)
	return attachment{name: name, address: "10.20.0.5/24", mode: "veth"}
}

func (a attachment) network() string { return a.domain() + "-" + a.name }

func (a attachment) addr() netip.Addr { return netip.MustParsePrefix(a.address).Addr() }

func (a attachment) prefix() netip.Prefix { return netip.PrefixFrom(a.addr(), 32) }

func (a attachment) lease() string { return names.Lease(a.domain(), a.nodeName()) }

// install writes the attachment's chain on n: galactic-cni with handoff
// and the pod annotations capability (a migration target's runtime passes
// network.galactic.dev/standby), then galactic-bgp.
func (a attachment) install(t *testing.T, n *harness.Node) {
	t.Helper()
	cni := map[string]any{"type": "galactic-cni", "vpc": vpc, "attachment": a.name, "mode": a.mode, "routing": "table",
		"addresses":    []string{a.address},
		"handoff":      map[string]any{"enabled": true, "waitSeconds": waitSeconds, "leaseSeconds": 60},
		"capabilities": map[string]bool{netconf.CapabilityPodAnnotations: true}}
	if a.object != nil {
		// A VMM's stanza names its VPCAttachment, nothing of its network.
		delete(cni, "vpc")
		delete(cni, "addresses")
		cni["namespace"] = a.object.Namespace
	}
	n.WriteConflist(t, map[string]any{"cniVersion": "1.1.0", "name": a.network(), "plugins": []any{cni, a.bgpStanza()}})
}

func (a attachment) bgpStanza() map[string]any {
	if a.object != nil {
		return map[string]any{"type": "galactic-bgp", "namespace": a.object.Namespace, "attachment": a.name}
	}
	bgp := map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": a.name, "vni": vni}
	if a.announce != "" {
		bgp["announce"] = a.announce
	}
	return bgp
}

func (a attachment) add(t *testing.T, n *harness.Node, extraEnv ...string) *harness.Netns {
	t.Helper()
	c := harness.NewContainer(t)
	a.install(t, n)
	if out, err := n.CNITool("add", a.network(), c, ifName, extraEnv...); err != nil {
		t.Fatalf("ADD %s on %s: %v %s", a.name, n.Name, err, out)
	}
	return c
}

func (a attachment) del(t *testing.T, n *harness.Node, c *harness.Netns) {
	t.Helper()
	if out, err := n.CNITool("del", a.network(), c, ifName); err != nil {
		t.Fatalf("DEL %s on %s: %v %s", a.name, n.Name, err, out)
	}
}

// migration is the driver's migration of vm from one side to the other,
// with no VMM: a veth workload on each side stands in for the guest.
func (cl *cluster) migration(t *testing.T, vm attachment, from, to *routed, src *harness.Netns) *migration.Migration {
	t.Helper()
	vm.install(t, to.Node)
	return &migration.Migration{
		VPC: vpc, Attachment: vm.name, Network: vm.network(), IfName: ifName,
		Source: migration.Side{Node: from.Node, Container: src},
		Target: migration.Side{Node: to.Node, Container: harness.NewContainer(t)},
	}
}

// client adds the client workload on c and waits until it reaches vm.
func (cl *cluster) client(t *testing.T, vm attachment) *harness.Netns {
	t.Helper()
	cl.env.ForgetAttachment(t, vpc, "client")
	wc := attachment{name: "client", address: "10.20.0.7/24", mode: "veth"}.add(t, cl.c.Node)
	eventually(t, "the client reaches "+vm.name, func() error { return wc.Ping(vm.addr()) })
	return wc
}

// eventually polls cond every 50 ms until it returns nil or hangGuard passes.
// watchRoute watches n's kernel route for p for the rest of the test.
func watchRoute(t *testing.T, n *routed, p netip.Prefix) *harness.RouteWatch {
	t.Helper()
	w, err := n.WatchRoute(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// watchLease records every version of vm's lease for the rest of the test.
func (cl *cluster) watchLease(t *testing.T, vm attachment) *harness.LeaseWatch {
	t.Helper()
	w, err := cl.env.WatchLease(t.Context(), vm.lease())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// startPinger pings vm from c every 10 ms; the caller stops it.
func startPinger(t *testing.T, c *harness.Netns, vm attachment) *harness.Pinger {
	t.Helper()
	p, err := c.StartPinger(vm.addr(), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, hangGuard, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// routeVia waits until n's route for p goes via the underlay address via.
func routeVia(t *testing.T, n *routed, p netip.Prefix, via netip.Addr) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s routes %s via %s", n.Name, p, via), func() error {
		r, err := n.KernelRoute(vpc, p)
		if err != nil {
			return err
		}
		if r == nil || r.Gw.String() != via.String() {
			return fmt.Errorf("route %+v", r)
		}
		return nil
	})
}

// hostRoute is n's route for p straight to a local interface (galactic-cni's
// host route), nil when there is none.
func hostRoute(t *testing.T, n *routed, p netip.Prefix) *netlink.Route {
	t.Helper()
	r, err := n.KernelRoute(vpc, p)
	if err != nil {
		t.Fatal(err)
	}
	if r == nil || r.Protocol != routing.Protocol {
		return nil
	}
	return r
}

// advertisement is n's advertisement of vm, nil when there is none.
func (cl *cluster) advertisement(t *testing.T, vm attachment, n *routed) *v1alpha1.BGPAdvertisement {
	t.Helper()
	obj, err := cl.env.API.BGPAdvertisements(harness.Namespace).Get(context.Background(), names.Advertisement(vm.domain(), vm.nodeName(), n.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// records are the node's galactic-cni records of vm.
func records(t *testing.T, n *routed, vm attachment) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(n.Settings.StateDir, "records", "*", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), `"attachment":"`+vm.nodeName()+`"`) {
			out = append(out, f)
		}
	}
	return out
}

// hostInterfaces are the node's interfaces with vm's ifalias.
func hostInterfaces(t *testing.T, n *routed, vm attachment) []string {
	t.Helper()
	var out []string
	err := n.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().Alias == names.AliasOf(vm.domain(), vm.nodeName(), vm.uid()) {
				out = append(out, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func holder(n *routed, c *harness.Netns) string {
	return names.Holder(n.Name, harness.ContainerID(c.Path))
}

func metavListOptions(selector string) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: selector}
}
