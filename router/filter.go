package router

import (
	"net/netip"

	"github.com/galactic-cni/galactic/pkg/filter"
)

// syncFilter makes the packet filter's VTEP sets equal to the next hops
// of the remote routes installed (vteps), so VXLAN is decapsulated only
// from those, and restores galactic's nftables table if another agent
// removed it. Called with the node lock held; false when it failed.
func (ks *kernelStage) syncFilter(vteps []netip.Addr) bool {
	res, err := filter.New().SetVTEPs(vteps)
	if err != nil {
		ks.log.Error("packet filter: VTEP sets", "error", err)
		return false
	}
	if res.Rebuilt || res.Added > 0 || res.Removed > 0 {
		ks.log.Info("packet filter: VTEP sets", "rebuilt", res.Rebuilt, "added", res.Added, "removed", res.Removed, "vteps", len(vteps))
	}
	return true
}
