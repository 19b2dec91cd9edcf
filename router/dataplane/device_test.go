package dataplane

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/routing"
)

// A VPC's VXLAN device has the VNI, the underlay as local address, port
// 4789, learning off and, over IPv4, no UDP checksum: what the receiving
// node's decapsulation fast path takes (docs/concepts/routing.md).
func TestTheVXLANDeviceIsMadeWithTheFabricsSettings(t *testing.T) {
	inNetns(t, func() {
		loUp(t)
		// The underlay, whose MTU the device's follows.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ul1"}); err != nil {
			t.Fatal(err)
		}
		ul, err := netlink.LinkByName("ul0")
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := netlink.ParseAddr("192.0.2.11/24")
		if err := netlink.AddrAdd(ul, addr); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(ul); err != nil {
			t.Fatal(err)
		}
		p := Plane{Underlay: netip.MustParseAddr("192.0.2.11"), Node: "node-a"}
		dev, err := p.EnsureDevice("blue", 10100, &routing.Domain{VPC: "blue", Kind: routing.KindTable, Table: 1234})
		if err != nil {
			t.Fatal(err)
		}
		l, err := netlink.LinkByIndex(dev.Index)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := l.(*netlink.Vxlan)
		if !ok {
			t.Fatalf("%s is a %s", dev.Name, l.Type())
		}
		local, _ := netip.AddrFromSlice(v.SrcAddr)
		if v.VxlanId != 10100 || local.Unmap() != p.Underlay || v.Port != VXLANPort || v.Learning || v.UDPCSum {
			t.Errorf("VNI %d, local %s, port %d, learning %v, UDP checksum %v; want 10100, %s, %d, off, off", v.VxlanId, local, v.Port, v.Learning, v.UDPCSum, p.Underlay, VXLANPort)
		}
		if l.Attrs().MTU != ul.Attrs().MTU-Overhead || l.Attrs().Flags&1 == 0 || l.Attrs().HardwareAddr.String() != p.DeviceMAC("blue").String() || l.Attrs().Alias != routing.VXLANDeviceAlias("blue") {
			t.Errorf("%s: MTU %d, flags %v, MAC %s, alias %q", dev.Name, l.Attrs().MTU, l.Attrs().Flags, l.Attrs().HardwareAddr, l.Attrs().Alias)
		}
	})
}
