package speaker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// rtcFamily is RFC 4684 route-target membership (ipv4 / SAFI 132).
var rtcFamily = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_ROUTE_TARGET_CONSTRAINTS}

// rtc is rtcFamily as GoBGP's native API names it.
var rtc = bgp.RF_RTC_UC

// filterPolicy is the import policy's name in GoBGP.
const filterPolicy = "galactic-import"

// rtcDeferral bounds how long a speaker that negotiated rtc waits for its
// peer's memberships (their End-of-RIB) before it sends l2vpn-evpn.
const rtcDeferral = 2

func (rt RouteTarget) String() string { return fmt.Sprintf("%d:%d", rt.ASN, rt.Value) }

// memberSet is the route targets imported, read by the watcher without
// the membership's lock.
type memberSet map[RouteTarget]bool

// any says whether r carries a member route target.
func (m *memberSet) any(r Received) bool {
	if len(r.Targets) == 0 {
		return (*m)[RouteTarget{ASN: r.RTASN, Value: r.VNI}]
	}
	for _, t := range r.Targets {
		if (*m)[t] {
			return true
		}
	}
	return false
}

// membership is the route targets the node imports: the watcher's
// filter and the RTC paths announced for them.
type membership struct {
	mu   sync.Mutex
	rts  map[RouteTarget]*apiutil.Path // RTC path by route target (see GoBGP.own)
	init bool
	// known are the peers a previous run saw negotiate rtc; seen is what
	// this run saw each peer negotiate.
	known map[netip.Addr]bool
	seen  map[netip.Addr]bool
	// set is rts for the watcher; dropped counts the paths it left out.
	set     atomic.Pointer[memberSet]
	dropped atomic.Int64
}

// rtcAfiSafi is the rtc family of a session, with the same graceful
// restart as l2vpn-evpn and a wait for the peer's memberships.
func rtcAfiSafi(gr bool) *api.AfiSafi {
	af := &api.AfiSafi{
		Config: &api.AfiSafiConfig{Family: rtcFamily, Enabled: true},
		RouteTargetMembership: &api.RouteTargetMembership{
			Config: &api.RouteTargetMembershipConfig{DeferralTime: rtcDeferral},
		},
	}
	if gr {
		af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
	return af
}

// installFilter sets up the import policy, with the initial membership,
// before any peer is added. The router reads what peers send from the
// watcher (Adj-RIB-In, keeping only member route targets) and selects
// itself, so no received l2vpn-evpn path enters GoBGP's loc-RIB: none
// costs a best-path run, a second copy or a re-evaluation when the
// membership changes. This node's own paths and other families pass.
func (g *GoBGP) installFilter(ctx context.Context, o Options) error {
	g.members.known, g.members.seen = map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, a := range o.RTCPeers {
		g.members.known[a] = true
	}
	if err := ownOnly(ctx, g.s, filterPolicy, api.PolicyDirection_POLICY_DIRECTION_IMPORT, evpnFamily); err != nil {
		return fmt.Errorf("import filter: %w", err)
	}
	g.members.rts = map[RouteTarget]*apiutil.Path{}
	g.members.set.Store(&memberSet{})
	g.members.init = true
	return g.SetMembership(ctx, o.Membership)
}

// ownOnly assigns GoBGP's global policy of direction dir a policy name
// that passes this speaker's own paths and refuses the peers' paths of
// family; other families pass.
func ownOnly(ctx context.Context, s *server.BgpServer, name string, dir api.PolicyDirection, family *api.Family) error {
	policy := &api.Policy{Name: name, Statements: []*api.Statement{
		{Name: "own", Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
			Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT}},
		{Name: "peers", Conditions: &api.Conditions{AfiSafiIn: []*api.Family{family}},
			Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT}},
	}}
	if err := s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: policy}); err != nil {
		return err
	}
	return s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: dir, Policies: []*api.Policy{{Name: name}}, DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}})
}

// offerRTC says whether a session to peer offers rtc. GoBGP, as a
// restarting speaker, sends End-of-RIB for every configured family, also
// one the peer did not negotiate, and FRR resets the session on an rtc
// End-of-RIB. So a restarting router offers rtc only to the peers a
// previous run saw negotiate it; a fresh start offers it to every peer.
func (g *GoBGP) offerRTC(peer netip.Addr, restarting bool) bool {
	if !restarting {
		return true
	}
	g.members.mu.Lock()
	defer g.members.mu.Unlock()
	return g.members.known[peer]
}

// RTCPeers are the peers known to negotiate rtc: what the sessions that
// came up negotiated, and for the others what was known before. With the
// watcher running the sessions' capabilities come from its events; GoBGP's
// peer listing counts every received path, a walk of its tables.
func (g *GoBGP) RTCPeers(ctx context.Context) ([]netip.Addr, error) {
	if g.onEvent == nil {
		up := map[netip.Addr]bool{}
		err := g.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
			st := p.GetState()
			addr, err := netip.ParseAddr(st.GetNeighborAddress())
			if err != nil || st.GetSessionState() != api.PeerState_SESSION_STATE_ESTABLISHED {
				return
			}
			up[addr] = false
			for _, c := range st.GetRemoteCap() {
				if f := c.GetMultiProtocol().GetFamily(); f.GetAfi() == rtcFamily.Afi && f.GetSafi() == rtcFamily.Safi {
					up[addr] = true
				}
			}
		})
		if err != nil {
			return nil, err
		}
		for a, rtc := range up {
			g.sawSession(a, rtc)
		}
	}
	g.members.mu.Lock()
	defer g.members.mu.Unlock()
	var out []netip.Addr
	for _, p := range g.cfg.Peers {
		rtc, seen := g.members.seen[p.Address]
		if rtc || (!seen && g.members.known[p.Address]) {
			out = append(out, p.Address)
		}
	}
	return out, nil
}

// sawSession records whether an established session negotiated rtc.
func (g *GoBGP) sawSession(peer netip.Addr, rtc bool) {
	g.members.mu.Lock()
	defer g.members.mu.Unlock()
	if g.members.seen != nil {
		g.members.seen[peer] = rtc
	}
}

// negotiatedRTC says whether the capabilities a peer sent include rtc.
func negotiatedRTC(caps []bgp.ParameterCapabilityInterface) bool {
	for _, c := range caps {
		if mp, ok := c.(*bgp.CapMultiProtocol); ok && mp.CapValue == rtc {
			return true
		}
	}
	return false
}

// SetMembership makes rts the route targets this node imports. Paths of
// other route targets are dropped as they arrive, before the RIB; a peer
// that negotiated rtc is told the membership (RFC 4684) and sends only
// those. An added route target gets the paths the peers already sent at
// once (read from their Adj-RIB-In), a removed one loses them.
// Unchanged, it does nothing.
func (g *GoBGP) SetMembership(ctx context.Context, rts []RouteTarget) error {
	m := &g.members
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.init {
		return fmt.Errorf("the import filter is not installed")
	}
	want := map[RouteTarget]bool{}
	for _, rt := range rts {
		want[rt] = true
	}
	var added, removed []RouteTarget
	for rt := range want {
		if _, ok := m.rts[rt]; !ok {
			added = append(added, rt)
		}
	}
	for rt := range m.rts {
		if !want[rt] {
			removed = append(removed, rt)
		}
	}
	if len(added) == 0 && len(removed) == 0 {
		return nil
	}
	if g.log != nil {
		g.log.Info("route-target membership", "added", len(added), "removed", len(removed), "members", len(want))
	}
	// Stop asking for what goes before the filter drops it, and open the
	// filter before asking for what comes.
	if len(removed) > 0 {
		gone := make([]*apiutil.Path, 0, len(removed))
		for _, rt := range removed {
			gone = append(gone, m.rts[rt])
		}
		if err := g.s.DeletePath(apiutil.DeletePathRequest{Paths: gone}); err != nil {
			return fmt.Errorf("withdrawing %d memberships: %w", len(removed), err)
		}
		for _, rt := range removed {
			delete(m.rts, rt)
		}
	}
	set := memberSet(want)
	m.set.Store(&set)
	if len(added) > 0 {
		paths := make([]*apiutil.Path, 0, len(added))
		for _, rt := range added {
			p, err := rtcPath(g.cfg.ASN, &rt, g.cfg.Underlay)
			if err != nil {
				return err
			}
			p.Age = g.clock.Now().Unix()
			paths = append(paths, p)
		}
		if _, err := g.s.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
			return fmt.Errorf("announcing %d memberships: %w", len(added), err)
		}
		for i, rt := range added {
			m.rts[rt] = paths[i]
		}
	}
	return g.catchUp(ctx, added, removed, set)
}

// catchUp hands the daemon the paths of the added route targets that the
// peers sent before they were members (the watcher left them out), and
// withdraws those of the removed ones that no member keeps. It holds the
// stream while it reads and delivers, so no event of the watcher falls
// between the read and the delivery; events the watcher queued before the
// read follow it in order and leave the same state.
func (g *GoBGP) catchUp(ctx context.Context, added, removed []RouteTarget, members memberSet) error {
	if g.onEvent == nil || len(added)+len(removed) == 0 {
		return nil
	}
	in, out := memberSet{}, memberSet{}
	for _, rt := range added {
		in[rt] = true
	}
	for _, rt := range removed {
		out[rt] = true
	}
	g.deliver.Lock()
	defer g.deliver.Unlock()
	for _, p := range g.cfg.Peers {
		paths, err := g.adjIn(p.Address.String())
		if err != nil {
			// A peer that never came up has no table.
			continue
		}
		var rs []Received
		for _, r := range g.convert(paths, false) {
			if r.Withdrawn {
				continue
			}
			r.Peer = p.Address.String()
			switch {
			case in.any(r):
				rs = append(rs, r)
			case out.any(r) && !members.any(r):
				r.Withdrawn = true
				rs = append(rs, r)
			}
		}
		if len(rs) > 0 {
			g.onEvent(Event{Kind: EventPaths, Peer: rs[0].Peer, Paths: rs})
		}
	}
	return nil
}

// Membership is the route targets set last.
func (g *GoBGP) Membership() []RouteTarget {
	g.members.mu.Lock()
	defer g.members.mu.Unlock()
	out := make([]RouteTarget, 0, len(g.members.rts))
	for rt := range g.members.rts {
		out = append(out, rt)
	}
	slices.SortFunc(out, func(a, b RouteTarget) int {
		if a.ASN != b.ASN {
			return int(a.ASN) - int(b.ASN)
		}
		return int(a.Value) - int(b.Value)
	})
	return out
}

// rtcPath is the membership NLRI <asn>:<rt>; a nil rt is the default
// membership (every route target) a reflector offers its clients. Its
// announcer stamps its age.
func rtcPath(asn uint32, rt *RouteTarget, nextHop netip.Addr) (*apiutil.Path, error) {
	var nlri *bgp.RouteTargetMembershipNLRI
	if rt == nil {
		nlri = bgp.NewRouteTargetMembershipNLRI(0, nil)
	} else {
		nlri = bgp.NewRouteTargetMembershipNLRI(asn, bgp.NewTwoOctetAsSpecificExtended(bgp.EC_SUBTYPE_ROUTE_TARGET, rt.ASN, rt.Value, true))
	}
	nh := netip.IPv4Unspecified()
	if nextHop.Is4() {
		nh = nextHop
	}
	reach, err := bgp.NewPathAttributeMpReachNLRI(rtc, []bgp.PathNLRI{{NLRI: nlri}}, nh)
	if err != nil {
		return nil, fmt.Errorf("membership %v: %w", rt, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP), reach}
	return &apiutil.Path{Family: rtc, Nlri: nlri, Attrs: attrs}, nil
}

// AdjIn counts the l2vpn-evpn paths the configured peers sent (their
// Adj-RIB-In, before the watcher's filter); GoBGP counts them by walking
// the tables.
func (g *GoBGP) AdjIn(ctx context.Context) (received int, err error) {
	for _, p := range g.cfg.Peers {
		res, err := g.s.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Family: evpnFamily, Name: p.Address.String()})
		if err != nil {
			// A peer that never came up has no table.
			continue
		}
		received += int(res.NumAccepted)
	}
	return received, nil
}
