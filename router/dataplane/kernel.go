package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/routing"
)

// Kernel is what one pass reads of the node's kernel: one dump per kind
// (routes, links, IPv4 addresses, neighbours, FDB, rules), grouped by table
// and by device, so a pass over any number of VPCs reads each object once.
type Kernel struct {
	Routes  map[int][]Route
	Markers map[netip.Prefix]int
	Links   map[string]netlink.Link
	// Neighs and FDB are the permanent entries, by device index.
	Neighs map[int][]netlink.Neigh
	FDB    map[int][]netlink.Neigh
	Rules  map[int][]netlink.Rule
	// MTU is the MTU of the interface holding the underlay address.
	MTU    int
	MTUErr error
	// Objects counts what the dumps returned.
	Objects int
	// tables are the tables whose routes were read, nil when all were.
	tables map[int]bool
}

// Read dumps the kernel state the router works on.
func (p Plane) Read() (*Kernel, error) { return p.read(true) }

// ReadDevices is Read but for routes, of which it reads only the domains'
// markers (a dump the kernel filters by galactic-cni's protocol): what
// planning devices needs. ReadTables adds the routes of the tables whose
// routes are planned, so a pass for a few VPCs does not hold every table.
func (p Plane) ReadDevices() (*Kernel, error) { return p.read(false) }

func (p Plane) read(routes bool) (*Kernel, error) {
	k := &Kernel{
		Routes: map[int][]Route{}, Links: map[string]netlink.Link{},
		Neighs: map[int][]netlink.Neigh{}, FDB: map[int][]netlink.Neigh{}, Rules: map[int][]netlink.Rule{},
	}
	ms, err := dumpStrict(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: netlink.RouteProtocol(routing.Protocol)},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("listing the domains' markers: %w", err)
	}
	k.Markers = routing.Markers(ms)
	k.Objects += len(ms)
	if routes {
		n, err := dumpRoutes([]int{0}, func(r Route) { k.Routes[r.Table] = append(k.Routes[r.Table], r) })
		if err != nil {
			return nil, fmt.Errorf("listing routes: %w", err)
		}
		k.Objects += n
	} else {
		k.tables = map[int]bool{}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	byIndex := make(map[int]netlink.Link, len(links))
	for _, l := range links {
		k.Links[l.Attrs().Name] = l
		byIndex[l.Attrs().Index] = l
	}
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.Underlay && byIndex[a.LinkIndex] != nil {
			k.MTU = byIndex[a.LinkIndex].Attrs().MTU
		}
	}
	if k.MTU == 0 {
		k.MTUErr = fmt.Errorf("no interface holds the underlay address %s", p.Underlay)
	}
	k.Objects += len(links) + len(addrs)
	if err := k.readNeighbours(); err != nil {
		return nil, err
	}
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			return nil, fmt.Errorf("listing rules: %w", err)
		}
		k.Objects += len(rules)
		k.Rules[f] = rules
	}
	return k, nil
}

// dumpAttempts bounds how often a route dump the kernel interrupted (a
// table changed meanwhile) is started again; the last one is kept.
const dumpAttempts = 5

// Domain is routing.Find over the read.
func (k *Kernel) Domain(vpc string) (*routing.Domain, error) {
	return routing.FindIn(vpc, k.Markers, k.Links[routing.DeviceName(vpc)])
}

// Devices is the package's Devices over the read.
func (k *Kernel) Devices() map[string]string {
	links := make([]netlink.Link, 0, len(k.Links))
	for _, l := range k.Links {
		links = append(links, l)
	}
	return devicesIn(links)
}

// ReadTables adds the routes of tables a ReadDevices did not read yet.
func (k *Kernel) ReadTables(tables []int) error {
	if k.tables == nil {
		return nil
	}
	var missing []int
	for _, t := range tables {
		if !k.tables[t] {
			missing = append(missing, t)
		}
	}
	more, err := Plane{}.ReadRoutes(missing)
	if err != nil {
		return err
	}
	for t, rs := range more.Routes {
		k.Routes[t] = rs
	}
	for _, t := range missing {
		k.tables[t] = true
	}
	k.Objects += more.Objects
	return nil
}

// dumpStrict is a route dump the kernel filters (strict checking), retried
// while the kernel interrupts it.
func dumpStrict(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	h, err := strictHandle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	for attempt := 1; ; attempt++ {
		rs, err := h.RouteListFiltered(family, filter, mask)
		if !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == dumpAttempts {
			if errors.Is(err, netlink.ErrDumpInterrupted) {
				err = nil
			}
			return rs, err
		}
	}
}

// strictHandle is a netlink handle whose dumps the kernel filters.
func strictHandle() (*netlink.Handle, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	if err := h.SetStrictCheck(true); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// ReadRoutes reads only the given tables' routes, for a pass whose
// changes are routes of VPCs whose devices stand; the kernel filters those
// dumps (strict checking), so the cost follows those tables, not the
// node's. Their devices' neighbours and FDB entries are the caller's to
// fill in from what it last wrote (Plan.Neighs and Plan.FDB).
func (p Plane) ReadRoutes(tables []int) (*Kernel, error) {
	k := &Kernel{Routes: map[int][]Route{}, Neighs: map[int][]netlink.Neigh{}, FDB: map[int][]netlink.Neigh{}, tables: map[int]bool{}}
	for _, t := range tables {
		k.tables[t] = true
	}
	n, err := dumpRoutes(tables, func(r Route) { k.Routes[r.Table] = append(k.Routes[r.Table], r) })
	if err != nil {
		return nil, err
	}
	k.Objects = n
	return k, nil
}

// Forget lets go of the routes of tables already planned; they are not
// read again.
func (k *Kernel) Forget(tables []int) {
	for _, t := range tables {
		delete(k.Routes, t)
	}
}

// readNeighbours keeps every device's permanent neighbours and FDB entries.
func (k *Kernel) readNeighbours() error {
	for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6, unix.AF_BRIDGE} {
		ns, err := netlink.NeighList(0, f)
		if err != nil {
			return fmt.Errorf("listing neighbours: %w", err)
		}
		k.Objects += len(ns)
		into := k.Neighs
		if f == unix.AF_BRIDGE {
			into = k.FDB
		}
		for _, e := range ns {
			if e.State&netlink.NUD_PERMANENT != 0 {
				into[e.LinkIndex] = append(into[e.LinkIndex], e)
			}
		}
	}
	return nil
}
