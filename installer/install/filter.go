package install

import (
	"fmt"

	"github.com/galactic-cni/galactic/pkg/filter"
)

// removeFilter deletes galactic's nftables tables (inet and arp) from the
// node's network namespace. Uninstall runs it after the DaemonSet is gone, so no
// galactic-gc or galactic-router pass puts the table back. Best effort,
// like the drain: a failure is printed and uninstall goes on.
func (o Options) removeFilter() {
	out := o.out()
	if o.DryRun {
		fmt.Fprintf(out, "would remove nftables tables inet %s and arp %s\n", filter.TableName, filter.TableName)
		return
	}
	if err := filter.New().Delete(); err != nil {
		fmt.Fprintf(out, "removing nftables tables inet %s and arp %s failed, uninstalling anyway: %v\n", filter.TableName, filter.TableName, err)
		return
	}
	fmt.Fprintf(out, "removed nftables tables inet %s and arp %s\n", filter.TableName, filter.TableName)
}
