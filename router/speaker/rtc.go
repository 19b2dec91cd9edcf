package speaker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// rtcFamily is RFC 4684 route-target membership (ipv4 / SAFI 132).
var rtcFamily = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_ROUTE_TARGET_CONSTRAINTS}

// rtc is rtcFamily as GoBGP's native API names it.
var rtc = bgp.RF_RTC_UC

// Names of the import filter's GoBGP objects.
const (
	filterSet    = "galactic-vpcs"
	filterPolicy = "galactic-import"
)

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

// membership is the route targets the node imports: the import filter
// and the RTC paths announced for them.
type membership struct {
	mu   sync.Mutex
	rts  map[RouteTarget]*apiutil.Path // RTC path by route target (see GoBGP.own)
	init bool
	// pattern is the filter's one entry.
	pattern string
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

// filterRegexp matches the route targets of rts, as GoBGP prints a
// two-octet-AS route target; none matches nothing.
func filterRegexp(rts []RouteTarget) string {
	if len(rts) == 0 {
		return "^$"
	}
	byASN := map[uint16][]string{}
	for _, rt := range rts {
		byASN[rt.ASN] = append(byASN[rt.ASN], strconv.FormatUint(uint64(rt.Value), 10))
	}
	var alts []string
	for asn, vnis := range byASN {
		slices.Sort(vnis)
		alts = append(alts, fmt.Sprintf("%d:(?:%s)", asn, strings.Join(vnis, "|")))
	}
	slices.Sort(alts)
	return "^(?:" + strings.Join(alts, "|") + ")$"
}

// installFilter sets up the import policy, with the initial membership,
// before any peer is added: paths of l2vpn-evpn from peers are accepted
// only with a route target of the membership; this node's own paths and
// other families pass.
func (g *GoBGP) installFilter(ctx context.Context, o Options) error {
	g.members.known, g.members.seen = map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, a := range o.RTCPeers {
		g.members.known[a] = true
	}
	g.members.pattern = "rt:" + filterRegexp(nil)
	if err := g.s.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_DEFINED_TYPE_EXT_COMMUNITY, Name: filterSet, List: []string{g.members.pattern},
	}}); err != nil {
		return fmt.Errorf("import filter: %w", err)
	}
	accept := &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT}
	policy := &api.Policy{Name: filterPolicy, Statements: []*api.Statement{
		{Name: "own-paths", Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL}, Actions: accept},
		{Name: "member-route-targets", Conditions: &api.Conditions{
			AfiSafiIn:       []*api.Family{evpnFamily},
			ExtCommunitySet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: filterSet},
		}, Actions: accept},
		{Name: "other-route-targets", Conditions: &api.Conditions{AfiSafiIn: []*api.Family{evpnFamily}},
			Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT}},
	}}
	if err := g.s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: policy}); err != nil {
		return fmt.Errorf("import filter: %w", err)
	}
	if err := g.s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT,
		Policies: []*api.Policy{{Name: filterPolicy}}, DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		return fmt.Errorf("import filter: %w", err)
	}
	g.members.rts = map[RouteTarget]*apiutil.Path{}
	g.members.set.Store(&memberSet{})
	g.members.init = true
	return g.SetMembership(ctx, o.Membership)
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

// RTCPeers are the peers known to negotiate rtc: what the sessions up
// now negotiated, and for the others what was known before.
func (g *GoBGP) RTCPeers(ctx context.Context) ([]netip.Addr, error) {
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
	g.members.mu.Lock()
	defer g.members.mu.Unlock()
	for a, rtc := range up {
		g.members.seen[a] = rtc
	}
	var out []netip.Addr
	for _, p := range g.cfg.Peers {
		rtc, seen := g.members.seen[p.Address]
		if rtc || (!seen && g.members.known[p.Address]) {
			out = append(out, p.Address)
		}
	}
	return out, nil
}

// SetMembership makes rts the route targets this node imports. Paths of
// other route targets are dropped as they arrive, before the RIB; a peer
// that negotiated rtc is told the membership (RFC 4684) and sends only
// those. An added route target gets the paths the peers already sent at
// once (a soft reset in), a removed one loses them. Unchanged, it does
// nothing.
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
	for _, rt := range removed {
		if err := g.s.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{m.rts[rt]}}); err != nil {
			return fmt.Errorf("withdrawing membership %s: %w", rt, err)
		}
		delete(m.rts, rt)
	}
	list := make([]RouteTarget, 0, len(want))
	for rt := range want {
		list = append(list, rt)
	}
	// GoBGP's replace swaps the set object under the policy's feet (the
	// policy keeps matching the old one), so the new pattern is appended
	// and the old one removed.
	next := "rt:" + filterRegexp(list)
	if err := g.s.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_DEFINED_TYPE_EXT_COMMUNITY, Name: filterSet, List: []string{next},
	}}); err != nil {
		return fmt.Errorf("import filter: %w", err)
	}
	if err := g.s.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_DEFINED_TYPE_EXT_COMMUNITY, Name: filterSet, List: []string{m.pattern},
	}}); err != nil {
		return fmt.Errorf("import filter: %w", err)
	}
	m.pattern = next
	set := memberSet(want)
	m.set.Store(&set)
	if err := g.s.ResetPeer(ctx, &api.ResetPeerRequest{Address: "all", Soft: true, Direction: api.ResetPeerRequest_DIRECTION_IN}); err != nil {
		return fmt.Errorf("re-reading the peers' paths: %w", err)
	}
	for _, rt := range added {
		p, err := rtcPath(g.cfg.ASN, &rt, g.cfg.Underlay)
		if err != nil {
			return err
		}
		if _, err := g.s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
			return fmt.Errorf("announcing membership %s: %w", rt, err)
		}
		m.rts[rt] = p
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
// membership (every route target) a reflector offers its clients.
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
	return &apiutil.Path{Family: rtc, Nlri: nlri, Attrs: attrs, Age: time.Now().Unix()}, nil
}

// AdjIn counts, over the configured peers, the l2vpn-evpn paths received
// (adj-RIB-in, before the import filter) and those the filter keeps out
// of the RIB.
func (g *GoBGP) AdjIn(ctx context.Context) (received, filtered int, err error) {
	for _, p := range g.cfg.Peers {
		res, err := g.s.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Family: evpnFamily, Name: p.Address.String()})
		if err != nil {
			// A peer that never came up has no table.
			continue
		}
		received += int(res.NumAccepted)
	}
	res, err := g.s.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: evpnFamily})
	if err != nil {
		return received, 0, err
	}
	g.mu.Lock()
	own := len(g.own)
	g.mu.Unlock()
	return received, max(0, received-(int(res.NumPath)-own)), nil
}
