package cni

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// stanza is a galactic-cni stanza with table routing and handoff off.
func stanza(vpc, attachment, mode string, addrs ...string) map[string]any {
	if addrs == nil {
		addrs = []string{}
	}
	return map[string]any{
		"type": "galactic-cni", "vpc": vpc, "attachment": attachment, "mode": mode,
		"routing": "table", "addresses": addrs, "mtu": 1400,
		"handoff": map[string]any{"enabled": false},
	}
}

// network writes a conflist called name with one galactic-cni stanza.
func network(t *testing.T, node *harness.Node, name string, st map[string]any) {
	t.Helper()
	node.WriteConflist(t, map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": []any{st}})
}

func cnitool(t *testing.T, node *harness.Node, verb, net string, c *harness.Netns) string {
	t.Helper()
	out, err := node.CNITool(verb, net, c, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// in runs f inside the node.
func in(t *testing.T, node *harness.Node, f func() error) {
	t.Helper()
	if err := node.Do(f); err != nil {
		t.Fatal(err)
	}
}

// hostLink returns the node's link called name, nil when there is none.
func hostLink(t *testing.T, node *harness.Node, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	in(t, node, func() error {
		var err error
		l, err = netlink.LinkByName(name)
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			l, err = nil, nil
		}
		return err
	})
	return l
}

// domain returns the VPC's routing domain on the node, nil when there is none.
func domain(t *testing.T, node *harness.Node, vpc string) *routing.Domain {
	t.Helper()
	var d *routing.Domain
	in(t, node, func() error {
		var err error
		d, err = routing.Find(vpc)
		return err
	})
	return d
}

// galacticRules are the node's rules galactic installed, as "iif X lookup N"
// or "to A lookup N"; the moved `lookup local` rule, which stays for good,
// is not among them.
func galacticRules(t *testing.T, node *harness.Node) []string {
	t.Helper()
	var out []string
	in(t, node, func() error {
		for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(f)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Protocol != routing.Protocol || r.Table == unix.RT_TABLE_LOCAL {
					continue
				}
				if r.IifName != "" {
					out = append(out, fmt.Sprintf("family %d iif %s lookup %d", f, r.IifName, r.Table))
				} else {
					out = append(out, fmt.Sprintf("to %s lookup %d", r.Dst, r.Table))
				}
			}
		}
		return nil
	})
	return out
}

// tableRoutes are the routes of a table on the node.
func tableRoutes(t *testing.T, node *harness.Node, table int) []netlink.Route {
	t.Helper()
	var routes []netlink.Route
	in(t, node, func() error {
		var err error
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		return err
	})
	return routes
}

// assertClean fails t when the node has any galactic host interface, VRF,
// rule, route or record left.
func assertClean(t *testing.T, node *harness.Node) {
	t.Helper()
	var left []string
	in(t, node, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			n := l.Attrs().Name
			if names.IsHostInterface(names.ModeTap, n) || names.IsHostInterface(names.ModeVeth, n) || strings.HasPrefix(l.Attrs().Alias, "galactic") {
				left = append(left, "link "+n)
			}
		}
		for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, err := netlink.RouteListFiltered(f, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if r.Protocol == routing.Protocol {
					left = append(left, fmt.Sprintf("route %s table %d", r.Dst, r.Table))
				}
			}
		}
		return nil
	})
	left = append(left, galacticRules(t, node)...)
	for _, r := range node.Records(t) {
		left = append(left, "record "+r.ContainerID+"/"+r.IfName)
	}
	if len(left) > 0 {
		t.Fatalf("the node should be clean, but has: %s", strings.Join(left, ", "))
	}
}

// hasRoute reports whether routes has a route to dst (of the given type).
func hasRoute(routes []netlink.Route, dst string, typ int) bool {
	want := netip.MustParsePrefix(dst)
	for _, r := range routes {
		if r.Dst == nil || r.Type != typ {
			continue
		}
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		bits, _ := r.Dst.Mask.Size()
		if netip.PrefixFrom(a.Unmap(), bits) == want {
			return true
		}
	}
	return false
}

func lib(node *harness.Node, net string) harness.LibCNI {
	return harness.LibCNI{Node: node, Network: net}
}

func rt(c *harness.Netns) *libcni.RuntimeConf { return harness.RuntimeConf(c, "eth0") }

var ctx = context.Background()

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }

// forgetInRuntimeCache drops libcni's cached result of an attachment, as a
// runtime that lost track of it would; libcni's GC then leaves it to the
// plugins' GC instead of running DEL for it.
func forgetInRuntimeCache(t *testing.T, node *harness.Node, network string, c *harness.Netns) {
	t.Helper()
	p := filepath.Join(node.Dir, "cni-cache", "results", network+"-"+harness.ContainerID(c.Path)+"-eth0")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}
