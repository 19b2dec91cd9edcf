// Package speaker is galactic-router's narrow view of its BGP speaker: the
// EVPN type-5 routes it announces and receives, and the peers it keeps.
// The reconcilers see only the Speaker interface, so they are tested
// without sockets; GoBGP implements it for the daemon.
package speaker

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Community values galactic puts on its routes.
const (
	// LargeCommunityHolderGeneration is the first local-data field of the
	// large community <routeTargetASN>:1:<holderGeneration> that carries an
	// entry's fencing token on the route, so every receiver prefers the
	// current holder.
	LargeCommunityHolderGeneration = 1
	// LargeCommunityDrain is the first local-data field of the drain
	// marking <routeTargetASN>:2:0: a receiver removes a marked path's
	// kernel route at once instead of holding it. A private marking, so a
	// fabric's own maintenance communities (GRACEFUL_SHUTDOWN) never drop
	// galactic routes.
	LargeCommunityDrain = 2
)

// Route is one EVPN IP prefix route (RFC 9136 type 5): ethernet tag 0, ESI
// 0, gateway IP 0, label = VNI, route target <RTASN>:<VNI>, VXLAN
// encapsulation and the router MAC.
type Route struct {
	RD        RD
	Prefix    netip.Prefix
	VNI       uint32
	RTASN     uint16
	NextHop   netip.Addr
	RouterMAC net.HardwareAddr
	// Generation is the holderGeneration of the entry it announces.
	Generation uint32
	// Drained marks a route whose holder stopped being available.
	Drained bool
}

// Key identifies a route in the EVPN RIB: RD and prefix.
type Key struct {
	RD     RD
	Prefix netip.Prefix
}

func (k Key) String() string { return k.RD.String() + " " + k.Prefix.String() }

// Key is r's RIB key.
func (r Route) Key() Key { return Key{RD: r.RD, Prefix: r.Prefix} }

// Equal reports whether two routes carry the same NLRI and attributes.
func (r Route) Equal(o Route) bool {
	return r.RD == o.RD && r.Prefix == o.Prefix && r.VNI == o.VNI && r.RTASN == o.RTASN &&
		r.NextHop == o.NextHop && r.RouterMAC.String() == o.RouterMAC.String() &&
		r.Generation == o.Generation && r.Drained == o.Drained
}

// RD is a type-1 route distinguisher, <IPv4 address>:<number>.
type RD struct {
	Admin    netip.Addr
	Assigned uint16
}

func (d RD) String() string { return fmt.Sprintf("%s:%d", d.Admin, d.Assigned) }

// ParseRD reads "<IPv4>:<n>".
func ParseRD(s string) (RD, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return RD{}, fmt.Errorf("route distinguisher %q is not <ipv4>:<number>", s)
	}
	a, err := netip.ParseAddr(s[:i])
	if err != nil || !a.Is4() {
		return RD{}, fmt.Errorf("route distinguisher %q is not <ipv4>:<number>", s)
	}
	n, err := strconv.ParseUint(s[i+1:], 10, 16)
	if err != nil {
		return RD{}, fmt.Errorf("route distinguisher %q is not <ipv4>:<number>", s)
	}
	return RD{Admin: a, Assigned: uint16(n)}, nil
}

// MarshalText and UnmarshalText let an RD be a JSON map key or string.
func (d RD) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d *RD) UnmarshalText(b []byte) error {
	v, err := ParseRD(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// RouteTarget is a two-octet-AS route target <ASN>:<Value>.
type RouteTarget struct {
	ASN   uint16
	Value uint32
}

// Received is a route a peer announced (or withdrew).
type Received struct {
	Route
	// Targets are every route target the path carries; RTASN and VNI are
	// the first under the receiver's route-target AS.
	Targets []RouteTarget
	// Withdrawn is true when the peer withdrew the path.
	Withdrawn bool
	// Stale is true while a restarting peer's path is kept by graceful
	// restart.
	Stale bool
	// Peer is the neighbour it came from.
	Peer string
}

// TargetVNIs are the values of the path's route targets under rtASN: the
// VNIs of the VPCs it is imported into.
func (r Received) TargetVNIs(rtASN uint16) []uint32 {
	if len(r.Targets) == 0 {
		if r.RTASN == rtASN {
			return []uint32{r.VNI}
		}
		return nil
	}
	var out []uint32
	for _, t := range r.Targets {
		if t.ASN == rtASN {
			out = append(out, t.Value)
		}
	}
	return out
}

// PeerState is one neighbour's session.
type PeerState struct {
	Address     string
	Established bool
	State       string
}

// EventKind says what an Event reports.
type EventKind int

const (
	// EventPaths is paths a peer announced or withdrew in an UPDATE.
	EventPaths EventKind = iota
	// EventEndOfRIB is a peer's End-of-RIB for l2vpn-evpn.
	EventEndOfRIB
	// EventPeer is a session state change.
	EventPeer
)

// Event is one entry of the speaker's ordered stream: a peer's paths, its
// End-of-RIB and its session changes arrive in the order the speaker
// processed them, so an End-of-RIB never overtakes the routes it follows.
type Event struct {
	Kind  EventKind
	Peer  string
	Paths []Received
	State PeerState
}
