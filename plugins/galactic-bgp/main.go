// Command galactic-bgp is the last plugin of a galactic network: ADD
// publishes the container's host prefixes in this node's BGPAdvertisement
// for the attachment and deletes other nodes' leftovers of it; DEL releases
// the entry and deletes the advertisement with its last live entry.
package main

import (
	"os"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/liveness"
	"github.com/galactic-cni/galactic/pkg/settings"
)

// buildVersion is set at link time (-ldflags "-X main.buildVersion=...").
var buildVersion = "dev"

func main() {
	var requests atomic.Int64
	p := &plugin{
		getenv:      os.Getenv,
		stdout:      os.Stdout,
		now:         time.Now,
		live:        liveness.Netns,
		connect:     func(n settings.Node) (advert.API, error) { return connectCounting(n, &requests) },
		apiRequests: requests.Load,
		timeouts:    defaultTimeouts,
	}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    p.cmdAdd,
		Del:    p.cmdDel,
		Check:  p.cmdCheck,
		Status: p.cmdStatus,
		GC:     p.cmdGC,
	}, version.All, "galactic-bgp "+buildVersion)
}
