package config

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"time"
)

// Roles of galactic-router.
const (
	// RoleNode is the node's speaker: it announces this node's
	// advertisements and installs the routes of its VPCs.
	RoleNode = "node"
	// RoleReflector reflects l2vpn-evpn between node routers with
	// route-target constraint and programs no kernel state.
	RoleReflector = "reflector"
)

// role reads the role key and refuses the keys of the other role.
func (f File) role() (string, error) {
	role := RoleNode
	if f.Role != nil {
		role = *f.Role
	}
	switch role {
	case RoleNode:
		if f.ClusterID != "" {
			return "", keyError("clusterID", "applies to role %q only", RoleReflector)
		}
		if f.ClientRanges != nil {
			return "", keyError("clientRanges", "applies to role %q only", RoleReflector)
		}
	case RoleReflector:
		// A reflector installs no routes and reflects every route target.
		if f.RouteTargetASN != nil {
			return "", keyError("routeTargetASN", "applies to role %q only: a reflector reflects every route target", RoleNode)
		}
		if f.WithdrawHoldSeconds != nil {
			return "", keyError("withdrawHoldSeconds", "applies to role %q only: a reflector installs no routes", RoleNode)
		}
		if f.StaleRoutesSeconds != nil {
			return "", keyError("staleRoutesSeconds", "applies to role %q only: a reflector installs no routes", RoleNode)
		}
	default:
		return "", keyError("role", "%q is not a role: allowed are %q (default) and %q", role, RoleNode, RoleReflector)
	}
	return role, nil
}

// validateReflector checks a reflector's file: its identity, how it takes
// sessions (listenPort, clientRanges, peers) and its graceful restart.
func (f File) validateReflector() (*Config, error) {
	c := Config{Role: RoleReflector}
	var err error
	if c.ASN, err = asn("asn", f.ASN); err != nil {
		return nil, err
	}
	if f.Underlay != "" {
		if c.Underlay, err = netip.ParseAddr(f.Underlay); err != nil || !c.Underlay.Is4() {
			return nil, keyError("underlay", "%q is not an IPv4 address (the reflector's address its sessions use)", f.Underlay)
		}
	}
	switch {
	case f.RouterID != "":
		if c.RouterID, err = netip.ParseAddr(f.RouterID); err != nil || !c.RouterID.Is4() {
			return nil, keyError("routerID", "%q is not an IPv4 address (a BGP router ID is written as one)", f.RouterID)
		}
	case c.Underlay.IsValid():
		c.RouterID = c.Underlay
	default:
		return nil, keyError("routerID", "is required for role %q unless underlay is set", RoleReflector)
	}
	c.ClusterID = c.RouterID
	if f.ClusterID != "" {
		if c.ClusterID, err = netip.ParseAddr(f.ClusterID); err != nil || !c.ClusterID.Is4() {
			return nil, keyError("clusterID", "%q is not an IPv4 address (a cluster ID is written as one)", f.ClusterID)
		}
	}
	c.ListenPort = DefaultListenPort
	if f.ListenPort != nil {
		if *f.ListenPort < 1 || *f.ListenPort > 65535 {
			return nil, keyError("listenPort", "%d is out of range: 1-65535 (a reflector accepts its clients' sessions)", *f.ListenPort)
		}
		c.ListenPort = int32(*f.ListenPort)
	}
	if c.GracefulRestart, c.RestartTime, err = gracefulRestart(f.GracefulRestart); err != nil {
		return nil, err
	}
	if c.MetricsAddress, err = metricsAddress(f.MetricsAddress); err != nil {
		return nil, err
	}
	for i, s := range f.ClientRanges {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			return nil, keyError(fmt.Sprintf("clientRanges[%d]", i), "%q is not a prefix such as 192.0.2.0/24", s)
		}
		if p != p.Masked() {
			return nil, keyError(fmt.Sprintf("clientRanges[%d]", i), "%q has host bits set; write %s", s, p.Masked())
		}
		c.ClientRanges = append(c.ClientRanges, p)
	}
	seen := map[netip.Addr]bool{}
	for i, pf := range f.Peers {
		key := fmt.Sprintf("peers[%d]", i)
		p, err := pf.validate(key)
		if err != nil {
			return nil, err
		}
		if p.ASN != c.ASN {
			return nil, keyError(key+".asn", "%d must be the reflector's asn (%d): route reflection is iBGP", p.ASN, c.ASN)
		}
		if seen[p.Address] {
			return nil, keyError(key+".address", "%s is listed twice", p.Address)
		}
		seen[p.Address] = true
		c.Peers = append(c.Peers, p)
	}
	if len(c.Peers) == 0 && len(c.ClientRanges) == 0 {
		return nil, keyError("clientRanges", "a reflector needs clients: clientRanges (accepting any node in them) or peers")
	}
	return &c, nil
}

// ClientTimers are the hold and keepalive a reflector offers the clients
// of its clientRanges (explicit peers carry their own).
const (
	ClientHold      = DefaultHoldSeconds * time.Second
	ClientKeepalive = DefaultKeepaliveSeconds * time.Second
)

func gracefulRestart(gr *GracefulRestart) (bool, time.Duration, error) {
	on, t := true, time.Duration(DefaultRestartSeconds)*time.Second
	if gr == nil {
		return on, t, nil
	}
	if gr.Enabled != nil {
		on = *gr.Enabled
	}
	// The restart time field of the capability has 12 bits.
	t, err := seconds("gracefulRestart.restartSeconds", gr.RestartSeconds, DefaultRestartSeconds, 1, 4095)
	return on, t, err
}

func metricsAddress(v *string) (string, error) {
	if v == nil {
		return DefaultMetricsAddress, nil
	}
	if *v != "" {
		if _, err := netip.ParseAddrPort(*v); err != nil {
			return "", keyError("metricsAddress", "%q is not <ip>:<port> (empty turns the endpoint off)", *v)
		}
	}
	return *v, nil
}

// LoadWithUnderlay is Load with underlay filling the key of that name
// when the file has none: a reflector set shares one file, and each
// instance takes its own host's address (and so its router ID) from it.
func LoadWithUnderlay(path, underlay string) (*Config, error) {
	if underlay == "" {
		return Load(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading router config: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err == nil {
		if _, ok := top["underlay"]; !ok {
			top["underlay"], _ = json.Marshal(underlay)
			data, _ = json.Marshal(top)
		}
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("router config %s: %w", path, err)
	}
	return c, nil
}
