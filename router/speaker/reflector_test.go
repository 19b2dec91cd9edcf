package speaker

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/galactic-cni/galactic/router/config"
)

// node is a galactic speaker at addr, a client of the reflector at
// rr:port, that announces one route per VNI of announce from its start.
func node(t *testing.T, addr string, rr netip.Addr, port int, rib *ribOf, announce ...uint32) *GoBGP {
	t.Helper()
	a := netip.MustParseAddr(addr)
	cfg := &config.Config{ASN: 65000, RouterID: a, Underlay: a, ListenPort: -1, RouteTargetASN: 65000, GracefulRestart: true,
		RestartTime: 120 * time.Second,
		Peers:       []config.Peer{{Address: rr, ASN: 65000, Port: uint16(port), Hold: 9 * time.Second, Keepalive: 3 * time.Second}}}
	ctx := context.Background()
	// Routes given at the start go out with the first UPDATEs.
	var routes []Route
	for _, vni := range announce {
		routes = append(routes, Route{RD: RD{Admin: a, Assigned: uint16(vni)}, Prefix: netip.PrefixFrom(a, 32), VNI: vni, RTASN: 65000,
			NextHop: a, RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(vni)}})
	}
	g, err := Start(ctx, Options{Config: cfg, OnEvent: rib.event, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Stop(ctx) })
	return g
}

func TestTheReflectorSendsEachClientOnlyTheRoutesOfItsMembership(t *testing.T) {
	rrAddr := netip.MustParseAddr("127.0.0.3")
	port := freePort(t, rrAddr.String())
	ctx := context.Background()
	rr, err := StartReflector(ctx, ReflectorOptions{Config: &config.Config{Role: config.RoleReflector, ASN: 65000,
		RouterID: rrAddr, Underlay: rrAddr, ClusterID: rrAddr, ListenPort: int32(port), GracefulRestart: true, RestartTime: 120 * time.Second,
		// a is listed, b accepted from a range.
		Peers:        []config.Peer{{Address: netip.MustParseAddr("127.0.0.1"), ASN: 65000, Port: 179, Hold: 9 * time.Second, Keepalive: 3 * time.Second}},
		ClientRanges: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rr.Stop(ctx) })
	ribA, ribB := &ribOf{vnis: map[uint32]bool{}}, &ribOf{vnis: map[uint32]bool{}}
	a := node(t, "127.0.0.1", rrAddr, port, ribA)
	b := node(t, "127.0.0.2", rrAddr, port, ribB, 1, 2, 3)
	if err := a.SetMembership(ctx, []RouteTarget{{65000, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetMembership(ctx, nil); err != nil {
		t.Fatal(err)
	}
	ribA.waitFor(t, 2)
	// The reflector holds all of b's routes (its default membership asks
	// for everything) and sent a the one route of its membership.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := rr.Stats(ctx)
		in, _ := a.AdjIn(ctx)
		sentA, _ := rr.SentTo(ctx, "127.0.0.1")
		sentB, _ := rr.SentTo(ctx, "127.0.0.2")
		if err == nil && st.Paths == 3 && st.Memberships == 1 && len(st.Clients) == 2 && sentA == 1 && sentB == 0 && in == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reflector %+v (%v), sent a %d and b %d; a's adj-RIB-in %d", st, err, sentA, sentB, in)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Membership follows the VPCs: a route target added is sent at once.
	if err := a.SetMembership(ctx, []RouteTarget{{65000, 2}, {65000, 3}}); err != nil {
		t.Fatal(err)
	}
	ribA.waitFor(t, 2, 3)
	if err := a.SetMembership(ctx, []RouteTarget{{65000, 3}}); err != nil {
		t.Fatal(err)
	}
	ribA.waitFor(t, 3)
	ribB.waitFor(t)
	// b hears the reflector's default membership and none of a's: each
	// would make it send the paths of that route target again.
	var heard []string
	if err := b.s.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: rrAddr.String(), Family: rtc},
		func(_ bgp.NLRI, ps []*apiutil.Path) {
			for _, p := range ps {
				heard = append(heard, p.Nlri.String())
			}
		}); err != nil {
		t.Fatal(err)
	}
	if len(heard) != 1 || heard[0] != bgp.NewRouteTargetMembershipNLRI(0, nil).String() {
		t.Errorf("b holds the memberships %v from the reflector, want only its default", heard)
	}
	// A withdrawal reaches the members.
	bAddr := netip.MustParseAddr("127.0.0.2")
	if err := b.Withdraw(ctx, Key{RD: RD{Admin: bAddr, Assigned: 3}, Prefix: netip.PrefixFrom(bAddr, 32)}); err != nil {
		t.Fatal(err)
	}
	ribA.waitFor(t)
}
