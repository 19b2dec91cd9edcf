package speaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/router/config"
)

var evpnFamily = &api.Family{Afi: api.Family_AFI_L2VPN, Safi: api.Family_SAFI_EVPN}

// evpn is evpnFamily as GoBGP's native API names it.
var evpn = bgp.RF_EVPN

// Options configure a GoBGP speaker.
type Options struct {
	Config *config.Config
	// Restarting sets the graceful-restart Restart State and forwarding
	// state bits: this node's kernel still forwards what a previous run
	// programmed.
	Restarting bool
	// Log receives GoBGP's warnings and errors.
	Log *slog.Logger
	// OnEvent gets the ordered stream of what peers send (their paths as
	// received, before any best-path choice, and End-of-RIB) and of session
	// changes, one call at a time. Paths of route targets outside the
	// membership (SetMembership) are left out.
	OnEvent func(Event)
	// Membership is the route targets to import from the start (see
	// SetMembership), before any session comes up.
	Membership []RouteTarget
	// RTCPeers are the peers a previous run saw negotiate rtc: the only
	// ones offered it while Restarting (see rtc.go).
	RTCPeers []netip.Addr
	// Routes are announced before any session comes up, so each peer
	// gets them all in its first burst of UPDATEs instead of one UPDATE
	// per Announce while the sessions run.
	Routes []Route
	// Clock stamps the paths announced; nil is the real clock.
	Clock clock.PassiveClock
}

// GoBGP is the embedded GoBGP server behind the Speaker interface.
type GoBGP struct {
	s     *server.BgpServer
	cfg   *config.Config
	log   *slog.Logger
	clock clock.PassiveClock
	mu    sync.Mutex
	// own are the paths announced, by key: a withdrawal names its path,
	// which GoBGP finds directly, where a UUID makes it walk its whole
	// RIB formatting every path's key.
	own map[Key]*apiutil.Path
	// members is the import filter and RTC membership (rtc.go).
	members membership
	// onEvent is Options.OnEvent; deliver serialises its calls, from the
	// watcher and from SetMembership's catch-up, so the daemon sees one
	// ordered stream.
	onEvent func(Event)
	deliver sync.Mutex
	// rejected caches Rejected's answer while the peers' counts stay.
	rejected rejectedCache
}

// connectRetry and idleHold bring a session back within a couple of
// seconds after a restart, where GoBGP's defaults wait up to two minutes;
// 2 s is the shortest connect retry GoBGP takes.
const (
	connectRetry = 2
	idleHold     = 1
	// deferral bounds how long a restarting speaker waits for its peers'
	// End-of-RIB before it sends its own routes (RFC 4724 4.1).
	deferral = 2
)

// Start runs a GoBGP server with the config's global settings and peers.
func Start(ctx context.Context, o Options) (*GoBGP, error) {
	c := o.Config
	s := newServer(o.Log)
	g := &GoBGP{s: s, cfg: c, log: o.Log, clock: o.Clock, own: map[Key]*apiutil.Path{}}
	if g.clock == nil {
		g.clock = clock.RealClock{}
	}
	global := &api.Global{
		Asn: c.ASN, RouterId: c.RouterID.String(), ListenPort: c.ListenPort,
	}
	if c.ListenPort > 0 {
		global.ListenAddresses = []string{"0.0.0.0", "::"}
	}
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	if err := g.installFilter(ctx, o); err != nil {
		s.Stop()
		return nil, err
	}
	if o.OnEvent != nil {
		g.onEvent = o.OnEvent
		deliver := func(ev Event) {
			g.deliver.Lock()
			defer g.deliver.Unlock()
			o.OnEvent(ev)
		}
		// Paths are read as each peer sends them (Adj-RIB-In, before the
		// import policy), so a session that goes down withdraws nothing
		// here: only a peer's own withdrawal does.
		err := s.WatchEvent(ctx, g.callbacks(deliver), server.WatchUpdate(false, "", ""), server.WatchEor(false), server.WatchPeer())
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("watching the RIB and peers: %w", err)
		}
	}
	for _, r := range o.Routes {
		if err := g.Announce(ctx, r); err != nil {
			s.Stop()
			return nil, err
		}
	}
	for _, p := range c.Peers {
		if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: g.peer(p, o.Restarting)}); err != nil {
			s.Stop()
			return nil, fmt.Errorf("adding peer %s: %w", p.Address, err)
		}
	}
	return g, nil
}

func (g *GoBGP) peer(p config.Peer, restarting bool) *api.Peer {
	c := g.cfg
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry: connectRetry, HoldTime: uint64(p.Hold.Seconds()),
			KeepaliveInterval: uint64(p.Keepalive.Seconds()), IdleHoldTimeAfterReset: idleHold,
		}},
		Transport: &api.Transport{RemotePort: uint32(p.Port), LocalAddress: c.Underlay.String()},
		AfiSafis: []*api.AfiSafi{{
			Config: &api.AfiSafiConfig{Family: evpnFamily, Enabled: true},
		}},
	}
	if g.offerRTC(p.Address, restarting) {
		peer.AfiSafis = append(peer.AfiSafis, rtcAfiSafi(c.GracefulRestart))
	}
	if p.Address.Is6() {
		peer.Transport.LocalAddress = ""
	}
	if c.GracefulRestart {
		peer.GracefulRestart = &api.GracefulRestart{
			Enabled: true, RestartTime: uint32(c.RestartTime.Seconds()),
			DeferralTime: deferral, LocalRestarting: restarting,
		}
		peer.AfiSafis[0].MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
	return peer
}

// Announce implements Speaker.
func (g *GoBGP) Announce(ctx context.Context, r Route) error {
	p, err := toPath(r)
	if err != nil {
		return err
	}
	p.Age = g.clock.Now().Unix()
	if _, err := g.s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
		return fmt.Errorf("announcing %s: %w", r.Key(), err)
	}
	g.mu.Lock()
	g.own[r.Key()] = p
	g.mu.Unlock()
	return nil
}

// Withdraw implements Speaker.
func (g *GoBGP) Withdraw(ctx context.Context, k Key) error {
	g.mu.Lock()
	p, ok := g.own[k]
	g.mu.Unlock()
	if !ok {
		return nil
	}
	if err := g.s.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{p}}); err != nil {
		return fmt.Errorf("withdrawing %s: %w", k, err)
	}
	g.mu.Lock()
	delete(g.own, k)
	g.mu.Unlock()
	return nil
}

// Peers implements Speaker.
func (g *GoBGP) Peers(ctx context.Context) ([]PeerState, error) {
	var out []PeerState
	err := g.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		out = append(out, apiPeerState(p.GetConf().GetNeighborAddress(), p.GetState().GetSessionState()))
	})
	return out, err
}

// Rejected implements Speaker: the paths of peers whose Adj-RIB-In holds
// more than it accepted. Counting first keeps the usual case to one
// ListPeer.
func (g *GoBGP) Rejected(ctx context.Context) ([]Received, error) {
	var peers []string
	counts := map[string][2]uint64{}
	err := g.s.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: false}, func(p *api.Peer) {
		for _, af := range p.GetAfiSafis() {
			st := af.GetState()
			if st.GetFamily().GetAfi() == api.Family_AFI_L2VPN && st.GetReceived() > st.GetAccepted() {
				addr := p.GetConf().GetNeighborAddress()
				peers = append(peers, addr)
				counts[addr] = [2]uint64{st.GetReceived(), st.GetAccepted()}
			}
		}
	})
	if err != nil || len(peers) == 0 {
		return nil, err
	}
	// The import filter refuses the paths of other VPCs too, so a peer of
	// an FRR fabric always holds more than it accepted: list its table
	// again only when its counts moved.
	if out, ok := g.rejected.get(counts); ok {
		return out, nil
	}
	var out []Received
	for _, addr := range peers {
		paths, err := g.adjIn(addr)
		if err != nil {
			return out, fmt.Errorf("listing what %s sent: %w", addr, err)
		}
		for _, r := range g.convert(paths, false) {
			// Only paths of this node's RD tell of a duplicate router ID.
			if r.RD.Admin == g.cfg.RouterID {
				out = append(out, r)
			}
		}
	}
	g.rejected.put(counts, out)
	return out, nil
}

// rejectedCache is Rejected's last answer and the peer counts it was
// read at.
type rejectedCache struct {
	mu     sync.Mutex
	counts map[string][2]uint64
	out    []Received
}

func (c *rejectedCache) get(counts map[string][2]uint64) ([]Received, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil || !maps.Equal(c.counts, counts) {
		return nil, false
	}
	return c.out, true
}

func (c *rejectedCache) put(counts map[string][2]uint64, out []Received) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts, c.out = counts, out
}

// Stop withdraws nothing itself but ends every session with a Cease, so
// peers drop this node's routes at once: the end of a drain.
func (g *GoBGP) Stop(ctx context.Context) error {
	return g.s.StopBgp(ctx, &api.StopBgpRequest{})
}

// toPath is r as GoBGP's path, unstamped: Announce gives it its age.
func toPath(r Route) (*apiutil.Path, error) {
	if !r.Prefix.IsValid() || !r.NextHop.IsValid() || !r.RD.Admin.Is4() {
		return nil, fmt.Errorf("route %s: prefix, next hop and RD are required", r.Key())
	}
	rd, err := bgp.NewRouteDistinguisherIPAddressAS(r.RD.Admin, r.RD.Assigned)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r.Key(), err)
	}
	gw := netip.IPv4Unspecified()
	if r.Prefix.Addr().Is6() {
		gw = netip.IPv6Unspecified()
	}
	nlri, err := bgp.NewEVPNIPPrefixRoute(rd, bgp.EthernetSegmentIdentifier{}, 0, uint8(r.Prefix.Bits()), r.Prefix.Addr(), gw, r.VNI)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r.Key(), err)
	}
	reach, err := bgp.NewPathAttributeMpReachNLRI(evpn, []bgp.PathNLRI{{NLRI: nlri}}, r.NextHop)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r.Key(), err)
	}
	ecs := []bgp.ExtendedCommunityInterface{
		bgp.NewTwoOctetAsSpecificExtended(bgp.EC_SUBTYPE_ROUTE_TARGET, r.RTASN, r.VNI, true),
		bgp.NewEncapExtended(bgp.TUNNEL_TYPE_VXLAN),
		bgp.NewRoutersMacExtended(r.RouterMAC.String()),
	}
	large := []*bgp.LargeCommunity{bgp.NewLargeCommunity(uint32(r.RTASN), LargeCommunityHolderGeneration, r.Generation)}
	if r.Drained {
		large = append(large, bgp.NewLargeCommunity(uint32(r.RTASN), LargeCommunityDrain, 0))
	}
	attrs := []bgp.PathAttributeInterface{
		bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP),
		reach,
		bgp.NewPathAttributeExtendedCommunities(ecs),
		bgp.NewPathAttributeLargeCommunities(large),
	}
	return &apiutil.Path{Family: evpn, Nlri: nlri, Attrs: attrs}, nil
}

// adjIn is what peer sent of l2vpn-evpn (its Adj-RIB-In, before the
// import filter).
func (g *GoBGP) adjIn(peer string) ([]*apiutil.Path, error) {
	var paths []*apiutil.Path
	err := g.s.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: peer, Family: evpn},
		func(_ bgp.NLRI, ps []*apiutil.Path) { paths = append(paths, ps...) })
	return paths, err
}

// sessionStates name GoBGP's FSM states as its API and logs long did,
// which tests and operators read ("ESTABLISHED").
var sessionStates = map[bgp.FSMState]string{
	bgp.BGP_FSM_IDLE: "IDLE", bgp.BGP_FSM_CONNECT: "CONNECT", bgp.BGP_FSM_ACTIVE: "ACTIVE",
	bgp.BGP_FSM_OPENSENT: "OPENSENT", bgp.BGP_FSM_OPENCONFIRM: "OPENCONFIRM", bgp.BGP_FSM_ESTABLISHED: "ESTABLISHED",
}

func peerState(addr netip.Addr, st bgp.FSMState) PeerState {
	name, ok := sessionStates[st]
	if !ok {
		name = "UNKNOWN"
	}
	return PeerState{Address: addr.String(), State: name, Established: st == bgp.BGP_FSM_ESTABLISHED}
}

// apiPeerState is peerState from the protobuf API's listing.
func apiPeerState(addr string, st api.PeerState_SessionState) PeerState {
	return PeerState{Address: addr, State: strings.TrimPrefix(st.String(), "SESSION_STATE_"),
		Established: st == api.PeerState_SESSION_STATE_ESTABLISHED}
}

// callbacks turn one watcher's paths, End-of-RIB and sessions into
// events: GoBGP calls a watcher's callbacks one at a time, in the order it
// processed what they report.
func (g *GoBGP) callbacks(deliver func(Event)) server.WatchEventMessageCallbacks {
	return server.WatchEventMessageCallbacks{
		OnPathUpdate: func(paths []*apiutil.Path, _ time.Time) {
			if ev, ok := g.pathEvent(paths); ok {
				deliver(ev)
			}
		},
		OnPathEor: func(p *apiutil.Path, _ time.Time) {
			if p.Family == evpn {
				deliver(Event{Kind: EventEndOfRIB, Peer: p.PeerAddress.String()})
			}
		},
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if ev.Type == apiutil.PEER_EVENT_STATE {
				st := peerState(ev.Peer.State.NeighborAddress, ev.Peer.State.SessionState)
				if st.Established {
					g.sawSession(ev.Peer.State.NeighborAddress.Unmap(), negotiatedRTC(ev.Peer.State.RemoteCap))
				}
				deliver(Event{Kind: EventPeer, Peer: st.Address, State: st})
			}
		},
	}
}

// pathEvent turns the paths of one UPDATE into an event, if any is
// galactic's to read.
func (g *GoBGP) pathEvent(paths []*apiutil.Path) (Event, bool) {
	rs := g.received(paths)
	if len(rs) == 0 {
		return Event{}, false
	}
	// One UPDATE comes from one peer.
	return Event{Kind: EventPaths, Peer: rs[0].Peer, Paths: rs}, true
}

// received converts paths, leaving out this node's own (its next hop)
// and, unless withdrawn, those of no member route target (the import
// filter, before any RIB copy): a path of this node's RD from another
// next hop is another node's, and is kept so the daemon can report the
// duplicate router ID.
func (g *GoBGP) received(paths []*apiutil.Path) []Received { return g.convert(paths, true) }

func (g *GoBGP) convert(paths []*apiutil.Path, filter bool) []Received {
	var out []Received
	members := g.members.set.Load()
	for _, p := range paths {
		if p.Family != evpn {
			continue
		}
		r, err := fromPath(p, g.cfg.RouteTargetASN)
		if err != nil || r.NextHop == g.cfg.Underlay {
			continue
		}
		// A withdrawal always passes: it may carry no route target, and
		// withdrawing what the daemon never held costs nothing.
		if filter && members != nil && !r.Withdrawn && !members.any(r) {
			g.members.dropped.Add(1)
			continue
		}
		out = append(out, r)
	}
	return out
}

// fromPath reads a type-5 path; rtASN is the route-target AS whose large
// communities are galactic's.
func fromPath(p *apiutil.Path, rtASN uint16) (Received, error) {
	var r Received
	evpnNLRI, ok := p.Nlri.(*bgp.EVPNNLRI)
	if !ok {
		return r, errors.New("not EVPN")
	}
	pr, ok := evpnNLRI.RouteTypeData.(*bgp.EVPNIPPrefixRoute)
	if !ok {
		return r, errors.New("not an IP prefix route")
	}
	rdIP, ok := pr.RD.(*bgp.RouteDistinguisherIPAddressAS)
	if !ok {
		return r, errors.New("not a type-1 RD")
	}
	if !pr.IPPrefix.IsValid() {
		return r, errors.New("bad prefix")
	}
	r.RD = RD{Admin: rdIP.Admin.Unmap(), Assigned: rdIP.Assigned}
	r.Prefix = netip.PrefixFrom(pr.IPPrefix.Unmap(), int(pr.IPPrefixLength))
	r.VNI = pr.Label
	r.Withdrawn = p.Withdrawal
	r.Stale = p.Stale
	r.Peer = p.PeerAddress.String()
	var large []*bgp.LargeCommunity
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeMpReachNLRI:
			if a.Nexthop.IsValid() {
				r.NextHop = a.Nexthop.Unmap()
			}
		case *bgp.PathAttributeExtendedCommunities:
			for _, ec := range a.Value {
				switch ec := ec.(type) {
				case *bgp.TwoOctetAsSpecificExtended:
					if ec.SubType == bgp.EC_SUBTYPE_ROUTE_TARGET {
						r.Targets = append(r.Targets, RouteTarget{ASN: ec.AS, Value: ec.LocalAdmin})
					}
				case *bgp.RouterMacExtended:
					r.RouterMAC = ec.Mac
				}
			}
		case *bgp.PathAttributeLargeCommunities:
			large = a.Values
		}
	}
	// The VNI is the route target's under galactic's AS (another
	// implementation may encode the label differently); a path of another
	// AS keeps its first target for the record.
	for i, t := range r.Targets {
		if t.ASN == rtASN || i == 0 {
			r.RTASN, r.VNI = t.ASN, t.Value
		}
		if t.ASN == rtASN {
			break
		}
	}
	// Only galactic's own large communities count: those under the route
	// target's AS.
	for _, lc := range large {
		if lc.ASN != uint32(rtASN) {
			continue
		}
		switch lc.LocalData1 {
		case LargeCommunityHolderGeneration:
			r.Generation = lc.LocalData2
		case LargeCommunityDrain:
			r.Drained = true
		}
	}
	if r.RouterMAC == nil {
		r.RouterMAC = net.HardwareAddr{}
	}
	return r, nil
}

// newServer is a GoBGP server that logs its warnings and errors to l.
func newServer(l *slog.Logger) *server.BgpServer {
	h := slog.DiscardHandler
	if l != nil {
		h = l.Handler()
	}
	s := server.NewBgpServer(server.LoggerOption(slog.New(warnings{h}), nil))
	go s.Serve()
	return s
}

// warnings passes GoBGP's warnings and errors on, marked as GoBGP's; its
// informational messages (every session event, every policy change) are
// too many for a node's log.
type warnings struct{ slog.Handler }

func (w warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}

func (w warnings) Handle(ctx context.Context, r slog.Record) error {
	r.Message = "gobgp: " + r.Message
	return w.Handler.Handle(ctx, r)
}

func (w warnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnings{w.Handler.WithAttrs(attrs)}
}
func (w warnings) WithGroup(name string) slog.Handler { return warnings{w.Handler.WithGroup(name)} }
