package speaker

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/galactic-cni/galactic/router/config"
)

// freePort is a TCP port nothing listens on at addr.
func freePort(t *testing.T, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Skipf("no loopback address %s: %v", addr, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// upstream is a plain GoBGP peer at 127.0.0.2 that announces routes the
// way galactic-router does, with rtc so it honours the node's membership
// only when withRTC.
func upstream(t *testing.T, port int, withRTC bool) *server.BgpServer {
	t.Helper()
	ctx := context.Background()
	s := server.NewBgpServer()
	go s.Serve()
	t.Cleanup(s.Stop)
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: 65000, RouterId: "127.0.0.2",
		ListenPort: int32(port), ListenAddresses: []string{"127.0.0.2"}}}); err != nil {
		t.Fatal(err)
	}
	afs := []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: evpnFamily, Enabled: true}}}
	if withRTC {
		afs = append(afs, rtcAfiSafi(false))
	}
	if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
		Conf:     &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: 65000},
		Timers:   &api.Timers{Config: &api.TimersConfig{ConnectRetry: 1, HoldTime: 9, KeepaliveInterval: 3}},
		AfiSafis: afs, Transport: &api.Transport{PassiveMode: true},
	}}); err != nil {
		t.Fatal(err)
	}
	for vni := uint32(1); vni <= 3; vni++ {
		r := Route{RD: RD{Admin: netip.MustParseAddr("127.0.0.2"), Assigned: uint16(vni)}, Prefix: netip.MustParsePrefix("10.0.0.1/32"),
			VNI: vni, RTASN: 65000, NextHop: netip.MustParseAddr("127.0.0.2"), RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(vni)}}
		p, err := toPath(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// ribOf follows the best paths a speaker reports, by VNI.
type ribOf struct {
	mu   sync.Mutex
	vnis map[uint32]bool
}

func (r *ribOf) event(ev Event) {
	if ev.Kind == EventPaths {
		r.apply(ev.Paths)
	}
}

func (r *ribOf) apply(rs []Received) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range rs {
		if x.Withdrawn {
			delete(r.vnis, x.VNI)
		} else {
			r.vnis[x.VNI] = true
		}
	}
}

func (r *ribOf) waitFor(t *testing.T, want ...uint32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		ok := len(r.vnis) == len(want)
		for _, v := range want {
			ok = ok && r.vnis[v]
		}
		got := len(r.vnis)
		r.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the RIB holds %d VNIs, want exactly %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testMembership(t *testing.T, withRTC bool) {
	port := freePort(t, "127.0.0.2")
	up := upstream(t, port, withRTC)
	rib := &ribOf{vnis: map[uint32]bool{}}
	cfg := &config.Config{ASN: 65000, RouterID: netip.MustParseAddr("127.0.0.1"), Underlay: netip.MustParseAddr("127.0.0.1"),
		ListenPort: -1, RouteTargetASN: 65000,
		Peers: []config.Peer{{Address: netip.MustParseAddr("127.0.0.2"), ASN: 65000, Port: uint16(port), Hold: 9 * time.Second, Keepalive: 3 * time.Second}}}
	ctx := context.Background()
	g, err := Start(ctx, Options{Config: cfg, OnEvent: rib.event})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Stop(ctx) })
	if err := g.SetMembership(ctx, []RouteTarget{{65000, 1}}); err != nil {
		t.Fatal(err)
	}
	rib.waitFor(t, 1)
	if err := g.SetMembership(ctx, []RouteTarget{{65000, 1}, {65000, 3}}); err != nil {
		t.Fatal(err)
	}
	rib.waitFor(t, 1, 3)
	if err := g.SetMembership(ctx, []RouteTarget{{65000, 3}}); err != nil {
		t.Fatal(err)
	}
	rib.waitFor(t, 3)
	// What the peer holds for the node: with rtc only the member's path
	// reaches the node's adj-RIB-in, without rtc every path does (and the
	// watcher passes one).
	wantIn := 3
	if withRTC {
		wantIn = 1
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var members []string
		if err := up.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: "127.0.0.1", Family: rtc}, func(_ bgp.NLRI, ps []*apiutil.Path) {
			for _, p := range ps {
				if m, ok := p.Nlri.(*bgp.RouteTargetMembershipNLRI); ok && m.RouteTarget != nil {
					members = append(members, m.RouteTarget.String())
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		membersOK := !withRTC || (len(members) == 1 && members[0] == "65000:3")
		in, err := g.AdjIn(ctx)
		if err == nil && in == wantIn && membersOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("adj-RIB-in %d (%v), want %d; the peer holds memberships %v", in, err, wantIn, members)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWithoutRTCTheImportFilterKeepsOtherVPCsOutOfTheRIBAndFollowsTheMembership(t *testing.T) {
	testMembership(t, false)
}

func TestWithRTCThePeerSendsOnlyTheMembersRoutes(t *testing.T) { testMembership(t, true) }

func TestRTCIsOfferedOnAFreshStartAndOnARestartOnlyToPeersKnownToNegotiateIt(t *testing.T) {
	rr, frr := netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.1")
	g := &GoBGP{cfg: testConfig(true), members: membership{known: map[netip.Addr]bool{rr: true}}}
	families := func(addr netip.Addr, restarting bool) int {
		return len(g.peer(config.Peer{Address: addr, ASN: 65000, Port: 179, Hold: 9 * time.Second, Keepalive: 3 * time.Second}, restarting).AfiSafis)
	}
	if families(frr, false) != 2 || families(rr, false) != 2 {
		t.Error("a fresh start must offer rtc to every peer")
	}
	if families(rr, true) != 2 {
		t.Error("a restart must offer rtc to a peer known to negotiate it")
	}
	if families(frr, true) != 1 {
		t.Error("a restart must not offer rtc to a peer not known to negotiate it (GoBGP would send it an rtc End-of-RIB)")
	}
}
