package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/routing"
)

// Limits and defaults of the stanza's numeric fields.
const (
	minMTU     = 68
	minMTUIPv6 = 1280
	maxMTU     = 65535

	defaultWaitSeconds  = 30
	defaultLeaseSeconds = 60
	maxWaitSeconds      = 3600
	minLeaseSeconds     = 5
	maxLeaseSeconds     = 3600
)

// NetConf is the galactic-cni stanza of a network config list.
type NetConf struct {
	types.PluginConf
	// Namespace and Attachment name a VPCAttachment (a VMM's stanza); VPC
	// and Attachment an inline attachment; none of them, a conflist
	// shared by every pod, whose annotations name VPCAttachments.
	netconf.Attachment
	// Mode is "tap" (default: a VMM opens the tap) or "veth" (the peer
	// moves into the container as CNI_IFNAME).
	Mode string `json:"mode,omitempty"`
	// Addresses are an inline attachment's addresses as CIDRs; may be
	// empty.
	Addresses []string `json:"addresses,omitempty"`
	// AllowedSourcePrefixes are sources an inline attachment's workload may
	// send from beyond its addresses (router or NAT appliances); see
	// sources.go.
	AllowedSourcePrefixes []string `json:"allowedSourcePrefixes,omitempty"`
	// MTU of the host interface (and the container end); unset keeps the
	// kernel default.
	MTU *int `json:"mtu,omitempty"`
	// Routing is "vrf" (default) or "table".
	Routing string `json:"routing,omitempty"`
	// Handoff configures the attachment's handoff lease.
	Handoff *HandoffConf `json:"handoff,omitempty"`
	// Standby makes ADD prepare a live-migration target: the interface,
	// but no lease and no host routes until `galactic-cni promote`.
	Standby *bool `json:"standby,omitempty"`
	// RuntimeConfig carries the pod's annotations, which name the pod's
	// VPCAttachments and may give its mode and standby.
	RuntimeConfig netconf.RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// HandoffConf is the stanza's "handoff" object.
type HandoffConf struct {
	// Enabled defaults to true.
	Enabled *bool `json:"enabled,omitempty"`
	// WaitSeconds is how long ADD waits for the lease (default 30).
	WaitSeconds *int `json:"waitSeconds,omitempty"`
	// LeaseSeconds is the lease duration (default 60).
	LeaseSeconds *int `json:"leaseSeconds,omitempty"`
}

// Config is a validated stanza with its defaults filled in. For
// VPCAttachments, the stanza's Config only names them (Names); each
// attachment's own Config (forObject) has its data-plane names as VPC and
// Attachment and its addresses from the object.
type Config struct {
	types.PluginConf
	netconf.Attachment
	// Names is what the stanza or the pod names.
	Names netconf.Names
	// Object is the VPCAttachment this Config attaches; nil for an inline
	// attachment.
	Object    *Object
	Mode      string
	Routing   string
	Addresses []netip.Prefix
	// AllowedSourcePrefixes are validated network prefixes.
	AllowedSourcePrefixes []netip.Prefix
	// MTU is 0 when the stanza leaves it out.
	MTU     int
	Handoff Handoff
	// Standby is a live-migration target's ADD (see migrate.go).
	Standby bool
}

// Object is what a Config of a VPCAttachment takes from it besides its
// names and addresses: its identity, and for galactic-bgp (through the
// node record) its VNI and announce policy.
type Object struct {
	Namespace, Name, UID string
	VNI                  int32
	Announce             string
}

// Handoff is the validated handoff settings.
type Handoff struct {
	Enabled bool
	Wait    time.Duration
	Lease   time.Duration
}

// parseConf decodes, validates and defaults a stanza and parses its
// prevResult. Every error is a CNI error naming what to fix; the cniVersion
// itself was checked by skel against the supported versions. o says
// whether an attachment must be named, whether inline ones are refused, and
// the CNI_ARGS that give a pod's namespace.
func parseConf(data []byte, o netconf.ResolveOptions) (*Config, *types.Error) {
	var n NetConf
	if err := json.Unmarshal(data, &n); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return nil, netconf.InvalidConfig(fmt.Sprintf("%s must be %s, not a JSON %s", typeErr.Field, jsonKind(typeErr.Type), typeErr.Value))
		}
		return nil, types.NewError(types.ErrDecodingFailure, "network config is not valid JSON: "+err.Error(), "")
	}
	o.Inline = []netconf.InlineField{
		{Name: "addresses", Set: n.Addresses != nil, Replacement: "spec.addresses"},
		{Name: "allowedSourcePrefixes", Set: n.AllowedSourcePrefixes != nil, Replacement: "spec.allowedSourcePrefixes"},
	}
	named, err := netconf.Resolve(n.Attachment, n.RuntimeConfig, o)
	if err != nil {
		return nil, err
	}
	c := &Config{PluginConf: n.PluginConf, Names: named}
	if named.Inline != nil {
		c.Attachment = *named.Inline
	}
	var h Handoff
	var modeKey string
	n.Mode, modeKey = n.RuntimeConfig.Mode(n.Mode)

	switch n.Mode {
	case "", names.ModeTap:
		c.Mode = names.ModeTap
	case names.ModeVeth:
		c.Mode = names.ModeVeth
	default:
		return nil, netconf.FromAnnotation(modeKey, netconf.InvalidConfig(fmt.Sprintf(`mode %q is not supported: use "tap" (the default, for VMs) or "veth" (for containers)`, n.Mode)))
	}

	switch n.Routing {
	case "", routing.KindVRF:
		c.Routing = routing.KindVRF
	case routing.KindTable:
		c.Routing = routing.KindTable
	default:
		return nil, netconf.InvalidConfig(fmt.Sprintf(`routing %q is not supported: use "vrf" (the default) or "table" (for kernels without VRF)`, n.Routing))
	}

	if c.Addresses, err = parseAddresses(n.Addresses, "addresses"); err != nil {
		return nil, err
	}
	if c.AllowedSourcePrefixes, err = parseAllowedSources(n.AllowedSourcePrefixes, "allowedSourcePrefixes"); err != nil {
		return nil, err
	}
	if n.MTU != nil {
		m := *n.MTU
		if m < minMTU || m > maxMTU {
			return nil, netconf.InvalidConfig(fmt.Sprintf("mtu %d is out of range: use %d..%d, or leave it out for the kernel default", m, minMTU, maxMTU))
		}
		c.MTU = m
	}
	if err := c.checkAddressing("addresses", "allowedSourcePrefixes"); err != nil {
		return nil, err
	}

	h, err = parseHandoff(n.Handoff)
	if err != nil {
		return nil, err
	}
	c.Handoff = h
	if c.Standby, err = parseStandby(n, h.Enabled); err != nil {
		return nil, err
	}

	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "prevResult cannot be parsed: "+err.Error(), "")
	}
	return c, nil
}

// parseAddresses validates CIDR addresses; field names them in errors.
func parseAddresses(list []string, field string) ([]netip.Prefix, *types.Error) {
	var out []netip.Prefix
	seen := map[netip.Addr]int{}
	for i, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, netconf.InvalidConfig(fmt.Sprintf(`%s[%d] %q is not a CIDR: use an address with its prefix length, such as "10.20.0.5/24" or "fd20::5/64"`, field, i, s))
		}
		if j, dup := seen[p.Addr()]; dup {
			return nil, netconf.InvalidConfig(fmt.Sprintf("%s[%d] %q repeats the address of %s[%d]: list each address once", field, i, s, field, j))
		}
		seen[p.Addr()] = i
		out = append(out, p)
	}
	return out, nil
}

// checkAddressing checks what the addresses and allowed sources need of
// each other and of the MTU; the arguments name them in errors.
func (c *Config) checkAddressing(addresses, allowed string) *types.Error {
	if err := hostif.FilterAttachment("", c.Addresses, c.AllowedSourcePrefixes, nil).Validate(); err != nil {
		return netconf.InvalidConfig(fmt.Sprintf("%s and %s: %v: merge them into wider prefixes", addresses, allowed, err))
	}
	if c.MTU != 0 && c.MTU < minMTUIPv6 && slices.ContainsFunc(c.Addresses, func(p netip.Prefix) bool { return p.Addr().Is6() }) {
		return netconf.InvalidConfig(fmt.Sprintf("mtu %d is below %d, the IPv6 minimum, and %s include IPv6: use %d..%d", c.MTU, minMTUIPv6, addresses, minMTUIPv6, maxMTU))
	}
	return nil
}

// forObject is the Config of one VPCAttachment the stanza names: its
// data-plane names, allocated addresses, allowed sources, VNI and
// announce policy. The caller checked that it is Ready; what it holds
// that cannot serve is code 7 naming the object's field.
func (c *Config) forObject(a *v1alpha1.VPCAttachment) (*Config, *types.Error) {
	id := a.Namespace + "/" + a.Name
	o := *c
	o.Names = netconf.Names{}
	dp := a.Status.Dataplane
	o.Attachment = netconf.Attachment{Namespace: a.Namespace, VPC: dp.VPC, Attachment: dp.Attachment}
	var err *types.Error
	addrs := make([]string, 0, len(a.Status.Addresses))
	for _, p := range a.Status.Addresses {
		addrs = append(addrs, string(p))
	}
	if o.Addresses, err = parseAddresses(addrs, "VPCAttachment "+id+" status.addresses"); err != nil {
		return nil, err
	}
	allowed := make([]string, 0, len(a.Spec.AllowedSourcePrefixes))
	for _, p := range a.Spec.AllowedSourcePrefixes {
		allowed = append(allowed, string(p))
	}
	if o.AllowedSourcePrefixes, err = parseAllowedSources(allowed, "VPCAttachment "+id+" spec.allowedSourcePrefixes"); err != nil {
		return nil, err
	}
	if err := o.checkAddressing("VPCAttachment "+id+" status.addresses", "spec.allowedSourcePrefixes"); err != nil {
		return nil, err
	}
	announce := string(a.Spec.Announce)
	if announce == "" {
		announce = string(v1alpha1.AnnounceAlways)
	}
	if announce == string(v1alpha1.AnnounceWhenAvailable) && !c.Handoff.Enabled {
		return nil, netconf.InvalidConfig(fmt.Sprintf(`VPCAttachment %s has spec.announce "whenAvailable", which needs the handoff lease: enable "handoff" in the network config`, id))
	}
	o.Object = &Object{Namespace: a.Namespace, Name: a.Name, UID: string(a.UID), VNI: a.Status.VNI, Announce: announce}
	return &o, nil
}

// jsonKind names a Go type the way a config author knows it.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(jsonKind(t.Elem()), "a ") + "s"
	}
	return "an object"
}

func parseHandoff(h *HandoffConf) (Handoff, *types.Error) {
	out := Handoff{Enabled: true, Wait: defaultWaitSeconds * time.Second, Lease: defaultLeaseSeconds * time.Second}
	if h == nil {
		return out, nil
	}
	if h.Enabled != nil {
		out.Enabled = *h.Enabled
	}
	if h.WaitSeconds != nil {
		w := *h.WaitSeconds
		if w < 0 || w > maxWaitSeconds {
			return out, netconf.InvalidConfig(fmt.Sprintf("handoff.waitSeconds %d is out of range: use 0..%d (0 gives up at once when another runtime holds the lease)", w, maxWaitSeconds))
		}
		out.Wait = time.Duration(w) * time.Second
	}
	if h.LeaseSeconds != nil {
		l := *h.LeaseSeconds
		if l < minLeaseSeconds || l > maxLeaseSeconds {
			return out, netconf.InvalidConfig(fmt.Sprintf("handoff.leaseSeconds %d is out of range: use %d..%d", l, minLeaseSeconds, maxLeaseSeconds))
		}
		out.Lease = time.Duration(l) * time.Second
	}
	return out, nil
}
