package bench

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
)

// The workload every chain attaches: dual stack, as the design's example.
var (
	benchAddresses = []string{"10.20.0.5/24", "fd20::5/64"}
	benchMTU       = 1450
)

// benchSubnets numbers the VPCs that share a bench node with another VPC
// (0 for the rest): in table mode galactic-cni refuses an address that
// another VPC on the node already routes.
var benchSubnets = map[string]int{"lath": 1, "latc": 2, "apih": 1}

// addressesOf is the workload's addresses in vpc: benchAddresses in the
// VPC's own subnets.
func addressesOf(vpc string) []string {
	i := benchSubnets[vpc]
	if i == 0 {
		return benchAddresses
	}
	return []string{fmt.Sprintf("10.20.%d.5/24", i), fmt.Sprintf("fd20:%x::5/64", i)}
}

const ifName = "net0"

// objectNamespace holds the chain latency section's VPCAttachments.
const objectNamespace = "bench-lat"

// Chain rows of the latency table.
const (
	ChainReference = "reference: tap + static IPAM"
	ChainGalactic  = "galactic chain, handoff off"
	ChainHandoff   = "galactic chain, handoff on"
	ChainObjects   = "galactic chain, VPCAttachment, handoff off"
	// ChainObjectsHandoff is ChainHandoff's twin: both galactic-cni's make
	// their API client for the lease, so the two differ by the GET alone.
	ChainObjectsHandoff = "galactic chain, VPCAttachment, handoff on"
	ChainCNIOnly        = "galactic-cni alone (no API)"
	ChainFloor          = "floor: loopback"
)

// ChainResult is one conflist's ADD and DEL latency through cnitool.
type ChainResult struct {
	Name     string
	Plugins  string
	Add, Del Sample
	// Skipped says why the row was not measured.
	Skipped string
}

// chain is one network config list measured in the loop.
type chain struct {
	result   *ChainResult
	network  string
	conf     map[string]any
	c        *harness.Netns
	vpc, att string
}

func handoffConf(enabled bool) map[string]any {
	if enabled {
		return map[string]any{"enabled": true, "waitSeconds": 5, "leaseSeconds": 15}
	}
	return map[string]any{"enabled": false}
}

func galacticConf(network, vpc, att string, handoff bool, bgp bool) map[string]any {
	plugins := []any{map[string]any{
		"type": "galactic-cni", "vpc": vpc, "attachment": att, "mode": "tap", "routing": "table",
		"addresses": addressesOf(vpc), "mtu": benchMTU, "handoff": handoffConf(handoff),
	}}
	if bgp {
		plugins = append(plugins, map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": att})
	}
	return map[string]any{"cniVersion": "1.1.0", "name": network, "plugins": plugins}
}

// objectConf is galacticConf naming VPCAttachment att of namespace ns
// instead of an inline attachment: the addresses, VNI and VPC come from
// the object.
func objectConf(network, ns, att string, handoff, bgp bool) map[string]any {
	plugins := []any{map[string]any{
		"type": "galactic-cni", "namespace": ns, "attachment": att, "mode": "tap", "routing": "table",
		"mtu": benchMTU, "handoff": handoffConf(handoff),
	}}
	if bgp {
		plugins = append(plugins, map[string]any{"type": "galactic-bgp", "namespace": ns, "attachment": att})
	}
	return map[string]any{"cniVersion": "1.1.0", "name": network, "plugins": plugins}
}

// The tenant of the object-backed chains: its VPC has subnets of its own,
// since in table mode galactic-cni refuses an address that another VPC on
// the node routes.
var (
	objectNetworks  = []v1alpha1.CIDR{"10.20.3.0/24", "fd20:3::/64"}
	objectAddresses = [][]string{{"10.20.3.5", "fd20:3::5"}, {"10.20.3.6", "fd20:3::6"}}
)

// objectChain makes, in namespace ns, a VPC that galactic-controller
// allocates, a resident attachment of it attached on n (undone when the
// section ends) and attachments atts for the loop, and returns them.
func (b *bench) objectChain(n *node, ns string, atts ...string) ([]*v1alpha1.VPCAttachment, error) {
	if err := b.startController(); err != nil {
		return nil, err
	}
	t, err := b.tenant(b.env.API, b.env.Kube, ns, "obj", objectNetworks...)
	if err != nil {
		return nil, err
	}
	if _, err := t.attach(b.ctx, "resident"); err != nil {
		return nil, err
	}
	network := "resident-" + ns
	if err := n.WriteConflistFile(objectConf(network, ns, "resident", false, false)); err != nil {
		return nil, err
	}
	c, err := b.container()
	if err != nil {
		return nil, err
	}
	if _, err := b.cnitool(n, "add", network, c, ifName); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() { _, _ = b.cnitool(n, "del", network, c, ifName) })
	var out []*v1alpha1.VPCAttachment
	for i, att := range atts {
		a, err := t.attach(b.ctx, att, objectAddresses[i]...)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// referenceConf is the upstream tap plugin with the static IPAM plugin:
// a tap, two addresses and a default route, and nothing remote. The IPv6
// address has no gateway, so the plugin does not wait for DAD on a tap
// that has no carrier.
func referenceConf(network string) map[string]any {
	return map[string]any{"cniVersion": "1.1.0", "name": network, "plugins": []any{map[string]any{
		"type": "tap", "mtu": benchMTU,
		"ipam": map[string]any{
			"type": "static",
			"addresses": []any{
				map[string]any{"address": benchAddresses[0], "gateway": "10.20.0.1"},
				map[string]any{"address": benchAddresses[1]},
			},
			"routes": []any{map[string]any{"dst": "0.0.0.0/0"}},
		},
	}}}
}

// chainLatency runs ADD then DEL of every chain, one workload at a time,
// interleaving the chains (in a rotating order) so that load from other
// processes on the machine falls on all of them alike.
func (b *bench) chainLatency() error {
	n, err := b.newNode("lat")
	if err != nil {
		return err
	}
	chains := []*chain{
		{result: &ChainResult{Name: ChainReference, Plugins: "tap, static"}, network: "bench-ref", conf: referenceConf("bench-ref")},
		{result: &ChainResult{Name: ChainGalactic, Plugins: "galactic-cni, galactic-bgp"}, network: "bench-galactic", conf: galacticConf("bench-galactic", "lat", "lat-off", false, true), vpc: "lat", att: "lat-off"},
		{result: &ChainResult{Name: ChainHandoff, Plugins: "galactic-cni, galactic-bgp"}, network: "bench-handoff", conf: galacticConf("bench-handoff", "lath", "lat-on", true, true), vpc: "lath", att: "lat-on"},
		{result: &ChainResult{Name: ChainCNIOnly, Plugins: "galactic-cni"}, network: "bench-cni", conf: galacticConf("bench-cni", "latc", "lat-cni", false, false), vpc: "latc", att: "lat-cni"},
		{result: &ChainResult{Name: ChainObjects, Plugins: "galactic-cni, galactic-bgp"}, network: "bench-objects", conf: objectConf("bench-objects", objectNamespace, "lat-obj", false, true)},
		{result: &ChainResult{Name: ChainObjectsHandoff, Plugins: "galactic-cni, galactic-bgp"}, network: "bench-objects-on", conf: objectConf("bench-objects-on", objectNamespace, "lat-obj-on", true, true)},
		{result: &ChainResult{Name: ChainFloor, Plugins: "loopback"}, network: "bench-floor", conf: map[string]any{"cniVersion": "1.1.0", "name": "bench-floor", "plugins": []any{map[string]any{"type": "loopback"}}}},
	}
	// A resident attachment keeps each VPC's routing domain on the node, as
	// on a node that already runs workloads of the VPC: the loop measures
	// attaching to a VPC, not creating it.
	for _, vpc := range []string{"lat", "lath", "latc"} {
		network := "resident-" + vpc
		if err := n.WriteConflistFile(galacticConf(network, vpc, "resident", false, false)); err != nil {
			return err
		}
		c, err := b.container()
		if err != nil {
			return err
		}
		if _, err := b.cnitool(n, "add", network, c, ifName); err != nil {
			return err
		}
		defer b.cnitool(n, "del", network, c, ifName)
	}
	// The VPC and the attachments exist before the loop, as a VM's do
	// before its VMM starts: the loop measures ADD and DEL, not allocation.
	objs, err := b.objectChain(n, objectNamespace, "lat-obj", "lat-obj-on")
	if err != nil {
		return err
	}
	for _, ch := range chains {
		for i, name := range []string{ChainObjects, ChainObjectsHandoff} {
			if ch.result.Name == name {
				ch.vpc, ch.att = objs[i].Status.Dataplane.VPC, objs[i].Status.Dataplane.Attachment
			}
		}
	}
	var active []*chain
	for _, ch := range chains {
		if err := n.WriteConflistFile(ch.conf); err != nil {
			return err
		}
		if ch.c, err = b.container(); err != nil {
			return err
		}
		// One ADD and DEL decide whether the chain can run here at all.
		if _, err := b.cnitool(n, "add", ch.network, ch.c, ifName); err != nil {
			if ch.result.Name == ChainHandoff && strings.Contains(err.Error(), "not available in this build") {
				ch.result.Skipped = `this build of galactic-cni refuses "handoff": {"enabled": true}: the lease is not wired into ADD and DEL yet`
				_, _ = b.cnitool(n, "del", ch.network, ch.c, ifName)
				b.res.Chains = append(b.res.Chains, ch.result)
				b.say("%s: skipped: %s", ch.result.Name, ch.result.Skipped)
				continue
			}
			return err
		}
		if _, err := b.cnitool(n, "del", ch.network, ch.c, ifName); err != nil {
			return err
		}
		active = append(active, ch)
		b.res.Chains = append(b.res.Chains, ch.result)
	}
	total := b.opts.Warmup + b.opts.Iterations
	for i := range total {
		for j := range active {
			ch := active[(i+j)%len(active)]
			add, err := b.cnitool(n, "add", ch.network, ch.c, ifName)
			if err != nil {
				return err
			}
			del, err := b.cnitool(n, "del", ch.network, ch.c, ifName)
			if err != nil {
				return err
			}
			if i >= b.opts.Warmup {
				ch.result.Add = append(ch.result.Add, add.Wall)
				ch.result.Del = append(ch.result.Del, del.Wall)
			}
		}
		if (i+1)%50 == 0 {
			b.say("chain latency: %d/%d iterations", i+1, total)
		}
	}
	for _, ch := range active {
		if ch.vpc != "" {
			if err := b.checkReleased(n, ch.vpc, ch.att); err != nil {
				return fmt.Errorf("%s: %w", ch.result.Name, err)
			}
		}
		b.say("%-32s ADD p50 %s  DEL p50 %s", ch.result.Name, ms(ch.result.Add.P50()), ms(ch.result.Del.P50()))
	}
	return nil
}

// checkReleased fails unless DEL left nothing of the attachment on the
// node: no advertisement, no record, no tap.
func (b *bench) checkReleased(n *node, vpc, att string) error {
	_, err := b.env.API.BGPAdvertisements(harness.Namespace).Get(b.ctx, names.Advertisement(vpc, att, n.Name), metav1.GetOptions{})
	if err == nil {
		return fmt.Errorf("advertisement of %s/%s left after DEL", vpc, att)
	}
	recs, err := state.NewStore(n.Settings.StateDir).List()
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.VPC == vpc && r.Attachment == att {
			return fmt.Errorf("record %s/%s left after DEL", r.ContainerID, r.IfName)
		}
	}
	if out, _ := n.Run("ip", "link", "show", names.HostInterface(names.ModeTap, vpc, att)); !strings.Contains(out, "does not exist") {
		return fmt.Errorf("tap of %s/%s left after DEL: %s", vpc, att, out)
	}
	return nil
}
