package main

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/netconf"
)

// NetConf is the galactic-bgp stanza of a network config list.
type NetConf struct {
	types.PluginConf
	// Namespace and Attachment name a VPCAttachment, VPC and Attachment an
	// inline attachment, as the galactic-cni stanza before it does; none
	// of them, a conflist shared by every pod, whose annotations name
	// VPCAttachments.
	netconf.Attachment
	// VNI is an inline attachment's VPC's VXLAN network identifier
	// (1-16777215), the same on every node; absent means galactic-router
	// does not route it.
	VNI *int64 `json:"vni,omitempty"`
	// Announce is an inline attachment's policy: always (the default) or
	// whenAvailable.
	Announce string `json:"announce,omitempty"`
	// RuntimeConfig carries the pod's annotations, which name the pod's
	// VPCAttachments.
	RuntimeConfig netconf.RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// maxVNI is the largest 24-bit VXLAN network identifier.
const maxVNI = 1<<24 - 1

// routing is the validated vni and announce of an inline stanza.
func (n NetConf) routing() (advert.Routing, *types.Error) {
	var r advert.Routing
	if vni := n.VNI; vni != nil {
		if *vni < 1 || *vni > maxVNI {
			return r, netconf.InvalidConfig(fmt.Sprintf("vni %d is out of range: a VXLAN network identifier is 1-%d", *vni, maxVNI))
		}
		r.VNI = int32(*vni)
	}
	switch a := v1alpha1.Announce(n.Announce); a {
	case "", v1alpha1.AnnounceAlways:
		r.Announce = v1alpha1.AnnounceAlways
	case v1alpha1.AnnounceWhenAvailable:
		r.Announce = a
	default:
		return r, netconf.InvalidConfig(fmt.Sprintf("announce %q is not supported: use %q or %q", n.Announce, v1alpha1.AnnounceAlways, v1alpha1.AnnounceWhenAvailable))
	}
	return r, nil
}

// Config is a parsed stanza: the attachment, and for ADD and CHECK the
// previous plugin's result in the config's cniVersion with its addresses.
type Config struct {
	NetConf
	// Prev is the prevResult as the config's cniVersion parses it; nil
	// when the verb has none.
	Prev types.Result
	// IPs are Prev's addresses.
	IPs []net.IP
	// Routing is an inline stanza's validated vni and announce; a
	// VPCAttachment's come from galactic-cni's node record.
	Routing advert.Routing
	// Names is what the stanza or the pod names.
	Names netconf.Names
}

// parseConf decodes and validates a stanza. With needPrev (ADD, CHECK) a
// missing or malformed prevResult is an error; the other verbs ignore it.
// o says whether an attachment must be named, whether inline ones are
// refused, and the CNI_ARGS that give a pod's namespace. Every error is a
// CNI error that says what to fix.
func parseConf(data []byte, needPrev bool, o netconf.ResolveOptions) (*Config, *types.Error) {
	var c Config
	if err := json.Unmarshal(data, &c.NetConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "network config is not valid JSON for galactic-bgp: "+err.Error(), "")
	}
	o.Inline = []netconf.InlineField{
		{Name: "vni", Set: c.NetConf.VNI != nil, Replacement: "status.vni"},
		{Name: "announce", Set: c.NetConf.Announce != "", Replacement: "spec.announce"},
	}
	named, terr := netconf.Resolve(c.NetConf.Attachment, c.RuntimeConfig, o)
	if terr != nil {
		return nil, terr
	}
	c.Names = named
	c.NetConf.Attachment = netconf.Attachment{}
	if named.Inline != nil {
		c.NetConf.Attachment = *named.Inline
		r, terr := c.routing()
		if terr != nil {
			return nil, terr
		}
		c.Routing = r
	}
	if !needPrev {
		return &c, nil
	}
	if c.RawPrevResult == nil {
		return nil, netconf.InvalidConfig("no prevResult: galactic-bgp is a chained plugin and must follow galactic-cni in the network's plugins list (cniVersion 0.3.0 or later)")
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult is not a valid cniVersion %s result: %v", c.CNIVersion, err), "")
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "prevResult cannot be read: "+err.Error(), "")
	}
	c.Prev = c.PrevResult
	for _, ip := range prev.IPs {
		if ip == nil || ip.Address.IP == nil {
			return nil, types.NewError(types.ErrDecodingFailure, "prevResult lists an IP without an address", "")
		}
		c.IPs = append(c.IPs, ip.Address.IP)
	}
	return &c, nil
}
