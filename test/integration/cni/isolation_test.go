package cni

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
)

// nodeAddrs are the node's own addresses outside every VPC; the test puts
// them on the node netns's loopback, so they exist nowhere else.
var nodeAddrs = []string{"192.0.2.1", "2001:db8::1"}

func addNodeAddrs(t *testing.T, node *harness.Node) {
	t.Helper()
	for _, a := range nodeAddrs {
		p := netip.PrefixFrom(netip.MustParseAddr(a), netip.MustParseAddr(a).BitLen())
		args := []string{"addr", "add", p.String(), "dev", "lo"}
		if p.Addr().Is6() {
			args = append([]string{"-6"}, append(args, "nodad")...)
		}
		if out, err := node.Run("ip", args...); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
}

// localRules are the node's `from all lookup local` rules, per family, as
// "family F pref P".
func localRules(t *testing.T, node *harness.Node) []string {
	t.Helper()
	var out []string
	in(t, node, func() error {
		for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(f)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table == unix.RT_TABLE_LOCAL && r.Src == nil && r.Dst == nil && r.IifName == "" {
					out = append(out, fmt.Sprintf("family %d pref %d", f, r.Priority))
				}
			}
		}
		return nil
	})
	return out
}

func TestATableWorkloadReachesItsGatewayButNeitherTheNodesOwnAddressesNorAnotherVPCsGateway(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	// Forwarding makes the node answer a refused packet with "destination
	// unreachable" instead of dropping it silently.
	if out, err := node.Run("sysctl", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	addNodeAddrs(t, node)
	if got := localRules(t, node); !slices.Equal(got, []string{fmt.Sprintf("family %d pref 0", netlink.FAMILY_V4), fmt.Sprintf("family %d pref 0", netlink.FAMILY_V6)}) {
		t.Fatalf("a fresh node should have the kernel's local rules at preference 0: %v", got)
	}

	blue1, blue2, red1 := harness.NewContainer(t), harness.NewContainer(t), harness.NewContainer(t)
	network(t, node, "blue-1", stanza("blue", "web-1", "veth", "10.20.0.5/24", "fd20::5/64"))
	network(t, node, "blue-2", stanza("blue", "web-2", "veth", "10.20.0.6/24", "fd20::6/64"))
	network(t, node, "red-1", stanza("red", "web-1", "veth", "10.30.0.5/24", "fd30::5/64"))
	cnitool(t, node, "add", "blue-1", blue1)
	cnitool(t, node, "add", "blue-2", blue2)
	cnitool(t, node, "add", "red-1", red1)

	moved := []string{fmt.Sprintf("family %d pref %d", netlink.FAMILY_V4, routing.LocalPriority), fmt.Sprintf("family %d pref %d", netlink.FAMILY_V6, routing.LocalPriority)}
	if got := localRules(t, node); !slices.Equal(got, moved) {
		t.Fatalf("the local rules should sit at preference %d, behind galactic's rules, and nowhere else: %v", routing.LocalPriority, got)
	}
	// Each gateway answers in its VPC's table through its own interface.
	blue := domain(t, node, "blue")
	routes := tableRoutes(t, node, blue.Table)
	for _, gw := range []string{"10.20.0.1/32", "fd20::1/128"} {
		if n := countRoutes(routes, gw, unix.RTN_LOCAL); n != 2 {
			t.Fatalf("table %d should have a local %s for each of blue's two host ends, has %d: %v", blue.Table, gw, n, routes)
		}
	}

	for _, c := range []struct {
		from *harness.Netns
		to   string
	}{{blue1, "10.20.0.1"}, {blue1, "fd20::1"}, {blue2, "10.20.0.1"}, {red1, "10.30.0.1"}, {red1, "fd30::1"}} {
		if err := c.from.Ping(netip.MustParseAddr(c.to)); err != nil {
			t.Fatalf("a workload should reach its own gateway %s: %v", c.to, err)
		}
	}
	for _, to := range append([]string{"10.30.0.1", "fd30::1"}, nodeAddrs...) {
		if err := blue1.Ping(netip.MustParseAddr(to)); err == nil || !strings.Contains(err.Error(), "destination unreachable") {
			t.Errorf("a workload of VPC blue must not reach %s, which is outside its VPC; want destination unreachable from blue's table, got %v", to, err)
		}
	}
	// The node still reaches its own addresses, and its workloads.
	for _, to := range append([]string{"10.20.0.5", "fd20::6", "10.30.0.5"}, nodeAddrs...) {
		if err := node.Ping(netip.MustParseAddr(to)); err != nil {
			t.Fatalf("the node should reach %s: %v", to, err)
		}
	}
	cnitool(t, node, "check", "blue-1", blue1)

	// One attachment's DEL leaves the gateway the other one shares.
	cnitool(t, node, "del", "blue-1", blue1)
	routes = tableRoutes(t, node, blue.Table)
	for _, gw := range []string{"10.20.0.1/32", "fd20::1/128"} {
		if n := countRoutes(routes, gw, unix.RTN_LOCAL); n != 1 {
			t.Fatalf("after blue-1's DEL table %d should keep one local %s, for blue-2, has %d: %v", blue.Table, gw, n, routes)
		}
	}
	for _, gw := range []string{"10.20.0.1", "fd20::1"} {
		if err := blue2.Ping(netip.MustParseAddr(gw)); err != nil {
			t.Fatalf("blue-2 should still reach the gateway it shared with blue-1: %v", err)
		}
	}
	cnitool(t, node, "check", "blue-2", blue2)

	cnitool(t, node, "del", "blue-2", blue2)
	cnitool(t, node, "del", "red-1", red1)
	assertClean(t, node)
	// The moved rule stays: putting it back in front would reopen the
	// node's addresses to the next workload.
	if got := localRules(t, node); !slices.Equal(got, moved) {
		t.Fatalf("the local rules should stay at preference %d after the last DEL: %v", routing.LocalPriority, got)
	}
	for _, to := range nodeAddrs {
		if err := node.Ping(netip.MustParseAddr(to)); err != nil {
			t.Fatalf("the node should reach its own %s after the last DEL: %v", to, err)
		}
	}
}

func TestCheckSaysWhenTheLocalRuleWasPutBackInFront(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	container := harness.NewContainer(t)
	network(t, node, "blue", stanza("blue", "web-0", "veth", "10.20.0.5/24"))
	cni := lib(node, "blue")
	if _, err := cni.Add(ctx, rt(container)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cni.Del(ctx, rt(container)) })
	if out, err := node.Run("ip", "rule", "add", "pref", "0", "lookup", "local"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	e := harness.CNIError(t, cni.Check(ctx, rt(container)))
	if !strings.Contains(e.Msg, "lookup local") || !strings.Contains(e.Msg, "workloads can reach the node's own addresses") {
		t.Fatalf("CHECK should say the local rule precedes galactic's rules, got %q", e.Msg)
	}
	// The next ADD moves it back.
	other := harness.NewContainer(t)
	network(t, node, "blue-2", stanza("blue", "web-2", "veth", "10.20.0.6/24"))
	if _, err := lib(node, "blue-2").Add(ctx, rt(other)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib(node, "blue-2").Del(ctx, rt(other)) })
	if err := cni.Check(ctx, rt(container)); err != nil {
		t.Fatalf("CHECK after the next ADD moved the rule again: %v", err)
	}
}

// countRoutes counts routes to dst of type typ.
func countRoutes(routes []netlink.Route, dst string, typ int) int {
	n := 0
	for _, r := range routes {
		if r.Dst != nil && r.Type == typ && r.Dst.String() == netip.MustParsePrefix(dst).String() {
			n++
		}
	}
	return n
}
