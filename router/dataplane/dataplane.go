// Package dataplane programs what galactic-router installs in a node's
// kernel for one VPC: a VXLAN device in the VPC's routing domain and, for
// every remote prefix, an onlink route via the remote VTEP with the remote
// router MAC as a permanent neighbour and FDB entry (the way an EVPN L3VNI
// is installed). Every route and rule carries Protocol, so a restarted
// router finds its own state and an operator can list it
// (`ip route show table all proto 150`).
//
// Changes are planned from a Kernel read without the node lock and run
// (Plan.Apply, RemoveVPC) with it held (state.Lock), as galactic-cni does,
// so a domain galactic-cni removes and the VXLAN device never race.
package dataplane

import (
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

// Device is a VPC's VXLAN device as found or made.
type Device struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
}

// Devices lists the VXLAN devices galactic-router made, by VPC (from their
// alias).
func Devices() (map[string]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	return devicesIn(links), nil
}

func devicesIn(links []netlink.Link) map[string]string {
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
	return out
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
func (k *Kernel) Installed(vpc string, d *routing.Domain) []Remote {
	l := k.Links[routing.VXLANDeviceName(vpc)]
	if l == nil {
		return nil
	}
	macs := map[netip.Addr]net.HardwareAddr{}
	for _, n := range k.Neighs[l.Attrs().Index] {
		if ip, ok := netip.AddrFromSlice(n.IP); ok {
			macs[ip] = n.HardwareAddr
		}
	}
	var out []Remote
	for _, r := range k.Routes[d.Table] {
		pfx, gw := r.Prefix, r.Gw
		if !pfx.IsValid() || r.Protocol != Protocol || r.LinkIndex != l.Attrs().Index || !gw.IsValid() {
			continue
		}
		mac := macs[gw]
		if mac == nil {
			mac = macs[gw.Unmap()]
		}
		out = append(out, Remote{Prefix: pfx, NextHop: gw.Unmap(), RouterMAC: mac})
	}
	return out
}
