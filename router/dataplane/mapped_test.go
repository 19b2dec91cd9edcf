package dataplane

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/netnstest"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/routing"
)

// inNetns runs f in a fresh network namespace; it needs root.
func inNetns(t *testing.T, f func()) { netnstest.Run(t, f) }

func loUp(t *testing.T) {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
}

func TestIPv6RoutesViaAMappedNextHopAreInstalledAndRemovedOverNetlink(t *testing.T) {
	inNetns(t, func() {
		// An onlink IPv4 gateway is checked against the local table, which
		// a namespace has once an address (lo's) is up.
		loUp(t)
		dev := blueDevice(t)
		name := dev.Name
		// Above 255, so the table travels in RTA_TABLE only.
		d := &routing.Domain{VPC: "blue", Kind: routing.KindTable, Table: 1234}
		mac, _ := net.ParseMAC("02:00:00:00:00:0c")
		vtep := netip.MustParseAddr("192.0.2.12")
		mapped := netip.MustParseAddr("::ffff:192.0.2.12")
		remotes := []Remote{
			{Prefix: netip.MustParsePrefix("fd20::5/128"), NextHop: vtep, RouterMAC: mac},
			{Prefix: netip.MustParsePrefix("fd20:1::/64"), NextHop: vtep, RouterMAC: mac},
			{Prefix: netip.MustParsePrefix("10.20.0.5/32"), NextHop: vtep, RouterMAC: mac},
		}
		p := Plane{Underlay: netip.MustParseAddr("192.0.2.11"), Node: "node-a"}
		ch, err := p.Sync(dev, d, remotes)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Added != 3 {
			t.Fatalf("first sync: %+v, want 3 added", ch)
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: d.Table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, r := range routes {
			gw, _ := netip.AddrFromSlice(r.Gw)
			if gw != mapped || r.LinkIndex != dev.Index || int(r.Protocol) != Protocol || r.Flags&int(netlink.FLAG_ONLINK) == 0 {
				t.Errorf("route %v: want via %s dev %s onlink proto %d", r, mapped, name, Protocol)
			}
			got++
		}
		if got != 2 {
			t.Fatalf("table %d holds %d IPv6 routes, want 2: %v", d.Table, got, routes)
		}
		if !hasPermanentNeigh(t, dev, mapped, mac) {
			t.Fatalf("no permanent neighbour %s lladdr %s", mapped, mac)
		}
		checkReads(t, p, dev, d, vtep, mac)

		if ch, err := p.Sync(dev, d, remotes); err != nil || ch != (Changes{}) {
			t.Fatalf("second sync of the same routes: %+v, %v; want no change", ch, err)
		}

		if ch, err := p.Sync(dev, d, nil); err != nil || ch.Removed != 3 {
			t.Fatalf("sync to nothing: %+v, %v; want 3 removed", ch, err)
		}
		if hasPermanentNeigh(t, dev, mapped, mac) {
			t.Fatalf("neighbour %s left after its last route went", mapped)
		}
		if err := setMappedNeigh(dev, mapped, nil); err != nil {
			t.Fatalf("removing a missing neighbour: %v, want success", err)
		}
	})
}

// blueDevice makes VPC blue's VXLAN device, up.
func blueDevice(t *testing.T) *Device {
	t.Helper()
	name := routing.VXLANDeviceName("blue")
	v := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name, Alias: routing.VXLANDeviceAlias("blue")}, VxlanId: 10100, Port: VXLANPort}
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetAlias(l, routing.VXLANDeviceAlias("blue")); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return &Device{Name: name, Index: l.Attrs().Index, MAC: l.Attrs().HardwareAddr}
}

// checkReads reads back the three routes via vtep (IPv6 ones via its
// mapped address) and the router MAC mac: a table's read and Installed.
func checkReads(t *testing.T, p Plane, dev *Device, d *routing.Domain, vtep netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	mapped := netip.AddrFrom16(vtep.As16())
	// The kernel filters a table's dump: only its three routes come,
	// each read in full.
	one, err := p.ReadRoutes([]int{d.Table})
	if err != nil || one.Objects != 3 || len(one.Routes[d.Table]) != 3 {
		t.Fatalf("table %d read: %d objects, %v (%v); want its 3 routes", d.Table, one.Objects, one.Routes, err)
	}
	for _, r := range one.Routes[d.Table] {
		want := vtep
		if r.Prefix.Addr().Is6() {
			want = mapped
		}
		if r.Table != d.Table || r.Gw != want || r.LinkIndex != dev.Index || r.Protocol != Protocol || !r.Onlink() {
			t.Errorf("read %+v: want table %d via %s dev %d proto %d onlink", r, d.Table, want, dev.Index, Protocol)
		}
	}
	k, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	inst := k.Installed("blue", d)
	if len(inst) != 3 {
		t.Fatalf("Installed: %v, %v; want the 3 routes", inst, err)
	}
	for _, r := range inst {
		if r.NextHop != vtep || r.RouterMAC.String() != mac.String() {
			t.Errorf("Installed %+v: want next hop %s router MAC %s", r, vtep, mac)
		}
	}
}

func hasPermanentNeigh(t *testing.T, dev *Device, ip netip.Addr, mac net.HardwareAddr) bool {
	t.Helper()
	ns, err := netlink.NeighList(dev.Index, unix.AF_INET6)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		a, _ := netip.AddrFromSlice(n.IP)
		if a == ip && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr.String() == mac.String() {
			return true
		}
	}
	return false
}
