package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

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
	// VPC and Attachment name the VPC attachment (DNS-1123 labels).
	netconf.Attachment
	// Mode is "tap" (default: a VMM opens the tap) or "veth" (the peer
	// moves into the container as CNI_IFNAME).
	Mode string `json:"mode,omitempty"`
	// Addresses are the attachment's addresses as CIDRs; may be empty.
	Addresses []string `json:"addresses,omitempty"`
	// AllowedSourcePrefixes are sources the workload may send from beyond
	// its addresses (router or NAT appliances); see sources.go.
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
	// RuntimeConfig carries the pod's annotations, which supply vpc,
	// attachment, mode and addresses where the stanza has none.
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

// Config is a validated stanza with its defaults filled in.
type Config struct {
	types.PluginConf
	netconf.Attachment
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

// Handoff is the validated handoff settings.
type Handoff struct {
	Enabled bool
	Wait    time.Duration
	Lease   time.Duration
}

// parseConf decodes, validates and defaults a stanza and parses its
// prevResult. Every error is a CNI error naming what to fix; the cniVersion
// itself was checked by skel against the supported versions. Unless
// needAttachment, a stanza and pod naming no attachment are accepted.
func parseConf(data []byte, needAttachment bool) (*Config, *types.Error) {
	var n NetConf
	if err := json.Unmarshal(data, &n); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return nil, netconf.InvalidConfig(fmt.Sprintf("%s must be %s, not a JSON %s", typeErr.Field, jsonKind(typeErr.Type), typeErr.Value))
		}
		return nil, types.NewError(types.ErrDecodingFailure, "network config is not valid JSON: "+err.Error(), "")
	}
	if err := n.Attachment.Resolve(n.RuntimeConfig, needAttachment); err != nil {
		return nil, err
	}
	c := &Config{PluginConf: n.PluginConf, Attachment: n.Attachment}
	var err *types.Error
	var h Handoff
	var modeKey, addressesKey string
	n.Mode, modeKey = n.RuntimeConfig.Mode(n.Mode)
	n.Addresses, addressesKey = n.RuntimeConfig.Addresses(n.Addresses)

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

	seen := map[netip.Addr]int{}
	hasIPv6 := false
	for i, s := range n.Addresses {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, netconf.FromAnnotation(addressesKey, netconf.InvalidConfig(fmt.Sprintf(`addresses[%d] %q is not a CIDR: use an address with its prefix length, such as "10.20.0.5/24" or "fd20::5/64"`, i, s)))
		}
		if j, dup := seen[p.Addr()]; dup {
			return nil, netconf.FromAnnotation(addressesKey, netconf.InvalidConfig(fmt.Sprintf("addresses[%d] %q repeats the address of addresses[%d]: list each address once", i, s, j)))
		}
		seen[p.Addr()] = i
		hasIPv6 = hasIPv6 || p.Addr().Is6()
		c.Addresses = append(c.Addresses, p)
	}

	allowed, allowedKey := n.RuntimeConfig.AllowedSourcePrefixes(n.AllowedSourcePrefixes)
	if c.AllowedSourcePrefixes, err = parseAllowedSources(allowed, allowedKey); err != nil {
		return nil, err
	}
	if err := hostif.FilterAttachment("", c.Addresses, c.AllowedSourcePrefixes, nil).Validate(); err != nil {
		return nil, netconf.FromAnnotation(allowedKey, netconf.InvalidConfig(fmt.Sprintf("addresses and allowedSourcePrefixes: %v: merge them into wider prefixes", err)))
	}

	if n.MTU != nil {
		m := *n.MTU
		if m < minMTU || m > maxMTU {
			return nil, netconf.InvalidConfig(fmt.Sprintf("mtu %d is out of range: use %d..%d, or leave it out for the kernel default", m, minMTU, maxMTU))
		}
		if hasIPv6 && m < minMTUIPv6 {
			return nil, netconf.InvalidConfig(fmt.Sprintf("mtu %d is below %d, the IPv6 minimum, and addresses include IPv6: use %d..%d", m, minMTUIPv6, minMTUIPv6, maxMTU))
		}
		c.MTU = m
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
