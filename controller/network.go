package controller

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// maxNetworks is the CRD's limit, checked again here: the controller must
// not trust that every object passed the CRD's rules (an older CRD, a
// write that skipped them).
const maxNetworks = 8

// parseNetworks checks a VPC's spec.networks and returns them parsed: 1 to
// 8 networks in canonical CIDR notation that do not overlap. The error
// names the field and what to change.
func parseNetworks(networks []v1alpha1.CIDR) ([]netip.Prefix, error) {
	if len(networks) == 0 || len(networks) > maxNetworks {
		return nil, fmt.Errorf("spec.networks has %d networks: give 1 to %d", len(networks), maxNetworks)
	}
	nets := make([]netip.Prefix, 0, len(networks))
	for i, n := range networks {
		p, err := netip.ParsePrefix(string(n))
		if err != nil {
			return nil, fmt.Errorf("spec.networks[%d] %q is not a CIDR such as 10.20.0.0/16 or fd20::/48", i, n)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("spec.networks[%d] %q has host bits set: write it as %s", i, n, p.Masked())
		}
		for j, q := range nets {
			if p.Overlaps(q) {
				return nil, fmt.Errorf("spec.networks[%d] %s overlaps spec.networks[%d] %s: networks of a VPC must not overlap", i, p, j, q)
			}
		}
		nets = append(nets, p)
	}
	return nets, nil
}

// familyOf is the IPFamily of an address.
func familyOf(a netip.Addr) v1alpha1.IPFamily {
	if a.Is4() {
		return v1alpha1.IPv4
	}
	return v1alpha1.IPv6
}

// familiesOf are the families of nets, in the order they first appear.
func familiesOf(nets []netip.Prefix) []v1alpha1.IPFamily {
	var fams []v1alpha1.IPFamily
	for _, n := range nets {
		f := familyOf(n.Addr())
		if !containsFamily(fams, f) {
			fams = append(fams, f)
		}
	}
	return fams
}

func containsFamily(fams []v1alpha1.IPFamily, f v1alpha1.IPFamily) bool {
	for _, g := range fams {
		if g == f {
			return true
		}
	}
	return false
}

// networksOf are the networks of one family, in order.
func networksOf(nets []netip.Prefix, f v1alpha1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		if familyOf(n.Addr()) == f {
			out = append(out, n)
		}
	}
	return out
}

// networkOf is the network of nets that holds a.
func networkOf(nets []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, n := range nets {
		if n.Contains(a) {
			return n, true
		}
	}
	return netip.Prefix{}, false
}

// reserved says why a may not be given to an attachment in network n,
// "" when it may: the network address, the gateway (the network's next
// address, which galactic-cni configures on the host side: see
// pkg/hostif.Gateway) and, in IPv4, the broadcast address.
func reserved(n netip.Prefix, a netip.Addr) string {
	network := n.Addr()
	switch {
	case a == network:
		return "the network address of " + n.String()
	case a == network.Next():
		return "the gateway of " + n.String()
	case a.Is4() && a == lastAddr(n):
		return "the broadcast address of " + n.String()
	}
	return ""
}

// lastAddr is the highest address of n.
func lastAddr(n netip.Prefix) netip.Addr {
	b := n.Addr().AsSlice()
	for i := n.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// nextFree is the lowest address of n at or above from that may be given
// to an attachment and that taken does not report; ok is false when none
// is left. Its cost is bounded by the number of taken addresses it meets.
func nextFree(n netip.Prefix, from netip.Addr, taken func(netip.Addr) bool) (netip.Addr, bool) {
	a := n.Addr().Next().Next()
	if from.IsValid() && from.BitLen() == a.BitLen() && from.Compare(a) > 0 {
		a = from
	}
	for ; a.IsValid() && n.Contains(a); a = a.Next() {
		if reserved(n, a) != "" {
			continue
		}
		if !taken(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// usableCount describes how many addresses n has for attachments, for
// messages: "13" or "more than a million".
func usableCount(n netip.Prefix) string {
	hostBits := n.Addr().BitLen() - n.Bits()
	if hostBits > 20 {
		return "more than a million"
	}
	c := 1<<hostBits - 2
	if n.Addr().Is4() {
		c--
	}
	return fmt.Sprint(max(c, 0))
}

// joinPrefixes lists networks for messages.
func joinPrefixes(nets []netip.Prefix) string {
	s := make([]string, len(nets))
	for i, n := range nets {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}
