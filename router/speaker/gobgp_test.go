package speaker

import (
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/galactic-cni/galactic/router/config"
)

func testConfig(gr bool) *config.Config {
	return &config.Config{
		ASN: 65010, RouterID: netip.MustParseAddr("192.0.2.11"), Underlay: netip.MustParseAddr("192.0.2.11"),
		ListenPort: 179, RouteTargetASN: 65000, GracefulRestart: gr, RestartTime: 120 * time.Second,
	}
}

func TestAPeerIsConfiguredForEVPNWithFastRetriesAndGracefulRestart(t *testing.T) {
	g := &GoBGP{cfg: testConfig(true)}
	p := g.peer(config.Peer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 65000, Port: 1179,
		Hold: 9 * time.Second, Keepalive: 3 * time.Second, Password: "k"}, true)
	if c := p.Conf; c.NeighborAddress != "192.0.2.1" || c.PeerAsn != 65000 || c.AuthPassword != "k" {
		t.Errorf("conf %+v", c)
	}
	if tc := p.Timers.Config; tc.HoldTime != 9 || tc.KeepaliveInterval != 3 || tc.ConnectRetry > 2 || tc.IdleHoldTimeAfterReset > 2 {
		t.Errorf("timers %+v: want 9/3 and a retry within two seconds", tc)
	}
	if tr := p.Transport; tr.RemotePort != 1179 || tr.LocalAddress != "192.0.2.11" {
		t.Errorf("transport %+v: want port 1179 from the underlay", tr)
	}
	if len(p.AfiSafis) != 1 {
		t.Fatalf("families %+v, want l2vpn-evpn only", p.AfiSafis)
	}
	af := p.AfiSafis[0]
	if f := af.Config.Family; f.Afi != api.Family_AFI_L2VPN || f.Safi != api.Family_SAFI_EVPN || !af.Config.Enabled {
		t.Errorf("family %+v", af.Config)
	}
	gr := p.GracefulRestart
	if gr == nil || !gr.Enabled || gr.RestartTime != 120 || !gr.LocalRestarting || gr.DeferralTime == 0 {
		t.Errorf("graceful restart %+v: want on, 120 s, restarting, with a deferral", gr)
	}
	// The per-family flag is what sets the forwarding-state bit.
	if af.MpGracefulRestart == nil || !af.MpGracefulRestart.Config.Enabled {
		t.Errorf("l2vpn-evpn graceful restart %+v", af.MpGracefulRestart)
	}
}

func TestAFreshStartIsNotRestartingAndGracefulRestartCanBeOff(t *testing.T) {
	peer := config.Peer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 65000, Port: 179, Hold: 9 * time.Second, Keepalive: 3 * time.Second}
	if gr := (&GoBGP{cfg: testConfig(true)}).peer(peer, false).GracefulRestart; gr == nil || gr.LocalRestarting {
		t.Errorf("fresh start: %+v", gr)
	}
	p := (&GoBGP{cfg: testConfig(false)}).peer(peer, true)
	if p.GracefulRestart != nil || p.AfiSafis[0].MpGracefulRestart != nil {
		t.Errorf("graceful restart off: %+v %+v", p.GracefulRestart, p.AfiSafis[0].MpGracefulRestart)
	}
}

func TestAnIPv6PeerLeavesTheLocalAddressToTheKernel(t *testing.T) {
	p := (&GoBGP{cfg: testConfig(true)}).peer(config.Peer{Address: netip.MustParseAddr("2001:db8::1"), ASN: 65000, Port: 179,
		Hold: 9 * time.Second, Keepalive: 3 * time.Second}, false)
	if p.Transport.LocalAddress != "" {
		t.Errorf("local address %q for an IPv6 peer", p.Transport.LocalAddress)
	}
}

func TestReceivedLeavesOutThisNodesOwnPathsButKeepsItsRDFromAnotherNode(t *testing.T) {
	g := &GoBGP{cfg: testConfig(true)}
	other := route("10.20.0.5/32")
	other.RD.Admin, other.NextHop = netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("192.0.2.12")
	ownRD := other
	ownRD.RD.Admin, ownRD.Prefix = netip.MustParseAddr("192.0.2.11"), netip.MustParsePrefix("10.20.0.6/32")
	ownHop := other
	ownHop.NextHop, ownHop.Prefix = netip.MustParseAddr("192.0.2.11"), netip.MustParsePrefix("10.20.0.7/32")
	var paths []*apiutil.Path
	for _, r := range []Route{other, ownRD, ownHop} {
		p, err := toPath(r)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	// Another family is not ours to read.
	paths = append(paths, &apiutil.Path{Family: bgp.RF_IPv4_UC})
	got := g.received(paths)
	if len(got) != 2 || !got[0].Route.Equal(other) || !got[1].Route.Equal(ownRD) {
		t.Fatalf("received %+v, want the other node's paths, the one with this node's RD included", got)
	}
}

func TestTheWatchersPathsEndOfRIBAndSessionsBecomeOrderedEvents(t *testing.T) {
	g := &GoBGP{cfg: testConfig(true)}
	other := route("10.20.0.5/32")
	other.RD.Admin, other.NextHop = netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("192.0.2.12")
	p, err := toPath(other)
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddr("192.0.2.1")
	p.PeerAddress = peer
	var evs []Event
	cb := g.callbacks(func(ev Event) { evs = append(evs, ev) })
	cb.OnPathUpdate([]*apiutil.Path{p}, time.Now())
	cb.OnPathEor(&apiutil.Path{Family: bgp.RF_RTC_UC, PeerAddress: peer}, time.Now())
	cb.OnPathEor(&apiutil.Path{Family: bgp.RF_EVPN, PeerAddress: peer}, time.Now())
	cb.OnPeerUpdate(&apiutil.WatchEventMessage_PeerEvent{Type: apiutil.PEER_EVENT_STATE, Peer: apiutil.Peer{
		State: apiutil.PeerState{NeighborAddress: peer, SessionState: bgp.BGP_FSM_ESTABLISHED}}}, time.Now())
	if len(evs) != 3 || evs[0].Kind != EventPaths || len(evs[0].Paths) != 1 || evs[0].Peer != "192.0.2.1" ||
		evs[1].Kind != EventEndOfRIB || evs[1].Peer != "192.0.2.1" {
		t.Fatalf("events %+v, want the path, then l2vpn-evpn's End-of-RIB, from 192.0.2.1", evs)
	}
	if st := evs[2].State; evs[2].Kind != EventPeer || !st.Established || st.State != "ESTABLISHED" || evs[2].Peer != "192.0.2.1" {
		t.Fatalf("peer event %+v", evs[2])
	}
}
