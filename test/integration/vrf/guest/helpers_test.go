// Package guest holds the VRF scenarios that run inside the VM booted by
// test/integration/vrf: the host kernel has no VRF, the VM's Debian kernel
// does. Outside that VM (GALACTIC_VM_GUEST unset) the package runs nothing.
package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/state"
)

// EnvGuest is set to 1 by the VM's /init; CNI_PATH says where the plugins are.
const EnvGuest = "GALACTIC_VM_GUEST"

func TestMain(m *testing.M) {
	if os.Getenv(EnvGuest) != "1" {
		fmt.Println("skipping: these tests run inside the VM that test/integration/vrf boots (they need a kernel with VRF)")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// newNetns creates a network namespace with loopback up; t's cleanup
// removes it.
func newNetns(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		_ = testutils.UnmountNS(n)
	})
	err = n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// node is a network namespace with its own node settings, state dir and
// CNI config dir, routing for its workloads as a real node does.
type node struct {
	ns  ns.NetNS
	dir string
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{dir: t.TempDir()}
	n.ns = newNetns(t)
	settings := map[string]string{
		"nodeName": "vm-node",
		"stateDir": filepath.Join(n.dir, "state"),
		"logFile":  filepath.Join(n.dir, "galactic.log"),
	}
	writeJSON(t, filepath.Join(n.dir, "node.json"), settings)
	if err := os.Mkdir(filepath.Join(n.dir, "net.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(settings["logFile"])
			t.Logf("node log:\n%s", log)
		}
	})
	n.do(t, func() error {
		for _, k := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(k, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	return n
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// do runs f inside the node.
func (n *node) do(t *testing.T, f func() error) {
	t.Helper()
	if err := n.ns.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// stanza is a galactic-cni stanza with vrf routing and handoff off (no API
// server in the VM).
func stanza(vpc, attachment, mode string, addrs ...string) map[string]any {
	if addrs == nil {
		addrs = []string{}
	}
	return map[string]any{
		"type": "galactic-cni", "vpc": vpc, "attachment": attachment, "mode": mode,
		"routing": "vrf", "addresses": addrs, "mtu": 1400,
		"handoff": map[string]any{"enabled": false},
	}
}

// network writes a conflist called name with one stanza.
func (n *node) network(t *testing.T, name string, st map[string]any) {
	t.Helper()
	writeJSON(t, filepath.Join(n.dir, "net.d", name+".conflist"),
		map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": []any{st}})
}

// container is a container netns as cnitool sees it: its path.
type container interface{ Path() string }

// gone is the path of a container netns that no longer exists.
type gone string

func (g gone) Path() string { return string(g) }

// run runs the real cnitool inside the node for container c, with
// CNI_IFNAME eth0.
func (n *node) run(verb, network string, c container) (string, error) {
	var stdout, stderr bytes.Buffer
	err := n.ns.Do(func(ns.NetNS) error {
		cmd := exec.Command("cnitool", verb, network, c.Path())
		cmd.Env = append(os.Environ(),
			"NETCONFPATH="+filepath.Join(n.dir, "net.d"),
			"CNI_IFNAME=eth0",
			"GALACTIC_NODE_CONFIG="+filepath.Join(n.dir, "node.json"))
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	})
	if err != nil {
		return stdout.String(), fmt.Errorf("cnitool %s %s: %v: %s", verb, network, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// cnitool runs a verb that must succeed.
func (n *node) cnitool(t *testing.T, verb, network string, c container) string {
	t.Helper()
	out, err := n.run(verb, network, c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// link returns the node's link called name, nil when there is none.
func (n *node) link(t *testing.T, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	n.do(t, func() error {
		var err error
		l, err = netlink.LinkByName(name)
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			l, err = nil, nil
		}
		return err
	})
	return l
}

// vrf returns the VPC's VRF device, failing t when there is none.
func (n *node) vrf(t *testing.T, vpc string) *netlink.Vrf {
	t.Helper()
	l := n.link(t, routing.DeviceName(vpc))
	v, ok := l.(*netlink.Vrf)
	if !ok {
		t.Fatalf("VPC %s should have VRF device %s, found %v", vpc, routing.DeviceName(vpc), l)
	}
	return v
}

// hostLink returns an attachment's host interface, failing t when there is none.
func (n *node) hostLink(t *testing.T, mode, vpc, attachment string) netlink.Link {
	t.Helper()
	name := names.HostInterface(mode, vpc, attachment)
	l := n.link(t, name)
	if l == nil {
		t.Fatalf("host interface %s of %s/%s should exist", name, vpc, attachment)
	}
	return l
}

// tableRoutes lists every route of a table, both families.
func (n *node) tableRoutes(t *testing.T, table int) []netlink.Route {
	t.Helper()
	var routes []netlink.Route
	n.do(t, func() error {
		var err error
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		return err
	})
	return routes
}

// hasRoute reports whether routes has a route to dst of type typ (through
// link index dev when dev is not 0).
func hasRoute(routes []netlink.Route, dst string, typ, dev int) bool {
	want := netip.MustParsePrefix(dst)
	for _, r := range routes {
		if r.Dst == nil || r.Type != typ || (dev != 0 && r.LinkIndex != dev) {
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

// addrs lists a link's addresses as prefixes.
func (n *node) addrs(t *testing.T, l netlink.Link) []string {
	t.Helper()
	var out []string
	n.do(t, func() error {
		as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range as {
			out = append(out, a.IPNet.String())
		}
		return err
	})
	return out
}

// records are the node's galactic-cni records.
func (n *node) records(t *testing.T) []state.Record {
	t.Helper()
	recs, err := state.NewStore(filepath.Join(n.dir, "state")).List()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// record returns the record of an attachment, failing t when there is none.
func (n *node) record(t *testing.T, vpc, attachment string) state.Record {
	t.Helper()
	for _, r := range n.records(t) {
		if r.VPC == vpc && r.Attachment == attachment {
			return r
		}
	}
	t.Fatalf("no node record for %s/%s", vpc, attachment)
	return state.Record{}
}

// assertClean fails t when the node has any galactic host interface, VRF,
// galactic route, rule in galactic's table range, or record left.
func (n *node) assertClean(t *testing.T) {
	t.Helper()
	var left []string
	n.do(t, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if _, isVRF := l.(*netlink.Vrf); isVRF || strings.HasPrefix(l.Attrs().Alias, "galactic") {
				left = append(left, "link "+l.Attrs().Name)
			}
		}
		for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, err := netlink.RouteListFiltered(f, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if r.Protocol == routing.Protocol || r.Table >= routing.TableMin {
					left = append(left, fmt.Sprintf("route %s table %d", r.Dst, r.Table))
				}
			}
			rules, err := netlink.RuleList(f)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table >= routing.TableMin {
					left = append(left, fmt.Sprintf("rule %s", r))
				}
			}
		}
		return nil
	})
	for _, r := range n.records(t) {
		left = append(left, "record "+r.ContainerID+"/"+r.IfName)
	}
	if len(left) > 0 {
		t.Fatalf("the node should be clean, but has: %s", strings.Join(left, ", "))
	}
}

// localRulePrefs are the preferences of the node's plain `from all lookup
// local` rules, IPv4 first.
func (n *node) localRulePrefs(t *testing.T) []int {
	t.Helper()
	var prefs []int
	n.do(t, func() error {
		for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(f)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table == unix.RT_TABLE_LOCAL && r.Src == nil && r.Dst == nil && r.IifName == "" {
					prefs = append(prefs, r.Priority)
				}
			}
		}
		return nil
	})
	return prefs
}

// errUnreachable is an ICMP destination unreachable answering a ping.
var errUnreachable = errors.New("destination unreachable")

// ping sends ICMP echo requests from inside c to addr until one is
// answered; an ICMP destination unreachable for the request ends it with
// errUnreachable. The deadlines only bound a lost packet.
func ping(c ns.NetNS, addr netip.Addr) error {
	return c.Do(func(ns.NetNS) error {
		network, laddr, request, reply, unreach, inner := "ip4:icmp", "0.0.0.0", byte(8), byte(0), byte(3), 0
		if addr.Is6() {
			network, laddr, request, reply, unreach, inner = "ip6:ipv6-icmp", "::", 128, 129, 1, 40
		}
		conn, err := net.ListenPacket(network, laddr)
		if err != nil {
			return err
		}
		defer conn.Close()
		dst := &net.IPAddr{IP: addr.AsSlice()}
		id := uint16(os.Getpid())
		var last error
		for seq := uint16(1); seq <= 5; seq++ {
			msg := []byte{request, 0, 0, 0, 0, 0, 0, 0, 'g', 'a', 'l', 'a', 'c', 't', 'i', 'c'}
			binary.BigEndian.PutUint16(msg[4:], id)
			binary.BigEndian.PutUint16(msg[6:], seq)
			if addr.Is4() {
				// The kernel fills in the ICMPv6 checksum, not the ICMP one.
				binary.BigEndian.PutUint16(msg[2:], checksum(msg))
			}
			if _, err := conn.WriteTo(msg, dst); err != nil {
				return fmt.Errorf("ping %s: %w", addr, err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 1500)
			for {
				n, from, err := conn.ReadFrom(buf)
				if err != nil {
					last = err
					break
				}
				b := buf[:n]
				ours := func(echo []byte) bool {
					return len(echo) >= 8 && binary.BigEndian.Uint16(echo[4:]) == id && binary.BigEndian.Uint16(echo[6:]) == seq
				}
				if len(b) >= 8 && b[0] == reply && ours(b) {
					return nil
				}
				if len(b) >= 8 && b[0] == unreach {
					hdr := inner
					if addr.Is4() && len(b) > 8 {
						hdr = int(b[8]&0x0f) * 4
					}
					if len(b) >= 8+hdr+8 && ours(b[8+hdr:]) {
						return fmt.Errorf("ping %s: %w (code %d from %s)", addr, errUnreachable, b[1], from)
					}
				}
			}
		}
		return fmt.Errorf("ping %s: no answer: %w", addr, last)
	})
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = (sum & 0xffff) + sum>>16
	}
	return ^uint16(sum)
}
