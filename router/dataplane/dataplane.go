// Package dataplane programs what galactic-router installs in a node's
// kernel for one VPC: a VXLAN device in the VPC's routing domain and, for
// every remote prefix, an onlink route via the remote VTEP with the remote
// router MAC as a permanent neighbour and FDB entry (the way an EVPN L3VNI
// is installed). Every route and rule carries Protocol, so a restarted
// router finds its own state and an operator can list it
// (`ip route show table all proto 150`).
//
// Callers hold the node lock (state.Lock) around every change, as
// galactic-cni does, so a domain galactic-cni removes and the VXLAN device
// never race.
package dataplane

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/routing"
)

const (
	// Protocol tags galactic-router's routes and rules; galactic-cni's are
	// routing.Protocol.
	Protocol = 150
	// VXLANPort is the IANA VXLAN port.
	VXLANPort = 4789
	// Overhead is what VXLAN over IPv4 adds to a frame: outer IPv4 (20),
	// UDP (8), VXLAN (8) and the inner Ethernet header (14).
	Overhead = 50
)

// Remote is one route to install: a prefix behind a remote VTEP.
type Remote struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr
	RouterMAC net.HardwareAddr
}

// Plane programs the kernel of the node it runs in.
type Plane struct {
	// Underlay is the node's fabric address: the VXLAN source.
	Underlay netip.Addr
	// Node seeds the VXLAN devices' MACs, so a recreated device keeps the
	// router MAC it announced.
	Node string
}

// DeviceMAC is the VXLAN device's MAC for vpc on this node: locally
// administered, unicast, from sha256("<node>/<vpc>").
func (p Plane) DeviceMAC(vpc string) net.HardwareAddr {
	h := sha256.Sum256([]byte("router-mac:" + p.Node + "/" + vpc))
	mac := net.HardwareAddr(slices.Clone(h[:6]))
	mac[0] = mac[0]&0xfc | 0x02
	return mac
}

// underlayMTU is the MTU of the interface holding the underlay address.
func (p Plane) underlayMTU() (int, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return 0, err
	}
	for _, l := range links {
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.Underlay {
				return l.Attrs().MTU, nil
			}
		}
	}
	return 0, fmt.Errorf("no interface holds the underlay address %s", p.Underlay)
}

// Device is a VPC's VXLAN device as found or made.
type Device struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
}

// EnsureDevice creates or adopts the VPC's VXLAN device (VNI, local
// underlay, port 4789, learning off, MTU underlay - 50), puts it in the
// domain and brings it up. A device of that name with other settings is
// replaced.
func (p Plane) EnsureDevice(vpc string, vni uint32, d *routing.Domain) (*Device, error) {
	name := routing.VXLANDeviceName(vpc)
	mtu, err := p.underlayMTU()
	if err != nil {
		return nil, err
	}
	mac := p.DeviceMAC(vpc)
	l, err := netlinksafe.LinkByName(name)
	if err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, fmt.Errorf("looking up %s: %w", name, err)
	}
	if l != nil {
		v, ok := l.(*netlink.Vxlan)
		if !ok || l.Attrs().Alias != routing.VXLANDeviceAlias(vpc) {
			return nil, fmt.Errorf("device %s exists but is not VPC %s's VXLAN device", name, vpc)
		}
		src, _ := netip.AddrFromSlice(v.SrcAddr)
		if uint32(v.VxlanId) != vni || src.Unmap() != p.Underlay || v.Port != VXLANPort || v.Learning {
			if err := netlink.LinkDel(l); err != nil {
				return nil, fmt.Errorf("replacing %s: %w", name, err)
			}
			l = nil
		}
	}
	if l == nil {
		v := &netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu - Overhead, HardwareAddr: mac},
			VxlanId:   int(vni), SrcAddr: p.Underlay.AsSlice(), Port: VXLANPort, Learning: false,
		}
		if err := netlink.LinkAdd(v); err != nil {
			return nil, fmt.Errorf("creating VXLAN device %s (VNI %d): %w", name, vni, err)
		}
		if l, err = netlinksafe.LinkByName(name); err != nil {
			return nil, err
		}
		if err := netlink.LinkSetAlias(l, routing.VXLANDeviceAlias(vpc)); err != nil {
			_ = netlink.LinkDel(l)
			return nil, fmt.Errorf("setting the alias of %s: %w", name, err)
		}
	}
	if l.Attrs().MTU != mtu-Overhead {
		if err := netlink.LinkSetMTU(l, mtu-Overhead); err != nil {
			return nil, fmt.Errorf("setting MTU of %s: %w", name, err)
		}
	}
	if !bytes.Equal(l.Attrs().HardwareAddr, mac) {
		if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
			return nil, fmt.Errorf("setting the MAC of %s: %w", name, err)
		}
	}
	if err := p.placeInDomain(l, d); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("bringing %s up: %w", name, err)
	}
	return &Device{Name: name, Index: l.Attrs().Index, MAC: mac}, nil
}

var families = []int{netlink.FAMILY_V4, netlink.FAMILY_V6}

func (p Plane) placeInDomain(l netlink.Link, d *routing.Domain) error {
	if d.Kind == routing.KindVRF {
		vrf, err := netlinksafe.LinkByName(d.Device)
		if err != nil {
			return fmt.Errorf("VRF device %s: %w", d.Device, err)
		}
		if l.Attrs().MasterIndex != vrf.Attrs().Index {
			if err := netlink.LinkSetMasterByIndex(l, vrf.Attrs().Index); err != nil {
				return fmt.Errorf("enslaving %s to %s: %w", l.Attrs().Name, d.Device, err)
			}
		}
		return nil
	}
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			return fmt.Errorf("listing rules: %w", err)
		}
		if slices.ContainsFunc(rules, func(r netlink.Rule) bool {
			return r.IifName == l.Attrs().Name && r.Table == d.Table && r.Priority == routing.IifPriority
		}) {
			continue
		}
		r := netlink.NewRule()
		r.Family, r.Priority, r.Table, r.IifName, r.Protocol = f, routing.IifPriority, d.Table, l.Attrs().Name, Protocol
		if err := netlink.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding rule iif %s lookup %d: %w", l.Attrs().Name, d.Table, err)
		}
	}
	return nil
}

// nextHopFor is the gateway of a route to prefix via the remote VTEP: the
// VTEP itself, or for an IPv6 prefix its IPv4-mapped form (the kernel
// refuses an IPv4 gateway on an IPv6 route).
func nextHopFor(prefix netip.Prefix, vtep netip.Addr) netip.Addr {
	if prefix.Addr().Is6() && vtep.Is4() {
		return netip.AddrFrom16(vtep.As16())
	}
	return vtep
}

// Changes counts what one Sync did.
type Changes struct {
	Added, Replaced, Removed int
}

// Sync makes the routes the router installed in the domain's table equal
// remotes, and the device's permanent neighbours and FDB entries those the
// routes need. A remote prefix that has any route of another protocol in
// the table (a local host route of galactic-cni, say) is not installed:
// local always wins. Routes that are already right are not touched.
func (p Plane) Sync(dev *Device, d *routing.Domain, remotes []Remote) (Changes, error) {
	var ch Changes
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: d.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return ch, fmt.Errorf("listing table %d: %w", d.Table, err)
	}
	foreign := map[netip.Prefix]bool{}
	ours := map[netip.Prefix]netlink.Route{}
	for _, r := range routes {
		pfx, ok := routing.PrefixOf(r.Dst)
		if !ok {
			continue
		}
		if int(r.Protocol) == Protocol {
			ours[pfx] = r
		} else {
			foreign[pfx] = true
		}
	}
	wantNeigh := map[netip.Addr]net.HardwareAddr{}
	wantFDB := map[string]netip.Addr{}
	want := map[netip.Prefix]bool{}
	// Thousands of routes share a few next hops: each gateway's neighbour
	// is set once, before the first route through it.
	neighErr := map[netip.Addr]error{}
	var errs []error
	for _, rm := range remotes {
		if foreign[rm.Prefix] || want[rm.Prefix] {
			continue
		}
		want[rm.Prefix] = true
		gw := nextHopFor(rm.Prefix, rm.NextHop)
		wantNeigh[gw] = rm.RouterMAC
		wantNeigh[rm.NextHop] = rm.RouterMAC
		wantFDB[rm.RouterMAC.String()] = rm.NextHop
		cur, have := ours[rm.Prefix]
		if have && cur.LinkIndex == dev.Index && ipEqual(cur.Gw, gw) && cur.Flags&int(netlink.FLAG_ONLINK) != 0 {
			continue
		}
		r := &netlink.Route{
			Dst: routing.IPNet(rm.Prefix), Gw: gw.AsSlice(), LinkIndex: dev.Index, Table: d.Table,
			Protocol: Protocol, Flags: int(netlink.FLAG_ONLINK),
		}
		// Neighbour first: the route must never point at a gateway the
		// device cannot resolve.
		nerr, done := neighErr[gw]
		if !done {
			nerr = p.ensureNeigh(dev, gw, rm.RouterMAC)
			neighErr[gw] = nerr
			if nerr != nil {
				errs = append(errs, nerr)
			}
		}
		if nerr != nil {
			continue
		}
		var err error
		if gw.Is4In6() {
			err = replaceMappedRoute(rm.Prefix, gw, dev.Index, d.Table)
		} else {
			err = netlink.RouteReplace(r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("installing %s via %s dev %s table %d: %w", rm.Prefix, gw, dev.Name, d.Table, err))
			continue
		}
		if have {
			ch.Replaced++
		} else {
			ch.Added++
		}
	}
	for pfx, r := range ours {
		if want[pfx] {
			continue
		}
		// By destination, table and protocol: a mapped gateway cannot be
		// sent back through the library.
		r = netlink.Route{Dst: r.Dst, Table: r.Table, Protocol: r.Protocol, LinkIndex: r.LinkIndex}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("removing %s from table %d: %w", pfx, d.Table, err))
			continue
		}
		ch.Removed++
	}
	errs = append(errs, p.syncNeighbours(dev, wantNeigh), p.syncFDB(dev, wantFDB))
	return ch, errors.Join(errs...)
}

func ipEqual(a net.IP, b netip.Addr) bool {
	x, ok := netip.AddrFromSlice(a)
	return ok && x == b
}

func (p Plane) ensureNeigh(dev *Device, ip netip.Addr, mac net.HardwareAddr) error {
	if ip.Is4In6() {
		return setMappedNeigh(dev, ip, mac)
	}
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	n := &netlink.Neigh{LinkIndex: dev.Index, Family: fam, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := netlink.NeighSet(n); err != nil {
		return fmt.Errorf("neighbour %s lladdr %s dev %s: %w", ip, mac, dev.Name, err)
	}
	return nil
}

func (p Plane) syncNeighbours(dev *Device, want map[netip.Addr]net.HardwareAddr) error {
	var errs []error
	have := map[netip.Addr]bool{}
	for _, f := range families {
		ns, err := netlink.NeighList(dev.Index, f)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing neighbours of %s: %w", dev.Name, err))
			continue
		}
		for _, n := range ns {
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || n.State&netlink.NUD_PERMANENT == 0 {
				continue
			}
			if f == netlink.FAMILY_V4 {
				ip = ip.Unmap()
			}
			mac, wanted := want[ip]
			if wanted && bytes.Equal(mac, n.HardwareAddr) {
				have[ip] = true
				continue
			}
			if !wanted {
				if ip.Is4In6() {
					errs = append(errs, setMappedNeigh(dev, ip, nil))
				} else if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("removing neighbour %s dev %s: %w", ip, dev.Name, err))
				}
			}
		}
	}
	for ip, mac := range want {
		if !have[ip] {
			errs = append(errs, p.ensureNeigh(dev, ip, mac))
		}
	}
	return errors.Join(errs...)
}

func (p Plane) syncFDB(dev *Device, want map[string]netip.Addr) error {
	var errs []error
	entries, err := netlink.NeighList(dev.Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("listing FDB of %s: %w", dev.Name, err)
	}
	have := map[string]bool{}
	for _, e := range entries {
		if e.State&netlink.NUD_PERMANENT == 0 || len(e.HardwareAddr) != 6 {
			continue
		}
		mac := e.HardwareAddr.String()
		dst, _ := netip.AddrFromSlice(e.IP)
		if w, ok := want[mac]; ok && w == dst.Unmap() {
			have[mac] = true
			continue
		}
		if mac == "00:00:00:00:00:00" {
			continue
		}
		if err := netlink.NeighDel(&e); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing FDB %s dev %s: %w", mac, dev.Name, err))
		}
	}
	for mac, dst := range want {
		if have[mac] {
			continue
		}
		hw, _ := net.ParseMAC(mac)
		n := &netlink.Neigh{
			LinkIndex: dev.Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: dst.AsSlice(), HardwareAddr: hw,
		}
		if err := netlink.NeighAppend(n); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("FDB %s dst %s dev %s: %w", mac, dst, dev.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Devices lists the VXLAN devices galactic-router made, by VPC (from their
// alias).
func Devices() (map[string]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := map[string]string{}
	for _, l := range links {
		alias := l.Attrs().Alias
		if _, ok := l.(*netlink.Vxlan); ok && len(alias) > len(routing.VXLANAliasPrefix) && alias[:len(routing.VXLANAliasPrefix)] == routing.VXLANAliasPrefix {
			vpc := alias[len(routing.VXLANAliasPrefix):]
			if routing.VXLANDeviceName(vpc) == l.Attrs().Name {
				out[vpc] = l.Attrs().Name
			}
		}
	}
	return out, nil
}

// RemoveVPC deletes the VPC's VXLAN device with its neighbours and FDB
// entries, and every route and rule of Protocol that names it.
func (p Plane) RemoveVPC(vpc string) error {
	name := routing.VXLANDeviceName(vpc)
	var errs []error
	l, err := netlinksafe.LinkByName(name)
	if err == nil && l.Attrs().Alias == routing.VXLANDeviceAlias(vpc) {
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: l.Attrs().Index, Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err == nil {
			for i := range routes {
				if int(routes[i].Protocol) == Protocol {
					_ = netlink.RouteDel(&routes[i])
				}
			}
		}
		if err := netlink.LinkDel(l); err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", name, err))
		}
	}
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range rules {
			if r.IifName != name {
				continue
			}
			del := netlink.NewRule()
			del.Family, del.Priority, del.Table, del.IifName = f, r.Priority, r.Table, r.IifName
			if err := netlink.RuleDel(del); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("deleting rule iif %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Installed lists the remote routes the router installed in the VPC's
// table, with the router MACs of their neighbours: what a previous run
// left for this one to take over.
func Installed(vpc string, d *routing.Domain) ([]Remote, error) {
	l, err := netlinksafe.LinkByName(routing.VXLANDeviceName(vpc))
	if err != nil {
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil, nil
		}
		return nil, err
	}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: d.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	macs := map[netip.Addr]net.HardwareAddr{}
	for _, f := range families {
		ns, err := netlink.NeighList(l.Attrs().Index, f)
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				macs[ip] = n.HardwareAddr
			}
		}
	}
	var out []Remote
	for _, r := range routes {
		pfx, ok := routing.PrefixOf(r.Dst)
		if !ok || int(r.Protocol) != Protocol || r.LinkIndex != l.Attrs().Index {
			continue
		}
		gw, ok := netip.AddrFromSlice(r.Gw)
		if !ok {
			continue
		}
		mac := macs[gw]
		if mac == nil {
			mac = macs[gw.Unmap()]
		}
		out = append(out, Remote{Prefix: pfx, NextHop: gw.Unmap(), RouterMAC: mac})
	}
	return out, nil
}
