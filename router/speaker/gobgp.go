package speaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"

	"github.com/galactic-cni/galactic/router/config"
)

var evpnFamily = &api.Family{Afi: api.Family_AFI_L2VPN, Safi: api.Family_SAFI_EVPN}

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
}

// GoBGP is the embedded GoBGP server behind the Speaker interface.
type GoBGP struct {
	s   *server.BgpServer
	cfg *config.Config
	log *slog.Logger
	mu  sync.Mutex
	// own are the paths announced, by key: a withdrawal names its path,
	// which GoBGP finds directly, where a UUID makes it walk its whole
	// RIB formatting every path's key.
	own map[Key]*api.Path
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
// seconds after a restart, where GoBGP's defaults wait up to two minutes.
const (
	connectRetry = 1
	idleHold     = 1
	// deferral bounds how long a restarting speaker waits for its peers'
	// End-of-RIB before it sends its own routes (RFC 4724 4.1).
	deferral = 2
)

// Start runs a GoBGP server with the config's global settings and peers.
func Start(ctx context.Context, o Options) (*GoBGP, error) {
	c := o.Config
	s := server.NewBgpServer(server.LoggerOption(&logAdapter{l: o.Log}))
	go s.Serve()
	g := &GoBGP{s: s, cfg: c, log: o.Log, own: map[Key]*api.Path{}}
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
		// One watcher for paths, End-of-RIB and sessions: GoBGP delivers a
		// watcher's events in the order it processed them. Paths are read
		// as each peer sends them (Adj-RIB-In), so a session that goes
		// down withdraws nothing here: only a peer's own withdrawal does.
		req := &api.WatchEventRequest{
			Peer: &api.WatchEventRequest_Peer{},
			Table: &api.WatchEventRequest_Table{Filters: []*api.WatchEventRequest_Table_Filter{
				{Type: api.WatchEventRequest_Table_Filter_ADJIN},
				{Type: api.WatchEventRequest_Table_Filter_EOR},
			}},
		}
		if err := s.WatchEvent(ctx, req, func(r *api.WatchEventResponse) {
			g.deliver.Lock()
			defer g.deliver.Unlock()
			for _, ev := range g.events(r) {
				o.OnEvent(ev)
			}
		}); err != nil {
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
	p, err := toAPI(r)
	if err != nil {
		return err
	}
	if _, err := g.s.AddPath(ctx, &api.AddPathRequest{Path: p}); err != nil {
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
	if err := g.s.DeletePath(ctx, &api.DeletePathRequest{Family: evpnFamily, Path: p}); err != nil {
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
		st := p.GetState()
		out = append(out, PeerState{Address: p.GetConf().GetNeighborAddress(), State: st.GetSessionState().String(),
			Established: st.GetSessionState() == api.PeerState_ESTABLISHED})
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
		var paths []*api.Path
		err := g.s.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_ADJ_IN, Name: addr, Family: evpnFamily},
			func(d *api.Destination) { paths = append(paths, d.GetPaths()...) })
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

func toAPI(r Route) (*api.Path, error) {
	if !r.Prefix.IsValid() || !r.NextHop.IsValid() || !r.RD.Admin.Is4() {
		return nil, fmt.Errorf("route %s: prefix, next hop and RD are required", r.Key())
	}
	rd := bgp.NewRouteDistinguisherIPAddressAS(r.RD.Admin.String(), r.RD.Assigned)
	gw := "0.0.0.0"
	if r.Prefix.Addr().Is6() {
		gw = "::"
	}
	nlri := bgp.NewEVPNIPPrefixRoute(rd, bgp.EthernetSegmentIdentifier{}, 0, uint8(r.Prefix.Bits()), r.Prefix.Addr().String(), gw, r.VNI)
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
		bgp.NewPathAttributeMpReachNLRI(r.NextHop.String(), []bgp.AddrPrefixInterface{nlri}),
		bgp.NewPathAttributeExtendedCommunities(ecs),
		bgp.NewPathAttributeLargeCommunities(large),
	}
	return apiutil.NewPath(nlri, false, attrs, time.Now())
}

// events turns one watch response into stream events.
func (g *GoBGP) events(r *api.WatchEventResponse) []Event {
	if p := r.GetPeer(); p != nil {
		if p.Type != api.WatchEventResponse_PeerEvent_STATE {
			return nil
		}
		st := p.Peer.GetState()
		return []Event{{Kind: EventPeer, Peer: st.GetNeighborAddress(), State: PeerState{Address: st.GetNeighborAddress(),
			State: st.GetSessionState().String(), Established: st.GetSessionState() == api.PeerState_ESTABLISHED}}}
	}
	var out []Event
	var paths []*api.Path
	flush := func() {
		if rs := g.received(paths); len(rs) > 0 {
			// One UPDATE comes from one peer.
			out = append(out, Event{Kind: EventPaths, Peer: rs[0].Peer, Paths: rs})
		}
		paths = nil
	}
	for _, p := range r.GetTable().GetPaths() {
		if p.GetNlri() == nil {
			// An End-of-RIB marker.
			if p.GetFamily().GetAfi() == api.Family_AFI_L2VPN && p.GetFamily().GetSafi() == api.Family_SAFI_EVPN {
				flush()
				out = append(out, Event{Kind: EventEndOfRIB, Peer: p.GetNeighborIp()})
			}
			continue
		}
		paths = append(paths, p)
	}
	flush()
	return out
}

// received converts paths, leaving out this node's own (its next hop)
// and, unless withdrawn, those of no member route target (the import
// filter, before any RIB copy): a path of this node's RD from another
// next hop is another node's, and is kept so the daemon can report the
// duplicate router ID.
func (g *GoBGP) received(paths []*api.Path) []Received { return g.convert(paths, true) }

func (g *GoBGP) convert(paths []*api.Path, filter bool) []Received {
	var out []Received
	members := g.members.set.Load()
	for _, p := range paths {
		if p.GetFamily().GetAfi() != api.Family_AFI_L2VPN {
			continue
		}
		r, err := fromAPI(p, g.cfg.RouteTargetASN)
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

// fromAPI reads a type-5 path; rtASN is the route-target AS whose large
// communities are galactic's.
func fromAPI(p *api.Path, rtASN uint16) (Received, error) {
	var r Received
	nlri, err := apiutil.GetNativeNlri(p)
	if err != nil {
		return r, err
	}
	evpn, ok := nlri.(*bgp.EVPNNLRI)
	if !ok {
		return r, errors.New("not EVPN")
	}
	pr, ok := evpn.RouteTypeData.(*bgp.EVPNIPPrefixRoute)
	if !ok {
		return r, errors.New("not an IP prefix route")
	}
	rdIP, ok := pr.RD.(*bgp.RouteDistinguisherIPAddressAS)
	if !ok {
		return r, errors.New("not a type-1 RD")
	}
	admin, _ := netip.AddrFromSlice(rdIP.Admin.To4())
	addr, ok := netip.AddrFromSlice(pr.IPPrefix)
	if !ok {
		return r, errors.New("bad prefix")
	}
	r.RD = RD{Admin: admin, Assigned: rdIP.Assigned}
	r.Prefix = netip.PrefixFrom(addr.Unmap(), int(pr.IPPrefixLength))
	r.VNI = pr.Label
	r.Withdrawn = p.IsWithdraw
	r.Stale = p.Stale
	r.Peer = p.NeighborIp
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return r, err
	}
	var large []*bgp.LargeCommunity
	for _, a := range attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeMpReachNLRI:
			if nh, ok := netip.AddrFromSlice(a.Nexthop); ok {
				r.NextHop = nh.Unmap()
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

// logAdapter passes GoBGP's warnings and errors to slog.
type logAdapter struct{ l *slog.Logger }

func (a *logAdapter) log(level slog.Level, msg string, f gobgplog.Fields) {
	if a.l == nil {
		return
	}
	attrs := make([]any, 0, 2*len(f))
	for k, v := range f {
		attrs = append(attrs, k, fmt.Sprint(v))
	}
	a.l.Log(context.Background(), level, "gobgp: "+msg, attrs...)
}

func (a *logAdapter) Panic(msg string, f gobgplog.Fields) { a.log(slog.LevelError, msg, f); panic(msg) }
func (a *logAdapter) Fatal(msg string, f gobgplog.Fields) { a.log(slog.LevelError, msg, f) }
func (a *logAdapter) Error(msg string, f gobgplog.Fields) { a.log(slog.LevelError, msg, f) }
func (a *logAdapter) Warn(msg string, f gobgplog.Fields)  { a.log(slog.LevelWarn, msg, f) }
func (a *logAdapter) Info(msg string, f gobgplog.Fields)  {}
func (a *logAdapter) Debug(msg string, f gobgplog.Fields) {}
func (a *logAdapter) SetLevel(gobgplog.LogLevel)          {}
func (a *logAdapter) GetLevel() gobgplog.LogLevel         { return gobgplog.WarnLevel }
