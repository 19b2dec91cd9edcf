package speaker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/server"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/router/config"
)

// clientGroup is the peer group of a reflector's clients.
const clientGroup = "clients"

// Reflector is GoBGP as an l2vpn-evpn route reflector with route-target
// constraint: every client gets only the routes of the route targets it
// advertised membership of; a client without rtc gets every route.
type Reflector struct {
	s   *server.BgpServer
	cfg *config.Config
}

// ReflectorOptions configure StartReflector.
type ReflectorOptions struct {
	Config *config.Config
	Log    *slog.Logger
	// OnPeer is called when a client's session changes state.
	OnPeer func(PeerState)
	// Clock stamps the default membership; nil is the real clock.
	Clock clock.PassiveClock
}

// StartReflector runs the reflector: clients of the config's clientRanges
// are accepted as they connect, its peers are clients too. It originates
// only the default membership, so every client sends it all its routes.
func StartReflector(ctx context.Context, o ReflectorOptions) (*Reflector, error) {
	c := o.Config
	s := newServer(o.Log)
	r := &Reflector{s: s, cfg: c}
	global := &api.Global{Asn: c.ASN, RouterId: c.RouterID.String(), ListenPort: c.ListenPort,
		ListenAddresses: []string{"0.0.0.0", "::"}}
	if c.Underlay.IsValid() {
		global.ListenAddresses = []string{c.Underlay.String()}
	}
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	fail := func(err error) (*Reflector, error) { s.Stop(); return nil, err }
	if o.OnPeer != nil {
		if err := s.WatchEvent(ctx, server.WatchEventMessageCallbacks{
			OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
				if ev.Type == apiutil.PEER_EVENT_STATE {
					o.OnPeer(peerState(ev.Peer.State.NeighborAddress, ev.Peer.State.SessionState))
				}
			},
		}, server.WatchPeer()); err != nil {
			return fail(fmt.Errorf("watching peers: %w", err))
		}
	}
	if err := r.keepMemberships(ctx); err != nil {
		return fail(err)
	}
	if err := s.AddPeerGroup(ctx, &api.AddPeerGroupRequest{PeerGroup: r.group()}); err != nil {
		return fail(fmt.Errorf("adding the client group: %w", err))
	}
	for _, p := range c.ClientRanges {
		if err := s.AddDynamicNeighbor(ctx, &api.AddDynamicNeighborRequest{DynamicNeighbor: &api.DynamicNeighbor{
			Prefix: p.String(), PeerGroup: clientGroup,
		}}); err != nil {
			return fail(fmt.Errorf("accepting clients of %s: %w", p, err))
		}
	}
	for _, p := range c.Peers {
		if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: r.client(p)}); err != nil {
			return fail(fmt.Errorf("adding client %s: %w", p.Address, err))
		}
	}
	def, err := rtcPath(c.ASN, nil, c.RouterID)
	if err != nil {
		return fail(err)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	def.Age = o.Clock.Now().Unix()
	if _, err := s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{def}}); err != nil {
		return fail(fmt.Errorf("announcing the default membership: %w", err))
	}
	return r, nil
}

// reflectorExport is the reflector's export policy's name in GoBGP.
const reflectorExport = "galactic-reflector-export"

// keepMemberships makes the reflector send its clients its own default
// membership and none of theirs. The default already asks each client for
// everything; a client's membership reflected to the others would make
// each of them (GoBGP) send again every path of that route target.
func (r *Reflector) keepMemberships(ctx context.Context) error {
	if err := ownOnly(ctx, r.s, reflectorExport, api.PolicyDirection_POLICY_DIRECTION_EXPORT, rtcFamily); err != nil {
		return fmt.Errorf("export policy: %w", err)
	}
	return nil
}

func (r *Reflector) families() []*api.AfiSafi {
	afs := []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: evpnFamily, Enabled: true}}, rtcAfiSafi(r.cfg.GracefulRestart)}
	if r.cfg.GracefulRestart {
		afs[0].MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
	return afs
}

// group is what every client shares: iBGP reflection in the cluster,
// both families, passive (nodes connect out) and graceful restart, so
// clients keep the reflected routes while the reflector restarts.
func (r *Reflector) group() *api.PeerGroup {
	c := r.cfg
	g := &api.PeerGroup{
		Conf: &api.PeerGroupConf{PeerGroupName: clientGroup, PeerAsn: c.ASN},
		Timers: &api.Timers{Config: &api.TimersConfig{ConnectRetry: connectRetry, IdleHoldTimeAfterReset: idleHold,
			HoldTime: uint64(config.ClientHold.Seconds()), KeepaliveInterval: uint64(config.ClientKeepalive.Seconds())}},
		RouteReflector: &api.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: c.ClusterID.String()},
		Transport:      &api.Transport{PassiveMode: true},
		AfiSafis:       r.families(),
	}
	if c.GracefulRestart {
		g.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(c.RestartTime.Seconds())}
	}
	return g
}

func (r *Reflector) client(p config.Peer) *api.Peer {
	c := r.cfg
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, AuthPassword: p.Password, PeerGroup: clientGroup},
		Timers: &api.Timers{Config: &api.TimersConfig{ConnectRetry: connectRetry, IdleHoldTimeAfterReset: idleHold,
			HoldTime: uint64(p.Hold.Seconds()), KeepaliveInterval: uint64(p.Keepalive.Seconds())}},
		RouteReflector: &api.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: c.ClusterID.String()},
		Transport:      &api.Transport{PassiveMode: true, RemotePort: uint32(p.Port)},
		AfiSafis:       r.families(),
	}
	if c.GracefulRestart {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(c.RestartTime.Seconds())}
	}
	return peer
}

// ReflectorStats are the reflector's counts for its metrics.
type ReflectorStats struct {
	// Paths is every l2vpn-evpn path the reflector holds.
	Paths int
	// Memberships is the RTC paths it holds from clients.
	Memberships int
	// Clients are the sessions.
	Clients []PeerState
}

// Stats reads the counts from GoBGP; they cost no walk of the tables.
func (r *Reflector) Stats(ctx context.Context) (ReflectorStats, error) {
	var st ReflectorStats
	if res, err := r.s.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: evpnFamily}); err == nil {
		st.Paths = int(res.NumPath)
	}
	if res, err := r.s.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: rtcFamily}); err == nil {
		// Less the reflector's own default membership.
		st.Memberships = max(0, int(res.NumPath)-1)
	}
	err := r.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		ps := p.GetState()
		st.Clients = append(st.Clients, apiPeerState(ps.GetNeighborAddress(), ps.GetSessionState()))
	})
	return st, err
}

// SentTo counts the l2vpn-evpn paths the reflector sends client (its
// adj-RIB-out); GoBGP computes it by walking the table.
func (r *Reflector) SentTo(ctx context.Context, client string) (int, error) {
	res, err := r.s.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_ADJ_OUT, Family: evpnFamily, Name: client})
	if err != nil {
		return 0, err
	}
	return int(res.NumPath), nil
}

// Stop ends every session without withdrawing anything first.
func (r *Reflector) Stop(ctx context.Context) error {
	return r.s.StopBgp(ctx, &api.StopBgpRequest{})
}
