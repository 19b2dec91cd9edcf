package router

import (
	"net/netip"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/router/dataplane"
)

// syncFilter keeps the packet filter's VTEP sets equal to the next hops of
// the remote routes this pass installs, so VXLAN is decapsulated only from
// those, and restores galactic's nftables table if another agent removed
// it. Called with the node lock held.
func (d *Daemon) syncFilter(remotes map[string][]dataplane.Remote) {
	seen := map[netip.Addr]bool{}
	var vteps []netip.Addr
	for _, rs := range remotes {
		for _, r := range rs {
			if !seen[r.NextHop] {
				seen[r.NextHop] = true
				vteps = append(vteps, r.NextHop)
			}
		}
	}
	res, err := filter.SetVTEPs(vteps)
	if err != nil {
		d.log.Error("packet filter: VTEP sets", "error", err)
		return
	}
	if res.Rebuilt || res.Added > 0 || res.Removed > 0 {
		d.log.Info("packet filter: VTEP sets", "rebuilt", res.Rebuilt, "added", res.Added, "removed", res.Removed, "vteps", len(vteps))
	}
}
