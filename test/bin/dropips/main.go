// Command dropips is a chained CNI plugin for tests: ADD passes prevResult
// on without its IPs, as a misbehaving plugin between galactic-cni and
// galactic-bgp would; the other verbs do nothing.
package main

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

func add(args *skel.CmdArgs) error {
	var conf types.PluginConf
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		return err
	}
	if err := version.ParsePrevResult(&conf); err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return fmt.Errorf("dropips needs a prevResult")
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return err
	}
	res.IPs = nil
	res.Routes = nil
	return types.PrintResult(res, conf.CNIVersion)
}

func nothing(*skel.CmdArgs) error { return nil }

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: nothing, Check: nothing, Status: nothing, GC: nothing},
		version.All, "dropips (test helper)")
}
