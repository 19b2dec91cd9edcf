package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/routing"
)

// Plan is the kernel writes one VPC needs, found from a Kernel read
// without the node lock and run with it: a pass that needs none never
// takes the lock.
type Plan struct {
	// device writes come first and stop the plan when one fails; the
	// rest are independent, in order (neighbours before the routes through
	// them, removals last).
	device, ops []func() error
	// Changes counts the route writes that succeeded; Skipped the routes
	// that found a route of another protocol in place when written
	// (galactic-cni's local route came meanwhile: local wins).
	Changes Changes
	Skipped int
	// Neighs and FDB are the device's permanent entries once the plan
	// ran: only the router writes them (learning is off), so a later
	// pass can plan from these instead of dumping every device's.
	Neighs, FDB []netlink.Neigh
	// replaces are the routes of ours the plan replaces in table: Apply
	// reads that table again first, so a local route that took one's
	// place since the read is not replaced (local wins).
	replaces []netip.Prefix
	table    int
	foreign  map[netip.Prefix]bool
	// h carries the writes while Apply runs: one netlink socket for the
	// plan, not one opened and closed per route.
	h *netlink.Handle
}

// oneShot is a handle that opens a socket per request, for writes
// outside Apply.
var oneShot = &netlink.Handle{}

func (pl *Plan) writer() *netlink.Handle {
	if pl.h != nil {
		return pl.h
	}
	return oneShot
}

// DeviceWrites is how many of the plan's writes make, replace or change
// the device itself.
func (pl *Plan) DeviceWrites() int { return len(pl.device) }

// Writes is how many netlink writes the plan holds.
func (pl *Plan) Writes() int { return len(pl.device) + len(pl.ops) }

// Apply runs the writes; call it with the node lock held. A failed
// device write (device) stops the plan; the others are joined in err.
func (pl *Plan) Apply() (device, err error) {
	if h, err := netlink.NewHandle(unix.NETLINK_ROUTE); err == nil {
		pl.h = h
		defer func() { h.Close(); pl.h = nil }()
	}
	if len(pl.replaces) > 0 {
		k, err := Plane{}.ReadRoutes([]int{pl.table})
		if err != nil {
			return nil, err
		}
		pl.foreign = map[netip.Prefix]bool{}
		for _, r := range k.Routes[pl.table] {
			if r.Prefix.IsValid() && r.Protocol != Protocol {
				pl.foreign[r.Prefix] = true
			}
		}
	}
	for _, f := range pl.device {
		if err := f(); err != nil {
			return err, nil
		}
	}
	var errs []error
	for _, f := range pl.ops {
		errs = append(errs, f())
	}
	return nil, errors.Join(errs...)
}

// linkAt is a handle on a link by index, for writes that take a link.
func linkAt(dev *Device) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: dev.Index, Name: dev.Name}}
}

// EnsureDevice creates or adopts the VPC's VXLAN device now: PlanDevice
// over a fresh read, applied.
func (p Plane) EnsureDevice(vpc string, vni uint32, d *routing.Domain) (*Device, error) {
	k, err := p.Read()
	if err != nil {
		return nil, err
	}
	var pl Plan
	dev, err := p.PlanDevice(vpc, vni, d, k, &pl)
	if err != nil {
		return nil, err
	}
	if err, _ := pl.Apply(); err != nil {
		return nil, err
	}
	return dev, nil
}

// Sync makes the domain's routes equal remotes now: PlanRoutes over a
// fresh read, applied.
func (p Plane) Sync(dev *Device, d *routing.Domain, remotes []Remote) (Changes, error) {
	k, err := p.Read()
	if err != nil {
		return Changes{}, err
	}
	var pl Plan
	p.PlanRoutes(dev, d, remotes, k, &pl)
	devErr, err := pl.Apply()
	return pl.Changes, errors.Join(devErr, err)
}

// PlanDevice plans the VPC's VXLAN device (VNI, local underlay, port 4789,
// learning off, MTU underlay - 50) in the domain and up. A device of that
// name with other settings is replaced. The Device's Index is known once
// the plan's device writes ran when the device is to be made.
func (p Plane) PlanDevice(vpc string, vni uint32, d *routing.Domain, k *Kernel, pl *Plan) (*Device, error) {
	if k.MTUErr != nil {
		return nil, k.MTUErr
	}
	mtu := k.MTU - Overhead
	name := routing.VXLANDeviceName(vpc)
	dev := &Device{Name: name, MAC: p.DeviceMAC(vpc)}
	l := k.Links[name]
	if l != nil {
		v, ok := l.(*netlink.Vxlan)
		if !ok || l.Attrs().Alias != routing.VXLANDeviceAlias(vpc) {
			return nil, fmt.Errorf("device %s exists but is not VPC %s's VXLAN device", name, vpc)
		}
		src, _ := netip.AddrFromSlice(v.SrcAddr)
		if uint32(v.VxlanId) != vni || src.Unmap() != p.Underlay || v.Port != VXLANPort || v.Learning {
			old := l
			pl.device = append(pl.device, func() error {
				if err := pl.writer().LinkDel(old); err != nil {
					return fmt.Errorf("replacing %s: %w", name, err)
				}
				return nil
			})
			l = nil
		}
	}
	up := false
	if l == nil {
		pl.device = append(pl.device, func() error {
			if err := addVXLAN(name, mtu, dev.MAC, vni, p.Underlay); err != nil {
				return fmt.Errorf("creating VXLAN device %s (VNI %d): %w", name, vni, err)
			}
			made, err := pl.writer().LinkByName(name)
			if err != nil {
				return err
			}
			dev.Index = made.Attrs().Index
			if err := pl.writer().LinkSetAlias(made, routing.VXLANDeviceAlias(vpc)); err != nil {
				_ = pl.writer().LinkDel(made)
				return fmt.Errorf("setting the alias of %s: %w", name, err)
			}
			return nil
		})
	} else {
		dev.Index = l.Attrs().Index
		up = l.Attrs().Flags&net.FlagUp != 0
		if l.Attrs().MTU != mtu {
			pl.device = append(pl.device, func() error {
				if err := pl.writer().LinkSetMTU(linkAt(dev), mtu); err != nil {
					return fmt.Errorf("setting MTU of %s: %w", name, err)
				}
				return nil
			})
		}
		if !bytes.Equal(l.Attrs().HardwareAddr, dev.MAC) {
			pl.device = append(pl.device, func() error {
				if err := pl.writer().LinkSetHardwareAddr(linkAt(dev), dev.MAC); err != nil {
					return fmt.Errorf("setting the MAC of %s: %w", name, err)
				}
				return nil
			})
		}
	}
	if err := p.planDomain(l, dev, d, k, pl); err != nil {
		return nil, err
	}
	if !up {
		pl.device = append(pl.device, func() error {
			if err := pl.writer().LinkSetUp(linkAt(dev)); err != nil {
				return fmt.Errorf("bringing %s up: %w", name, err)
			}
			return nil
		})
	}
	return dev, nil
}

var families = []int{netlink.FAMILY_V4, netlink.FAMILY_V6}

// planDomain puts the device (l, nil when it is to be made) in the domain:
// under the VRF, or with an iif rule per family to the table.
func (p Plane) planDomain(l netlink.Link, dev *Device, d *routing.Domain, k *Kernel, pl *Plan) error {
	if d.Kind == routing.KindVRF {
		vrf := k.Links[d.Device]
		if vrf == nil {
			return fmt.Errorf("VRF device %s: not found", d.Device)
		}
		if l == nil || l.Attrs().MasterIndex != vrf.Attrs().Index {
			pl.device = append(pl.device, func() error {
				if err := pl.writer().LinkSetMasterByIndex(linkAt(dev), vrf.Attrs().Index); err != nil {
					return fmt.Errorf("enslaving %s to %s: %w", dev.Name, d.Device, err)
				}
				return nil
			})
		}
		return nil
	}
	for _, f := range families {
		if slices.ContainsFunc(k.Rules[f], func(r netlink.Rule) bool {
			return r.IifName == dev.Name && r.Table == d.Table && r.Priority == routing.IifPriority
		}) {
			continue
		}
		pl.device = append(pl.device, func() error {
			r := netlink.NewRule()
			r.Family, r.Priority, r.Table, r.IifName, r.Protocol = f, routing.IifPriority, d.Table, dev.Name, Protocol
			if err := pl.writer().RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("adding rule iif %s lookup %d: %w", dev.Name, d.Table, err)
			}
			return nil
		})
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

// PlanRoutes plans making the routes the router installed in the domain's
// table equal remotes, and the device's permanent neighbours and FDB
// entries those the routes need. A remote prefix that has any route of
// another protocol in the table (a local host route of galactic-cni, say)
// is not installed: local always wins, and a new route is added only
// where none is, so one that came after the read stays. Routes that are
// already right are not touched.
func (p Plane) PlanRoutes(dev *Device, d *routing.Domain, remotes []Remote, k *Kernel, pl *Plan) {
	ours, foreign := splitTable(k.Routes[d.Table])
	var haveNeigh []netlink.Neigh
	var haveFDB []netlink.Neigh
	if dev.Index != 0 {
		haveNeigh, haveFDB = k.Neighs[dev.Index], k.FDB[dev.Index]
	}
	wantNeigh := map[netip.Addr]net.HardwareAddr{}
	wantFDB := map[string]netip.Addr{}
	want := make(map[netip.Prefix]bool, len(remotes))
	type install struct {
		r    Remote
		gw   netip.Addr
		have bool
	}
	var installs []install
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
		if have && cur.LinkIndex == dev.Index && cur.Gw == gw && cur.Onlink() {
			continue
		}
		installs = append(installs, install{rm, gw, have})
		if have {
			pl.replaces = append(pl.replaces, rm.Prefix)
			pl.table = d.Table
		}
	}
	// Neighbour first: a route must never point at a gateway the device
	// cannot resolve, so a route whose neighbour failed is not written.
	failed := map[netip.Addr]bool{}
	stale := p.planNeighbours(dev, haveNeigh, wantNeigh, failed, pl)
	for _, in := range installs {
		pl.ops = append(pl.ops, func() error { return p.writeRoute(dev, d, in.r.Prefix, in.gw, in.have, failed, pl) })
	}
	for pfx, r := range ours {
		if want[pfx] {
			continue
		}
		// By destination, table and protocol: a mapped gateway cannot be
		// sent back through the library.
		del := netlink.Route{Dst: routing.IPNet(pfx), Table: r.Table, Protocol: netlink.RouteProtocol(r.Protocol), LinkIndex: r.LinkIndex}
		pl.ops = append(pl.ops, func() error {
			if err := pl.writer().RouteDel(&del); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("removing %s from table %d: %w", pfx, d.Table, err)
			}
			pl.Changes.Removed++
			return nil
		})
	}
	pl.ops = append(pl.ops, stale...)
	p.planFDB(dev, haveFDB, wantFDB, pl)
	pl.written(dev, wantNeigh, wantFDB)
}

// splitTable is a table's routes by prefix: the router's own, and the
// prefixes of routes of other protocols.
func splitTable(table []Route) (ours map[netip.Prefix]Route, foreign map[netip.Prefix]bool) {
	ours, foreign = make(map[netip.Prefix]Route, len(table)), map[netip.Prefix]bool{}
	for _, r := range table {
		if !r.Prefix.IsValid() {
			continue
		}
		if r.Protocol == Protocol {
			ours[r.Prefix] = r
		} else {
			foreign[r.Prefix] = true
		}
	}
	return ours, foreign
}

// written records in Neighs and FDB the device's entries as the plan
// leaves them: a pass that reads no devices takes them from there.
func (pl *Plan) written(dev *Device, neighs map[netip.Addr]net.HardwareAddr, fdb map[string]netip.Addr) {
	for ip, mac := range neighs {
		fam, raw := netlink.FAMILY_V6, ip.AsSlice()
		if ip.Is4() {
			fam = netlink.FAMILY_V4
		}
		pl.Neighs = append(pl.Neighs, netlink.Neigh{LinkIndex: dev.Index, Family: fam, State: netlink.NUD_PERMANENT, IP: raw, HardwareAddr: mac})
	}
	for mac, dst := range fdb {
		hw, _ := net.ParseMAC(mac)
		pl.FDB = append(pl.FDB, netlink.Neigh{LinkIndex: dev.Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: dst.AsSlice(), HardwareAddr: hw})
	}
}

func (p Plane) writeRoute(dev *Device, d *routing.Domain, pfx netip.Prefix, gw netip.Addr, have bool, failed map[netip.Addr]bool, pl *Plan) error {
	if failed[gw] {
		return nil
	}
	if have && pl.foreign[pfx] {
		pl.Skipped++
		return nil
	}
	var err error
	switch {
	case gw.Is4In6():
		err = replaceMappedRoute(pfx, gw, dev.Index, d.Table, have)
	case have:
		err = pl.writer().RouteReplace(&netlink.Route{Dst: routing.IPNet(pfx), Gw: gw.AsSlice(), LinkIndex: dev.Index, Table: d.Table,
			Protocol: Protocol, Flags: int(netlink.FLAG_ONLINK)})
	default:
		err = pl.writer().RouteAdd(&netlink.Route{Dst: routing.IPNet(pfx), Gw: gw.AsSlice(), LinkIndex: dev.Index, Table: d.Table,
			Protocol: Protocol, Flags: int(netlink.FLAG_ONLINK)})
	}
	switch {
	case !have && errors.Is(err, unix.EEXIST):
		pl.Skipped++
		return nil
	case err != nil:
		return fmt.Errorf("installing %s via %s dev %s table %d: %w", pfx, gw, dev.Name, d.Table, err)
	case have:
		pl.Changes.Replaced++
	default:
		pl.Changes.Added++
	}
	return nil
}

func setNeigh(h *netlink.Handle, dev *Device, ip netip.Addr, mac net.HardwareAddr) error {
	if ip.Is4In6() {
		return setMappedNeigh(dev, ip, mac)
	}
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	n := &netlink.Neigh{LinkIndex: dev.Index, Family: fam, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := h.NeighSet(n); err != nil {
		return fmt.Errorf("neighbour %s lladdr %s dev %s: %w", ip, mac, dev.Name, err)
	}
	return nil
}

// planNeighbours adds the neighbour writes the routes need to the plan and
// returns the removals of the ones no route needs, to run after the
// routes' removals.
func (p Plane) planNeighbours(dev *Device, have []netlink.Neigh, want map[netip.Addr]net.HardwareAddr, failed map[netip.Addr]bool, pl *Plan) (stale []func() error) {
	ok := map[netip.Addr]bool{}
	for _, n := range have {
		ip, valid := netip.AddrFromSlice(n.IP)
		if !valid {
			continue
		}
		if n.Family == netlink.FAMILY_V4 {
			ip = ip.Unmap()
		}
		mac, wanted := want[ip]
		if wanted && bytes.Equal(mac, n.HardwareAddr) {
			ok[ip] = true
			continue
		}
		if wanted {
			continue
		}
		stale = append(stale, func() error {
			if ip.Is4In6() {
				return setMappedNeigh(dev, ip, nil)
			}
			return delNeigh(pl.writer(), &n, "neighbour "+ip.String(), dev)
		})
	}
	for ip, mac := range want {
		if ok[ip] {
			continue
		}
		pl.ops = append(pl.ops, func() error {
			err := setNeigh(pl.writer(), dev, ip, mac)
			failed[ip] = err != nil
			return err
		})
	}
	return stale
}

// delNeigh removes a neighbour or FDB entry; one already gone is fine.
func delNeigh(h *netlink.Handle, n *netlink.Neigh, what string, dev *Device) error {
	if err := h.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s dev %s: %w", what, dev.Name, err)
	}
	return nil
}

func (p Plane) planFDB(dev *Device, have []netlink.Neigh, want map[string]netip.Addr, pl *Plan) {
	ok := map[string]bool{}
	for _, e := range have {
		if len(e.HardwareAddr) != 6 {
			continue
		}
		mac := e.HardwareAddr.String()
		dst, _ := netip.AddrFromSlice(e.IP)
		if w, wanted := want[mac]; wanted && w == dst.Unmap() {
			ok[mac] = true
			continue
		}
		if mac == "00:00:00:00:00:00" {
			continue
		}
		pl.ops = append(pl.ops, func() error { return delNeigh(pl.writer(), &e, "FDB "+mac, dev) })
	}
	for mac, dst := range want {
		if ok[mac] {
			continue
		}
		hw, _ := net.ParseMAC(mac)
		pl.ops = append(pl.ops, func() error {
			n := &netlink.Neigh{
				LinkIndex: dev.Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
				Flags: netlink.NTF_SELF, IP: dst.AsSlice(), HardwareAddr: hw,
			}
			if err := pl.writer().NeighAppend(n); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("FDB %s dst %s dev %s: %w", mac, dst, dev.Name, err)
			}
			return nil
		})
	}
}

// addVXLAN creates a VXLAN device: VNI, local address, port 4789,
// learning off and, over IPv4, no UDP checksum (RFC 7348: transmitted as
// zero; the inner packet carries its own), which the receiving node's
// decapsulation fast path takes. netlink.LinkAdd cannot say the last: it
// sends the checksum flag only to turn it on, and the kernel's default
// is on.
func addVXLAN(name string, mtu int, mac net.HardwareAddr, vni uint32, local netip.Addr) error {
	local = local.Unmap()
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, mac))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(nl.IFLA_VXLAN_ID, nl.Uint32Attr(vni))
	if local.Is4() {
		data.AddRtAttr(nl.IFLA_VXLAN_LOCAL, local.AsSlice())
		data.AddRtAttr(nl.IFLA_VXLAN_UDP_CSUM, []byte{0})
	} else {
		data.AddRtAttr(nl.IFLA_VXLAN_LOCAL6, local.AsSlice())
	}
	data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, []byte{0})
	data.AddRtAttr(nl.IFLA_VXLAN_PORT, []byte{VXLANPort >> 8, VXLANPort & 0xff})
	req.AddData(info)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}
