package advert

import (
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// HostPrefixes returns the host prefix of each address (/32 for IPv4, /128
// for IPv6), sorted and deduplicated. Invalid addresses are skipped.
func HostPrefixes(ips []net.IP) []v1alpha1.Prefix {
	var out []v1alpha1.Prefix
	for _, ip := range ips {
		addr, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		addr = addr.Unmap()
		out = append(out, v1alpha1.Prefix(netip.PrefixFrom(addr, addr.BitLen()).String()))
	}
	return SortPrefixes(out)
}

// Union is the sorted, deduplicated union of the entries' prefixes: what
// spec.prefixes must say.
func Union(entries []v1alpha1.ContainerEntry) []v1alpha1.Prefix {
	var all []v1alpha1.Prefix
	for _, e := range entries {
		all = append(all, e.Prefixes...)
	}
	return SortPrefixes(all)
}

// SortPrefixes sorts prefixes in address order (IPv4 first) and drops
// duplicates, comparing canonical forms so "fd20::05/128" and
// "fd20::5/128" are one prefix. It returns nil for an empty result.
func SortPrefixes(ps []v1alpha1.Prefix) []v1alpha1.Prefix {
	type parsed struct {
		p  netip.Prefix
		ok bool
		s  string
	}
	items := make([]parsed, 0, len(ps))
	for _, s := range ps {
		p, err := netip.ParsePrefix(string(s))
		if err != nil {
			// The CRD rejects these; keep them visible rather than guess.
			items = append(items, parsed{s: string(s)})
			continue
		}
		items = append(items, parsed{p: p, ok: true, s: p.String()})
	}
	slices.SortFunc(items, func(a, b parsed) int {
		switch {
		case a.ok != b.ok:
			if a.ok {
				return -1
			}
			return 1
		case !a.ok:
			return strings.Compare(a.s, b.s)
		}
		if c := a.p.Addr().Compare(b.p.Addr()); c != 0 {
			return c
		}
		return a.p.Bits() - b.p.Bits()
	})
	var out []v1alpha1.Prefix
	for i, it := range items {
		if i > 0 && items[i-1].s == it.s {
			continue
		}
		out = append(out, v1alpha1.Prefix(it.s))
	}
	return out
}
