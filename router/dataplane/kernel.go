package dataplane

import (
	"errors"
	"fmt"
	"maps"
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
	Routes  map[int][]netlink.Route
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
}

// Read dumps the kernel state the router works on.
func (p Plane) Read() (*Kernel, error) {
	k := &Kernel{
		Routes: map[int][]netlink.Route{}, Links: map[string]netlink.Link{},
		Neighs: map[int][]netlink.Neigh{}, FDB: map[int][]netlink.Neigh{}, Rules: map[int][]netlink.Rule{},
	}
	routes, err := readAllRoutes(k)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	k.Markers = map[netip.Prefix]int{}
	for _, rs := range k.Routes {
		maps.Copy(k.Markers, routing.Markers(rs))
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
	k.Objects = routes + len(links) + len(addrs)
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

// readAllRoutes dumps every table's routes into k.Routes as they are
// parsed: no list of the whole dump is built first, so a node of many
// routes holds them once, not twice, while it reads.
func readAllRoutes(k *Kernel) (n int, err error) {
	for attempt := 1; ; attempt++ {
		k.Routes, n = map[int][]netlink.Route{}, 0
		err = netlink.RouteListFilteredIter(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE, func(r netlink.Route) bool {
			k.Routes[r.Table] = append(k.Routes[r.Table], r)
			n++
			return true
		})
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return n, err
		}
		if attempt == dumpAttempts {
			return n, nil
		}
	}
}

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

// ReadRoutes reads only the given tables' routes, for a pass whose
// changes are routes of VPCs whose devices stand; the kernel filters those
// dumps (strict checking), so the cost follows those tables, not the
// node's. Their devices' neighbours and FDB entries are the caller's to
// fill in from what it last wrote (Plan.Neighs and Plan.FDB).
func (p Plane) ReadRoutes(tables []int) (*Kernel, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := h.SetStrictCheck(true); err != nil {
		return nil, err
	}
	k := &Kernel{Routes: map[int][]netlink.Route{}, Neighs: map[int][]netlink.Neigh{}, FDB: map[int][]netlink.Neigh{}}
	for _, t := range tables {
		rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: t}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("listing table %d: %w", t, err)
		}
		k.Routes[t] = rs
		k.Objects += len(rs)
	}
	return k, nil
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
