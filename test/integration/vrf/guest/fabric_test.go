package guest

import (
	"fmt"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/dataplane"
)

// vtep joins two nodes by a veth pair as their underlay and returns the
// planes galactic-router would program on each.
func vtep(t *testing.T, a, b *node) (dataplane.Plane, dataplane.Plane) {
	t.Helper()
	peer := fmt.Sprintf("ulp%d", len(t.Name())%1000)
	a.do(t, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: peer}); err != nil {
			return err
		}
		p, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(p, int(b.ns.Fd()))
	})
	b.do(t, func() error {
		p, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		return netlink.LinkSetName(p, "ul0")
	})
	for i, n := range []*node{a, b} {
		addr := fmt.Sprintf("192.0.2.%d/24", 11+i)
		n.do(t, func() error {
			l, err := netlink.LinkByName("ul0")
			if err != nil {
				return err
			}
			ip, _ := netlink.ParseAddr(addr)
			if err := netlink.AddrAdd(l, ip); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
	}
	return dataplane.Plane{Underlay: netip.MustParseAddr("192.0.2.11"), Node: "node-1"},
		dataplane.Plane{Underlay: netip.MustParseAddr("192.0.2.12"), Node: "node-2"}
}

// program does on n what galactic-router does after learning remotes: the
// VPC's VXLAN device in its VRF and the remote routes.
func program(t *testing.T, n *node, p dataplane.Plane, vpc string, vni uint32, remotes ...dataplane.Remote) *dataplane.Device {
	t.Helper()
	var dev *dataplane.Device
	n.do(t, func() error {
		d, err := routing.Find(vpc)
		if err != nil || d == nil {
			return fmt.Errorf("domain of %s: %v", vpc, err)
		}
		if dev, err = p.EnsureDevice(vpc, vni, d); err != nil {
			return err
		}
		if _, err = p.Sync(dev, d, remotes); err != nil {
			return err
		}
		// The router accepts VXLAN only from the next hops it installed.
		var vteps []netip.Addr
		for _, r := range remotes {
			vteps = append(vteps, r.NextHop)
		}
		_, err = filter.New().SetVTEPs(vteps)
		return err
	})
	return dev
}

func txPackets(t *testing.T, n *node, dev string) uint64 {
	t.Helper()
	var tx uint64
	n.do(t, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		tx = l.Attrs().Statistics.TxPackets
		return nil
	})
	return tx
}

func TestVRFDomainsSpanNodesOverVXLANAndOverlappingVPCsStayApart(t *testing.T) {
	if _, err := exec.LookPath("cnitool"); err != nil {
		t.Skip("needs cnitool")
	}
	n1, n2 := newNode(t), newNode(t)
	p1, p2 := vtep(t, n1, n2)
	blue1, blue2, red1 := newNetns(t), newNetns(t), newNetns(t)
	n1.network(t, "blue", stanza("blue", "web-1", names.ModeVeth, "10.20.0.5/24"))
	n1.cnitool(t, "add", "blue", blue1)
	n2.network(t, "blue", stanza("blue", "web-2", names.ModeVeth, "10.20.0.7/24"))
	n2.cnitool(t, "add", "blue", blue2)
	// Red on node-1 uses blue's remote address: one node, two VRFs, one address.
	n1.network(t, "red", stanza("red", "db-1", names.ModeVeth, "10.20.0.7/24"))
	n1.cnitool(t, "add", "red", red1)

	dev1 := program(t, n1, p1, "blue", 10100, dataplane.Remote{Prefix: netip.MustParsePrefix("10.20.0.7/32"), NextHop: p2.Underlay, RouterMAC: p2.DeviceMAC("blue")})
	program(t, n2, p2, "blue", 10100, dataplane.Remote{Prefix: netip.MustParsePrefix("10.20.0.5/32"), NextHop: p1.Underlay, RouterMAC: p1.DeviceMAC("blue")})
	n1.do(t, func() error {
		l, err := netlink.LinkByName(dev1.Name)
		if err != nil {
			return err
		}
		if l.Attrs().MasterIndex != n1.vrf(t, "blue").Index {
			return fmt.Errorf("%s is not enslaved to blue's VRF", dev1.Name)
		}
		return nil
	})

	before := txPackets(t, n1, dev1.Name)
	if err := ping(blue1, netip.MustParseAddr("10.20.0.7")); err != nil {
		t.Fatalf("blue on node-1 does not reach blue on node-2: %v", err)
	}
	if err := ping(blue2, netip.MustParseAddr("10.20.0.5")); err != nil {
		t.Fatalf("blue on node-2 does not reach blue on node-1: %v", err)
	}
	if txPackets(t, n1, dev1.Name) == before {
		t.Fatal("blue's 10.20.0.7 answered without crossing the VXLAN device: red's workload answered it")
	}
	// Red reaches neither blue workload.
	if err := ping(red1, netip.MustParseAddr("10.20.0.5")); err == nil {
		t.Fatal("red reached blue's workload on its own node")
	}
}
