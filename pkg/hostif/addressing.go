package hostif

import (
	"net/netip"
)

var (
	linkLocalGateway4 = netip.MustParseAddr("169.254.0.1")
	linkLocalGateway6 = netip.MustParseAddr("fe80::1")
)

// Gateway is the host-side address a workload address p reaches its VPC
// through: the first usable address of p's subnet, the next one when that
// is the workload's own. A /31 (/127) uses the other address of the pair; a
// /32 (/128) has no room, so it uses a link-local gateway (169.254.0.1 or
// fe80::1) that the workload reaches on-link.
func Gateway(p netip.Prefix) netip.Addr {
	addr := p.Addr()
	network := p.Masked().Addr()
	switch p.Bits() {
	case addr.BitLen():
		if addr.Is4() {
			return linkLocalGateway4
		}
		return linkLocalGateway6
	case addr.BitLen() - 1:
		if network == addr {
			return network.Next()
		}
		return network
	}
	gw := network.Next()
	if gw == addr {
		gw = gw.Next()
	}
	return gw
}

// Gateways are the distinct gateways of addrs, in order.
func Gateways(addrs []netip.Prefix) []netip.Addr {
	var gws []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, p := range addrs {
		gw := Gateway(p)
		if !seen[gw] {
			seen[gw] = true
			gws = append(gws, gw)
		}
	}
	return gws
}

// Default is a workload's default route of one family.
type Default struct {
	Dst netip.Prefix
	Via netip.Addr
}

// Defaults are the workload's default routes: one per family, via the
// gateway of that family's first address.
func Defaults(addrs []netip.Prefix) []Default {
	var ds []Default
	var have4, have6 bool
	for _, p := range addrs {
		if (p.Addr().Is4() && have4) || (p.Addr().Is6() && have6) {
			continue
		}
		dst := netip.MustParsePrefix("0.0.0.0/0")
		if p.Addr().Is4() {
			have4 = true
		} else {
			have6 = true
			dst = netip.MustParsePrefix("::/0")
		}
		ds = append(ds, Default{Dst: dst, Via: Gateway(p)})
	}
	return ds
}

// Routes are the container routes of a workload's interface: its default
// routes (Defaults) when it is the pod's first attachment, and otherwise
// one route per network of its addresses via that address's gateway, so
// a pod's further attachments reach their own VPCs and nothing else.
func Routes(addrs []netip.Prefix, secondary bool) []Default {
	if !secondary {
		return Defaults(addrs)
	}
	var rs []Default
	seen := map[netip.Prefix]bool{}
	for _, p := range addrs {
		if p.Bits() == p.Addr().BitLen() || seen[p.Masked()] {
			continue
		}
		seen[p.Masked()] = true
		rs = append(rs, Default{Dst: p.Masked(), Via: Gateway(p)})
	}
	return rs
}
