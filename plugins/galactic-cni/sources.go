package main

import (
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/netconf"
)

// parseAllowedSources validates allowedSourcePrefixes: the sources a
// router or NAT appliance may send from beyond its own addresses. Each is
// a network prefix (no host bits, no zone), listed once; "0.0.0.0/0" or
// "::/0" lifts the source check for that family. field names the list in
// errors.
func parseAllowedSources(list []string, field string) ([]netip.Prefix, *types.Error) {
	var out []netip.Prefix
	seen := map[netip.Prefix]int{}
	for i, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, netconf.InvalidConfig(fmt.Sprintf(`%s[%d] %q is not a CIDR: use a network prefix such as "192.168.0.0/16" or "fd00:1::/64"`, field, i, s))
		}
		if p.Masked() != p {
			return nil, netconf.InvalidConfig(fmt.Sprintf(`%s[%d] %q has host bits set: use the network prefix %q`, field, i, s, p.Masked().String()))
		}
		if j, dup := seen[p]; dup {
			return nil, netconf.InvalidConfig(fmt.Sprintf("%s[%d] %q repeats %s[%d]: list each prefix once", field, i, s, field, j))
		}
		seen[p] = i
		out = append(out, p)
	}
	return out, nil
}
