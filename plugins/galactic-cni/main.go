// Command galactic-cni is the master CNI plugin of a galactic network: it
// attaches a workload to its VPC with a host-side tap (VMs) or veth
// (containers) in the VPC's routing domain.
//
// Run without CNI_COMMAND as `galactic-cni available ...` or
// `galactic-cni unavailable ...`, it reports whether the holder of an
// attachment serves (docs/concepts/handoff-and-availability.md); as `galactic-cni release ...`
// and `galactic-cni promote ...` it hands a running VM's attachment over
// in a live migration (docs/concepts/live-migration.md).
package main

import (
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/liveness"
)

// buildVersion is set at link time (-ldflags "-X main.buildVersion=...").
var buildVersion = "dev"

// about is what a person who runs the plugin without CNI_COMMAND reads:
// the runtime runs the CNI verbs, a person or a VMM launcher the node
// subcommands.
const about = `: the master plugin of a galactic network (CNI verbs with CNI_COMMAND set)
usage: galactic-cni available|unavailable (--namespace NAMESPACE | --vpc VPC) --attachment ATTACHMENT --container ID [flags]
       galactic-cni release|promote (--namespace NAMESPACE | --vpc VPC) --attachment ATTACHMENT --container ID [flags]
Run "galactic-cni <command> -h" for a command's flags.`

// filterOff is set at link time, to "true", only by the benchmark's
// reference build (test/bench), which measures ADD and DEL without the
// packet filter. Nothing at run time selects it: not the node settings,
// the environment, a CNI config or a workload's arguments.
var filterOff string

func packetFilter() filter.Filter {
	if filterOff == "true" {
		return filter.Off()
	}
	return filter.New()
}

func main() {
	p := &plugin{
		getenv: os.Getenv,
		now:    time.Now,
		live:   liveness.Netns,
		filter: packetFilter(),
	}
	if isCommand(os.Getenv, os.Args) {
		os.Exit(p.runCommand(os.Args[1], os.Args[2:], os.Stdout, os.Stderr))
	}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    p.cmdAdd,
		Del:    p.cmdDel,
		Check:  p.cmdCheck,
		Status: p.cmdStatus,
		GC:     p.cmdGC,
	}, version.All, "galactic-cni "+buildVersion+about)
}
