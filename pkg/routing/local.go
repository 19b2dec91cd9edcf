package routing

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// isLocalLookup reports whether k is a plain `from all lookup local` rule,
// as the kernel creates at preference 0: no selector at all.
func isLocalLookup(k netlink.Rule) bool {
	return k.Table == unix.RT_TABLE_LOCAL && k.Src == nil && k.Dst == nil &&
		k.IifName == "" && k.OifName == "" && k.Mark == 0 && k.Mask == nil &&
		k.Tos == 0 && k.TunID == 0 && k.IPProto == 0 && k.Dport == nil &&
		k.Sport == nil && k.UIDRange == nil && k.Goto < 0 && !k.Invert &&
		k.SuppressPrefixlen < 0 && k.SuppressIfgroup < 0
}

// MoveLocalRule puts the node's `lookup local` rule behind galactic's
// rules, for IPv4 and IPv6: it adds `from all lookup local` at
// LocalPriority, then deletes the kernel's at preference 0. Until then the
// local table, which holds every address of the node, is consulted before
// a workload's `iif` or VRF rule, so a workload would reach the node's own
// addresses outside its VPC. The node's own traffic still finds them at
// LocalPriority, since none of galactic's rules match it.
//
// The move is node-wide and is never undone: other VPCs' domains and later
// ADDs rely on it, and putting the rule back in front would reopen the
// node's addresses to every workload. Adding first means the node never
// lacks a local rule. Calling it again changes nothing. Callers hold the
// node lock.
func MoveLocalRule() error {
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			return fmt.Errorf("listing rules: %w", err)
		}
		moved, first := false, false
		for _, k := range rules {
			if !isLocalLookup(k) {
				continue
			}
			switch k.Priority {
			case LocalPriority:
				moved = true
			case 0:
				first = true
			}
		}
		if !moved {
			k := netlink.NewRule()
			k.Family, k.Priority, k.Table, k.Protocol = f, LocalPriority, unix.RT_TABLE_LOCAL, Protocol
			if err := netlink.RuleAdd(k); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("adding rule %d: from all lookup local (family %d): %w", LocalPriority, f, err)
			}
		}
		if first {
			k := netlink.NewRule()
			k.Family, k.Priority, k.Table = f, 0, unix.RT_TABLE_LOCAL
			if err := netlink.RuleDel(k); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("deleting rule 0: from all lookup local (family %d), which lets workloads reach the node's own addresses: %w", f, err)
			}
		}
	}
	return nil
}

// localRuleInFront describes a `lookup local` rule that comes before
// galactic's rules; "" when there is none.
func localRuleInFront() (string, error) {
	for _, f := range families {
		rules, err := netlinksafe.RuleList(f)
		if err != nil {
			return "", fmt.Errorf("listing rules: %w", err)
		}
		for _, k := range rules {
			if isLocalLookup(k) && k.Priority <= IifPriority {
				v := "IPv4"
				if f == netlink.FAMILY_V6 {
					v = "IPv6"
				}
				return fmt.Sprintf("%s rule %d: from all lookup local precedes galactic's rules (%d), so workloads can reach the node's own addresses; the next ADD moves it to %d",
					v, k.Priority, IifPriority, LocalPriority), nil
			}
		}
	}
	return "", nil
}

// gatewayRoute is `local <gw> dev <link> table <table> proto 149`.
func (d *Domain) gatewayRoute(linkIndex int, gw netip.Addr) *netlink.Route {
	return &netlink.Route{
		LinkIndex: linkIndex, Dst: IPNet(HostPrefix(gw)), Table: d.Table,
		Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST, Protocol: Protocol,
	}
}

// AddGateway makes gw, a gateway address on link, answer workloads whose
// lookups end in the domain's table: their packets to gw and ARP for it.
// With the local rule moved behind galactic's rules, the node's local
// table is out of their reach, so table routing puts its own `local` route
// in the VPC's table. It is per interface (the kernel keeps one per
// device), so attachments of a VPC that share a gateway each have theirs,
// and it goes with its interface. With vrf routing the kernel already puts
// the local routes of a VRF member's addresses into the VRF's table.
func (d *Domain) AddGateway(link netlink.Link, gw netip.Addr) error {
	if d.Kind != KindTable {
		return nil
	}
	// Append: replace would take over the route of another interface.
	if err := netlink.RouteAppend(d.gatewayRoute(link.Attrs().Index, gw)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding local %s dev %s table %d: %w", gw, link.Attrs().Name, d.Table, err)
	}
	return nil
}

// RemoveGateways removes the gateway routes AddGateway added for the
// interface with index linkIndex; other interfaces keep theirs, even for
// the same address. What is already gone is not an error.
func (d *Domain) RemoveGateways(linkIndex int) error {
	if d.Kind != KindTable {
		return nil
	}
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Table: d.Table, LinkIndex: linkIndex}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil {
		return fmt.Errorf("listing table %d: %w", d.Table, err)
	}
	var errs []error
	for _, r := range routes {
		if r.Type != unix.RTN_LOCAL || int(r.Protocol) != Protocol {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting %s dev index %d table %d: %w", describe(r), linkIndex, d.Table, err))
		}
	}
	return errors.Join(errs...)
}
