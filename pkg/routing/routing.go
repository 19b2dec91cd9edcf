package routing

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Routing kinds, as the stanza's "routing" field names them.
const (
	KindVRF   = "vrf"
	KindTable = "table"
)

const (
	// Protocol tags every route and rule galactic installs (`proto 149`),
	// so they are told apart from anyone else's.
	Protocol = 149
	// TableMin and TableCount bound the table IDs galactic allocates.
	TableMin   = 100000
	TableCount = 65536
	// IifPriority is the preference of the per-interface rules; it sits
	// before the main table's rule (32766).
	IifPriority = 1000
	// DstPriority is the preference of the per-workload-address rules.
	DstPriority = 1100
	// LocalPriority is where galactic moves the kernel's `lookup local`
	// rule (preference 0): behind its own rules and the VRF (l3mdev) rule,
	// just before main.
	LocalPriority = 32765
	// unreachableMetric puts the unreachable defaults behind any default
	// route someone adds to the table on purpose.
	unreachableMetric = 4278198272

	deviceAliasPrefix = "galactic-vpc:"
)

// ErrNoVRF is returned when vrf routing is asked for on a kernel without VRF.
var ErrNoVRF = errors.New(`routing "vrf" needs VRF support in the kernel (CONFIG_NET_VRF), which this node lacks; ` +
	`set "routing": "table" to isolate VPCs with policy-routing tables instead`)

// ErrKindMismatch is returned when a VPC already has a domain of another kind.
var ErrKindMismatch = errors.New("routing kind differs from the VPC's existing routing domain on this node")

// Domain is one VPC's routing domain on this node.
type Domain struct {
	VPC   string
	Kind  string
	Table int
	// Device is the VRF device; empty with table routing, and with vrf
	// routing when the device is gone (deleted by hand) but its table is
	// not: Ensure then creates the device again.
	Device string
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// DeviceName is the VRF device of a VPC: "gr" and 13 hex digits of
// sha256("vrf:<vpc>"), within IFNAMSIZ.
func DeviceName(vpc string) string {
	return "gr" + hex.EncodeToString(hash("vrf:" + vpc))[:13]
}

// DeviceAlias is the ifalias of a VPC's VRF device.
func DeviceAlias(vpc string) string { return deviceAliasPrefix + vpc }

// VXLANDeviceName is the VXLAN device galactic-router keeps in a VPC's
// domain: "gx" and 13 hex digits of sha256("vxlan:<vpc>").
func VXLANDeviceName(vpc string) string {
	return "gx" + hex.EncodeToString(hash("vxlan:" + vpc))[:13]
}

// VXLANAliasPrefix starts the ifalias of every VPC's VXLAN device.
const VXLANAliasPrefix = "galactic-vxlan:"

// VXLANDeviceAlias is the ifalias of a VPC's VXLAN device.
func VXLANDeviceAlias(vpc string) string { return VXLANAliasPrefix + vpc }

// Marker is the prefix of the marker route that ties a table to its VPC:
// 100::/64 (discard only) with the first 64 bits of sha256(vpc) after it.
// It marks tables of table routing; VRFMarker marks those of vrf routing.
func Marker(vpc string) netip.Prefix { return marker(vpc) }

// VRFMarker is Marker for a VPC with vrf routing: 100::/64 with the first
// 64 bits of sha256("vrf:<vpc>"). A distinct marker keeps the kind of a
// domain known when its VRF device has been deleted by hand.
func VRFMarker(vpc string) netip.Prefix { return marker("vrf:" + vpc) }

func marker(s string) netip.Prefix {
	var a [16]byte
	a[0], a[1] = 0x01, 0x00
	copy(a[8:], hash(s)[:8])
	return netip.PrefixFrom(netip.AddrFrom16(a), 128)
}

func (d *Domain) marker() netip.Prefix {
	if d.Kind == KindVRF {
		return VRFMarker(d.VPC)
	}
	return Marker(d.VPC)
}

// Allocate picks a table for vpc that used does not contain. The search
// starts at a hash of the VPC so a VPC tends to get the same table on every
// node, which makes `ip route show table N` easier to read.
func Allocate(vpc string, used map[int]bool) (int, error) {
	start := int(binary.BigEndian.Uint32(hash("table:"+vpc)) % TableCount)
	for i := 0; i < TableCount; i++ {
		t := TableMin + (start+i)%TableCount
		if !used[t] {
			return t, nil
		}
	}
	return 0, fmt.Errorf("no free routing table in %d..%d", TableMin, TableMin+TableCount-1)
}

// IPNet is p as the netlink library takes it.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// PrefixOf is a netlink destination as a prefix; false for none.
func PrefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), bits), true
}

// HostPrefix is addr as a /32 or /128.
func HostPrefix(addr netip.Addr) netip.Prefix {
	return netip.PrefixFrom(addr, addr.BitLen())
}

var families = []int{netlink.FAMILY_V4, netlink.FAMILY_V6}

func allRoutes(family int) ([]netlink.Route, error) {
	return netlinksafe.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
}

func tableRoutes(table int) ([]netlink.Route, error) {
	return netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
}

// UsedTables is every table ID the kernel's routes, rules and VRF devices use.
func UsedTables() (map[int]bool, error) {
	used := map[int]bool{}
	for _, f := range families {
		routes, err := allRoutes(f)
		if err != nil {
			return nil, fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range routes {
			used[r.Table] = true
		}
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			return nil, fmt.Errorf("listing rules: %w", err)
		}
		for _, r := range rules {
			used[r.Table] = true
		}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		if v, ok := l.(*netlink.Vrf); ok {
			used[int(v.Table)] = true
		}
	}
	return used, nil
}

// Find returns the VPC's domain as the kernel shows it, or nil if it has
// none. A VRF domain whose device is gone has an empty Device.
func Find(vpc string) (*Domain, error) {
	routes, err := allRoutes(netlink.FAMILY_V6)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	l, err := netlinksafe.LinkByName(DeviceName(vpc))
	if err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, fmt.Errorf("looking up VRF device %s: %w", DeviceName(vpc), err)
	}
	return FindIn(vpc, Markers(routes), l)
}

// Markers maps the marker routes among routes to their tables, so one
// dump serves FindIn for every VPC.
func Markers(routes []netlink.Route) map[netip.Prefix]int {
	out := map[netip.Prefix]int{}
	for _, r := range routes {
		if int(r.Protocol) != Protocol || r.Dst == nil || len(r.Dst.IP) != net.IPv6len || r.Dst.IP.To4() != nil {
			continue
		}
		if p, ok := PrefixOf(r.Dst); ok && p.Bits() == 128 {
			out[p] = r.Table
		}
	}
	return out
}

// FindIn is Find over what was already read: the marker tables and the
// link named DeviceName(vpc), nil when there is none.
func FindIn(vpc string, markers map[netip.Prefix]int, l netlink.Link) (*Domain, error) {
	tableMarked, vrfMarked := markers[Marker(vpc)], markers[VRFMarker(vpc)]
	var dev *netlink.Vrf
	if l != nil {
		v, ok := l.(*netlink.Vrf)
		if !ok || l.Attrs().Alias != DeviceAlias(vpc) {
			return nil, fmt.Errorf("device %s exists but is not the VRF of VPC %q", DeviceName(vpc), vpc)
		}
		dev = v
	}
	if dev != nil {
		// A table marker next to a VRF is what a VRF domain made before
		// the markers differed carries.
		for _, t := range []int{vrfMarked, tableMarked} {
			if t != 0 && t != int(dev.Table) {
				return nil, fmt.Errorf("VRF device %s of VPC %q uses table %d, but the VPC's marked table is %d; delete the device or the table", dev.Name, vpc, dev.Table, t)
			}
		}
		return &Domain{VPC: vpc, Kind: KindVRF, Table: int(dev.Table), Device: dev.Name}, nil
	}
	switch {
	case vrfMarked != 0:
		return &Domain{VPC: vpc, Kind: KindVRF, Table: vrfMarked}, nil
	case tableMarked != 0:
		return &Domain{VPC: vpc, Kind: KindTable, Table: tableMarked}, nil
	}
	return nil, nil
}

// Ensure returns the VPC's domain, creating it when there is none; created
// says whether this call created it (and so a rollback may remove it).
func Ensure(vpc, kind string) (d *Domain, created bool, err error) {
	if kind != KindVRF && kind != KindTable {
		return nil, false, fmt.Errorf("unknown routing kind %q", kind)
	}
	d, err = Find(vpc)
	if err != nil {
		return nil, false, err
	}
	if d != nil {
		if d.Kind != kind {
			return nil, false, fmt.Errorf("%w: VPC %q uses routing %q here, the config asks for %q; every attachment of a VPC on a node must use the same routing",
				ErrKindMismatch, vpc, d.Kind, kind)
		}
		if d.Kind == KindVRF && d.Device == "" {
			if err := d.createDevice(); err != nil {
				return nil, false, fmt.Errorf("recreating the missing VRF device of VPC %q: %w", vpc, err)
			}
		}
		// Completes a domain whose creation was interrupted.
		if err := d.ensureTable(); err != nil {
			return nil, false, err
		}
		if err := MoveLocalRule(); err != nil {
			return nil, false, err
		}
		return d, false, nil
	}
	used, err := UsedTables()
	if err != nil {
		return nil, false, err
	}
	table, err := Allocate(vpc, used)
	if err != nil {
		return nil, false, err
	}
	d = &Domain{VPC: vpc, Kind: kind, Table: table}
	if kind == KindVRF {
		if err := d.createDevice(); err != nil {
			return nil, false, err
		}
	}
	err = d.ensureTable()
	if err == nil {
		err = MoveLocalRule()
	}
	if err != nil {
		if rerr := Remove(vpc); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rolling back the new domain: %w", rerr))
		}
		return nil, false, err
	}
	return d, true, nil
}

func (d *Domain) createDevice() error {
	name := DeviceName(d.VPC)
	vrf := &netlink.Vrf{LinkAttrs: netlink.LinkAttrs{Name: name}, Table: uint32(d.Table)}
	if err := netlink.LinkAdd(vrf); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return ErrNoVRF
		}
		return fmt.Errorf("creating VRF device %s: %w", name, err)
	}
	d.Device = name
	l, err := netlinksafe.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetAlias(l, DeviceAlias(d.VPC))
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		_ = netlink.LinkDel(vrf)
		return fmt.Errorf("setting up VRF device %s: %w", name, err)
	}
	return nil
}

// ensureTable adds the marker and the unreachable defaults where they are
// missing. Those present are left alone: rewriting them on every ADD
// would notify every route watcher, and galactic-router reads the node's
// devices again when a marker changes.
func (d *Domain) ensureTable() error {
	routes := []netlink.Route{{
		Dst: IPNet(d.marker()), Type: unix.RTN_UNREACHABLE, Table: d.Table, Protocol: Protocol,
	}}
	for _, def := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		routes = append(routes, netlink.Route{
			Dst: IPNet(def), Type: unix.RTN_UNREACHABLE, Table: d.Table, Protocol: Protocol, Priority: unreachableMetric,
		})
	}
	for i := range routes {
		if err := netlink.RouteAdd(&routes[i]); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding %s to table %d: %w", describe(routes[i]), d.Table, err)
		}
	}
	return nil
}

func describe(r netlink.Route) string {
	p, _ := PrefixOf(r.Dst)
	switch r.Type {
	case unix.RTN_UNREACHABLE:
		return "unreachable " + p.String()
	case unix.RTN_LOCAL:
		return "local " + p.String()
	}
	return p.String()
}

// Remove deletes the VPC's domain: its VRF device, galactic-router's VXLAN
// device, every route in its table and every rule that looks the table up,
// so nothing of the domain is left half in place. A VPC without a domain
// is not an error.
func Remove(vpc string) error {
	d, err := Find(vpc)
	if err != nil || d == nil {
		return err
	}
	var errs []error
	if l, err := netlinksafe.LinkByName(VXLANDeviceName(vpc)); err == nil && l.Attrs().Alias == VXLANDeviceAlias(vpc) {
		if err := netlink.LinkDel(l); err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
			errs = append(errs, fmt.Errorf("deleting VXLAN device %s: %w", l.Attrs().Name, err))
		}
	}
	if d.Kind == KindVRF && d.Device != "" {
		if l, err := netlinksafe.LinkByName(d.Device); err == nil {
			if err := netlink.LinkDel(l); err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
				errs = append(errs, fmt.Errorf("deleting VRF device %s: %w", d.Device, err))
			}
		}
	}
	routes, err := tableRoutes(d.Table)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing table %d: %w", d.Table, err))
	}
	for i := range routes {
		if err := netlink.RouteDel(&routes[i]); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting %s from table %d: %w", describe(routes[i]), d.Table, err))
		}
	}
	errs = append(errs, deleteRules(func(r netlink.Rule) bool { return r.Table == d.Table }))
	return errors.Join(errs...)
}

func deleteRules(match func(netlink.Rule) bool) error {
	var errs []error
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing rules: %w", err))
			continue
		}
		for _, r := range rules {
			if !match(r) {
				continue
			}
			del := netlink.NewRule()
			del.Family, del.Priority, del.Table = f, r.Priority, r.Table
			del.IifName, del.Src, del.Dst = r.IifName, r.Src, r.Dst
			if err := netlink.RuleDel(del); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("deleting rule %s: %w", r, err))
			}
		}
	}
	return errors.Join(errs...)
}

// rule is what galactic's rules differ by.
type rule struct {
	family, priority, table int
	iif                     string
	dst                     netip.Prefix
}

func (r rule) matches(k netlink.Rule) bool {
	dst, _ := PrefixOf(k.Dst)
	return k.Priority == r.priority && k.Table == r.table && k.IifName == r.iif && dst == r.dst
}

func (r rule) String() string {
	switch {
	case r.dst.IsValid() && r.iif != "":
		return fmt.Sprintf("rule to %s iif %s lookup %d", r.dst, r.iif, r.table)
	case r.iif != "":
		return fmt.Sprintf("rule iif %s lookup %d", r.iif, r.table)
	}
	return fmt.Sprintf("rule to %s lookup %d", r.dst, r.table)
}

func ruleExists(r rule) (bool, error) {
	rules, err := netlinksafe.RuleList(r.family)
	if err != nil {
		return false, fmt.Errorf("listing rules: %w", err)
	}
	for _, k := range rules {
		if r.matches(k) {
			return true, nil
		}
	}
	return false, nil
}

func ensureRule(r rule) error {
	ok, err := ruleExists(r)
	if err != nil || ok {
		return err
	}
	k := netlink.NewRule()
	k.Family, k.Priority, k.Table, k.IifName, k.Protocol = r.family, r.priority, r.table, r.iif, Protocol
	if r.dst.IsValid() {
		k.Dst = IPNet(r.dst)
	}
	if err := netlink.RuleAdd(k); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding %s: %w", r, err)
	}
	return nil
}

func (d *Domain) iifRules(ifName string) []rule {
	var rs []rule
	for _, f := range families {
		rs = append(rs, rule{family: f, priority: IifPriority, table: d.Table, iif: ifName})
	}
	return rs
}

// LocalInterface is the iif of the node's own traffic in a rule lookup.
const LocalInterface = "lo"

// dstRule leads the node's own traffic to a workload address into the
// table: `iif lo`, so a packet arriving from any interface (the fabric, say)
// is never routed into a VPC by its destination alone.
func (d *Domain) dstRule(addr netip.Addr) rule {
	r := d.anyIifDstRule(addr)
	r.iif = LocalInterface
	return r
}

// anyIifDstRule is the `to <address>` rule without `iif lo` that earlier
// versions installed; AddHostRoute replaces it.
func (d *Domain) anyIifDstRule(addr netip.Addr) rule {
	f := netlink.FAMILY_V4
	if addr.Is6() {
		f = netlink.FAMILY_V6
	}
	return rule{family: f, priority: DstPriority, table: d.Table, dst: HostPrefix(addr)}
}

// AddInterface puts a host interface in the domain: enslaved to the VRF,
// or looked up in the table by `iif` rules for IPv4 and IPv6.
func (d *Domain) AddInterface(link netlink.Link) error {
	if d.Kind == KindVRF {
		dev, err := netlinksafe.LinkByName(d.Device)
		if err != nil {
			return fmt.Errorf("VRF device %s: %w", d.Device, err)
		}
		if err := netlink.LinkSetMasterByIndex(link, dev.Attrs().Index); err != nil {
			return fmt.Errorf("enslaving %s to %s: %w", link.Attrs().Name, d.Device, err)
		}
		return nil
	}
	for _, r := range d.iifRules(link.Attrs().Name) {
		if err := ensureRule(r); err != nil {
			return err
		}
	}
	return nil
}

// RemoveInterface takes a host interface's rules out of the domain. The
// rules name the interface, so they outlive it unless removed; a VRF slave
// leaves with its device.
func (d *Domain) RemoveInterface(ifName string) error {
	if d.Kind == KindVRF {
		return nil
	}
	return deleteRules(func(k netlink.Rule) bool {
		return k.Table == d.Table && k.IifName == ifName && k.Priority == IifPriority
	})
}

// AddHostRoute routes addr to link in the domain's table; with table
// routing it also adds the `to` rule that leads the node's own traffic there.
func (d *Domain) AddHostRoute(link netlink.Link, addr netip.Addr) error {
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index, Dst: IPNet(HostPrefix(addr)), Table: d.Table,
		Scope: netlink.SCOPE_LINK, Protocol: Protocol,
	}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("adding route %s dev %s table %d: %w", HostPrefix(addr), link.Attrs().Name, d.Table, err)
	}
	if d.Kind == KindTable {
		if err := ensureRule(d.dstRule(addr)); err != nil {
			return err
		}
		old := d.anyIifDstRule(addr)
		return deleteRules(func(k netlink.Rule) bool { return old.matches(k) })
	}
	return nil
}

// RemoveHostRoute undoes AddHostRoute; what is already gone is not an error.
func (d *Domain) RemoveHostRoute(addr netip.Addr) error {
	var errs []error
	r := &netlink.Route{Dst: IPNet(HostPrefix(addr)), Table: d.Table, Protocol: Protocol}
	if err := netlink.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
		errs = append(errs, fmt.Errorf("deleting route %s table %d: %w", HostPrefix(addr), d.Table, err))
	}
	if d.Kind == KindTable {
		dr, old := d.dstRule(addr), d.anyIifDstRule(addr)
		errs = append(errs, deleteRules(func(k netlink.Rule) bool { return dr.matches(k) || old.matches(k) }))
	}
	return errors.Join(errs...)
}

// ErrOverlap is returned when table routing is asked to hold an address
// another VPC already holds on this node.
var ErrOverlap = errors.New("address already in use by another VPC on this node")

// ClaimAddresses fails, wrapping ErrOverlap, when another VPC's table on
// this node already routes one of addrs to the node's own traffic. With
// table routing the node has one `to <address>` rule per address, so the
// node's packets to an address two VPCs share (its replies to either
// workload) would all reach one of them; vrf routing keeps the VPCs apart.
func (d *Domain) ClaimAddresses(addrs []netip.Addr) error {
	if d.Kind != KindTable {
		return nil
	}
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			return fmt.Errorf("listing rules: %w", err)
		}
		for _, k := range rules {
			if k.Priority != DstPriority || k.Table == d.Table || int(k.Protocol) != Protocol {
				continue
			}
			dst, _ := PrefixOf(k.Dst)
			for _, a := range addrs {
				if dst == HostPrefix(a) {
					return fmt.Errorf("%w: %s is routed to table %d; with \"routing\": \"table\" the node's replies to an address two VPCs share reach only one of them, so give the VPCs distinct addresses on this node or use \"routing\": \"vrf\" (needs CONFIG_NET_VRF)", ErrOverlap, a, k.Table)
				}
			}
		}
	}
	return nil
}

// Verify reports what differs between the kernel and a domain that holds
// link with the given workload addresses and gateways; nil when nothing
// does.
func (d *Domain) Verify(link netlink.Link, addrs, gateways []netip.Addr) error {
	var diffs []string
	routes, err := tableRoutes(d.Table)
	if err != nil {
		return fmt.Errorf("listing table %d: %w", d.Table, err)
	}
	has := func(dst netip.Prefix, typ int, linkIndex int) bool {
		for _, r := range routes {
			if p, ok := PrefixOf(r.Dst); ok && p == dst && r.Type == typ && (linkIndex == 0 || r.LinkIndex == linkIndex) {
				return true
			}
		}
		return false
	}
	for _, def := range []string{"0.0.0.0/0", "::/0"} {
		if !has(netip.MustParsePrefix(def), unix.RTN_UNREACHABLE, 0) {
			diffs = append(diffs, fmt.Sprintf("table %d lacks unreachable %s", d.Table, def))
		}
	}
	for _, a := range addrs {
		if !has(HostPrefix(a), unix.RTN_UNICAST, link.Attrs().Index) {
			diffs = append(diffs, fmt.Sprintf("table %d lacks route %s dev %s", d.Table, HostPrefix(a), link.Attrs().Name))
		}
	}
	var want []rule
	switch {
	case d.Kind == KindVRF && d.Device == "":
		diffs = append(diffs, fmt.Sprintf("VRF device %s of VPC %s is missing (its table %d is not)", DeviceName(d.VPC), d.VPC, d.Table))
	case d.Kind == KindVRF:
		dev, err := netlinksafe.LinkByName(d.Device)
		if err != nil || link.Attrs().MasterIndex != dev.Attrs().Index {
			diffs = append(diffs, fmt.Sprintf("%s is not enslaved to VRF %s", link.Attrs().Name, d.Device))
		}
	default:
		for _, gw := range gateways {
			if !has(HostPrefix(gw), unix.RTN_LOCAL, link.Attrs().Index) {
				diffs = append(diffs, fmt.Sprintf("table %d lacks local %s dev %s", d.Table, gw, link.Attrs().Name))
			}
		}
		want = d.iifRules(link.Attrs().Name)
		for _, a := range addrs {
			want = append(want, d.dstRule(a))
		}
	}
	for _, r := range want {
		ok, err := ruleExists(r)
		if err != nil {
			return err
		}
		if !ok {
			diffs = append(diffs, "missing "+r.String())
		}
	}
	front, err := localRuleInFront()
	if err != nil {
		return err
	}
	if front != "" {
		diffs = append(diffs, front)
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

// ProbeVRF reports ErrNoVRF when the kernel cannot create VRF devices. It
// creates and deletes a VRF device that is never brought up.
func ProbeVRF(probeName string) error {
	vrf := &netlink.Vrf{LinkAttrs: netlink.LinkAttrs{Name: probeName}, Table: TableMin - 1}
	if err := netlink.LinkAdd(vrf); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return ErrNoVRF
		}
		if errors.Is(err, unix.EEXIST) {
			return nil // a concurrent probe created it, so VRF works
		}
		return fmt.Errorf("probing VRF support: %w", err)
	}
	_ = netlink.LinkDel(vrf)
	return nil
}
