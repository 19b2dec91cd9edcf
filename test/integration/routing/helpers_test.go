package routing

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

const ifName = "net0"

// attachment is one VPC attachment a test runs.
type attachment struct {
	VPC, Name string
	VNI       int64
	Addresses []string
	Handoff   bool
	Announce  string
	// Mode is veth unless set.
	Mode string
}

func (a attachment) conflist() map[string]any {
	mode := a.Mode
	if mode == "" {
		mode = "veth"
	}
	cni := map[string]any{
		"type": "galactic-cni", "vpc": a.VPC, "attachment": a.Name, "mode": mode,
		"routing": "table", "addresses": a.Addresses,
		"handoff": map[string]any{"enabled": a.Handoff, "waitSeconds": 20, "leaseSeconds": 5},
	}
	bgp := map[string]any{"type": "galactic-bgp", "vpc": a.VPC, "attachment": a.Name}
	if a.VNI != 0 {
		bgp["vni"] = a.VNI
	}
	if a.Announce != "" {
		bgp["announce"] = a.Announce
	}
	return map[string]any{"cniVersion": "1.1.0", "name": a.Network(), "plugins": []any{cni, bgp}}
}

// Network is the conflist's name.
func (a attachment) Network() string { return a.VPC + "-" + a.Name }

// Prefixes are the attachment's host prefixes.
func (a attachment) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range a.Addresses {
		p := netip.MustParsePrefix(s)
		out = append(out, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	return out
}

// Addr is the attachment's first address of the family of v6.
func (a attachment) Addr(v6 bool) netip.Addr {
	for _, p := range a.Prefixes() {
		if p.Addr().Is6() == v6 {
			return p.Addr()
		}
	}
	panic("no such address")
}

// routed is a node on the fabric with galactic-router running.
type routed struct {
	*harness.Node
	Underlay netip.Addr
	Router   *harness.Router
}

func newRouted(t *testing.T, env *harness.Env, f *harness.Fabric, name string, mutate ...func(*harness.RouterConfig)) *routed {
	t.Helper()
	n := env.NewNode(t, name)
	ul := f.Attach(t, n)
	cfg := f.FabricRouterConfig(ul)
	for _, m := range mutate {
		m(&cfg)
	}
	// Nodes forward between their workloads and the fabric.
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("enabling forwarding: %v %s", err, out)
	}
	r := n.StartRouter(t, cfg, "--resync", "2s")
	return &routed{Node: n, Underlay: ul, Router: r}
}

// add runs the attachment's ADD for a new container on n and returns it.
func add(t *testing.T, n *harness.Node, a attachment) *harness.Netns {
	t.Helper()
	c := harness.NewContainer(t)
	addIn(t, n, a, c)
	return c
}

func addIn(t *testing.T, n *harness.Node, a attachment, c *harness.Netns) {
	t.Helper()
	n.WriteConflist(t, a.conflist())
	if out, err := n.CNITool("add", a.Network(), c, ifName); err != nil {
		t.Fatalf("ADD %s on %s: %v %s", a.Name, n.Name, err, out)
	}
}

func del(t *testing.T, n *harness.Node, a attachment, c *harness.Netns) {
	t.Helper()
	n.WriteConflist(t, a.conflist())
	if out, err := n.CNITool("del", a.Network(), c, ifName); err != nil {
		t.Fatalf("DEL %s on %s: %v %s", a.Name, n.Name, err, out)
	}
}

// eventually polls cond every 50 ms until it returns nil or limit passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// frrPaths are FRR's paths for prefix.
func frrPaths(t *testing.T, f *harness.Fabric, p netip.Prefix) []harness.EVPNPath {
	t.Helper()
	routes, err := f.EVPNRoutes()
	if err != nil {
		t.Fatal(err)
	}
	return routes[p]
}

// waitFRR waits until FRR holds exactly n paths for each prefix.
func waitFRR(t *testing.T, f *harness.Fabric, n int, prefixes ...netip.Prefix) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("FRR holds %d paths for %v", n, prefixes), func() error {
		routes, err := f.EVPNRoutes()
		if err != nil {
			return err
		}
		for _, p := range prefixes {
			if len(routes[p]) != n {
				raw, _ := f.Vtysh("show bgp l2vpn evpn route detail type prefix json")
				return fmt.Errorf("%s: %d paths %+v; FRR says %s", p, len(routes[p]), routes[p], raw)
			}
		}
		return nil
	})
}

func advertisement(t *testing.T, env *harness.Env, a attachment, node string) *v1alpha1.BGPAdvertisement {
	t.Helper()
	obj, err := env.API.BGPAdvertisements(harness.Namespace).Get(context.Background(), names.Advertisement(a.VPC, a.Name, node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// waitCondition waits until the advertisement's condition has status and reason.
func waitCondition(t *testing.T, env *harness.Env, a attachment, node, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("%s %s=%s (%s)", a.Name, typ, status, reason), func() error {
		obj := advertisement(t, env, a, node)
		if obj == nil {
			return fmt.Errorf("no advertisement")
		}
		c := meta.FindStatusCondition(obj.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("conditions %+v", obj.Status.Conditions)
		}
		return nil
	})
}

// kernelRoute returns node's route for p in the VPC's table, nil if none.
func kernelRoute(t *testing.T, n *harness.Node, vpc string, p netip.Prefix) *netlink.Route {
	t.Helper()
	r, err := n.KernelRoute(vpc, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// show runs a command in the node for a failure message.
func show(n *harness.Node, args ...string) string {
	out, _ := n.Run(args[0], args[1:]...)
	return strings.TrimSpace(out)
}

// routeMonitor records every kernel route change in a node.
type routeMonitor struct{ w *harness.RouteWatch }

func monitorRoutes(t *testing.T, n *harness.Node) *routeMonitor {
	t.Helper()
	w, err := n.WatchRoutes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return &routeMonitor{w}
}

// changes are the monitor's changes of p, one line each.
func (m *routeMonitor) changes(p netip.Prefix) []string {
	var out []string
	for _, c := range m.w.ChangesOf(p) {
		out = append(out, c.String())
	}
	return out
}

// clientOf adds blue's client workload (10.20.0.7) on c and waits until it
// reaches vm's IPv4 address.
func clientOf(t *testing.T, c *routed, vm attachment) *harness.Netns {
	t.Helper()
	wc := add(t, c.Node, attachment{VPC: "blue", Name: "client", VNI: 10100, Addresses: []string{"10.20.0.7/24"}})
	eventually(t, 20*time.Second, "the client reaches "+vm.Name, func() error { return wc.Ping(vm.Addr(false)) })
	return wc
}
