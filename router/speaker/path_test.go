package speaker

import (
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func route(prefix string) Route {
	return Route{
		RD:     RD{Admin: netip.MustParseAddr("192.0.2.11"), Assigned: 7},
		Prefix: netip.MustParsePrefix(prefix), VNI: 10100, RTASN: 65000,
		NextHop: netip.MustParseAddr("192.0.2.11"), RouterMAC: mac("02:00:c0:00:02:0b"),
	}
}

// overTheWire is p as a peer reads it: serialised into an UPDATE and
// parsed back.
func overTheWire(t *testing.T, p *apiutil.Path) *apiutil.Path {
	t.Helper()
	b, err := bgp.NewBGPUpdateMessage(nil, p.Attrs, nil).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	m, err := bgp.ParseBGPMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	u := m.Body.(*bgp.BGPUpdate)
	out := &apiutil.Path{Family: p.Family, Attrs: u.PathAttributes}
	for _, a := range u.PathAttributes {
		if mp, ok := a.(*bgp.PathAttributeMpReachNLRI); ok && len(mp.Value) == 1 {
			out.Nlri = mp.Value[0].NLRI
		}
	}
	return out
}

func TestARouteSurvivesTheTripOverTheWire(t *testing.T) {
	four, six := route("10.20.0.5/32"), route("fd20::5/128")
	drained := route("10.20.0.0/24")
	drained.Drained, drained.Generation = true, 4
	big := route("fd20::/64")
	big.VNI, big.RTASN, big.Generation, big.RD.Assigned = 16777215, 1, 4294967295, 65535
	cases := []struct {
		name string
		r    Route
	}{
		{"an IPv4 host route", four},
		{"an IPv6 host route", six},
		{"a drained route with a generation", drained},
		{"the largest VNI, generation and RD number", big},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := toPath(tc.r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := fromPath(overTheWire(t, p), tc.r.RTASN)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Route.Equal(tc.r) {
				t.Fatalf("got  %+v\nwant %+v", got.Route, tc.r)
			}
			if got.Withdrawn || got.Stale {
				t.Errorf("an announcement came back withdrawn %v or stale %v", got.Withdrawn, got.Stale)
			}
		})
	}
}

func TestTheAnnouncedPathIsAnEVPNType5RouteAsRFC9136Describes(t *testing.T) {
	p, err := toPath(route("fd20::5/128"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Family != bgp.RF_EVPN {
		t.Fatalf("family %v, want l2vpn-evpn", p.Family)
	}
	pr := p.Nlri.(*bgp.EVPNNLRI).RouteTypeData.(*bgp.EVPNIPPrefixRoute)
	if pr.ETag != 0 || pr.ESI.Type != 0 || !pr.GWIPAddress.IsUnspecified() || pr.Label != 10100 {
		t.Errorf("tag %d, ESI %v, gateway %v, label %d: want 0, 0, ::, the VNI", pr.ETag, pr.ESI, pr.GWIPAddress, pr.Label)
	}
	var rt, encap bool
	for _, a := range p.Attrs {
		if ecs, ok := a.(*bgp.PathAttributeExtendedCommunities); ok {
			for _, ec := range ecs.Value {
				switch ec := ec.(type) {
				case *bgp.TwoOctetAsSpecificExtended:
					rt = ec.SubType == bgp.EC_SUBTYPE_ROUTE_TARGET && ec.AS == 65000 && ec.LocalAdmin == 10100
				case *bgp.EncapExtended:
					encap = ec.TunnelType == bgp.TUNNEL_TYPE_VXLAN
				}
			}
		}
		if _, ok := a.(*bgp.PathAttributeCommunities); ok {
			t.Error("an undrained route carries the drain community")
		}
	}
	if !rt || !encap {
		t.Errorf("route target 65000:10100 %v, VXLAN encapsulation %v", rt, encap)
	}
}

func TestTheVNIComesFromTheRouteTargetWhenTheLabelDiffers(t *testing.T) {
	// The route target is what import matches on; the label of another
	// implementation may be encoded differently.
	r := route("10.20.0.5/32")
	p, err := toPath(r)
	if err != nil {
		t.Fatal(err)
	}
	p.Nlri.(*bgp.EVPNNLRI).RouteTypeData.(*bgp.EVPNIPPrefixRoute).Label = 1
	got, err := fromPath(p, 65000)
	if err != nil || got.VNI != 10100 {
		t.Fatalf("VNI %d (%v), want the route target's 10100", got.VNI, err)
	}
}

func TestAWithdrawalFromAPeerComesBackWithdrawnFromThatPeer(t *testing.T) {
	p, err := toPath(route("10.20.0.5/32"))
	if err != nil {
		t.Fatal(err)
	}
	p.Withdrawal, p.Stale, p.PeerAddress = true, true, netip.MustParseAddr("192.0.2.1")
	got, err := fromPath(p, 65000)
	if err != nil || !got.Withdrawn || !got.Stale || got.Peer != "192.0.2.1" {
		t.Fatalf("got %+v (%v)", got, err)
	}
}

func TestARouteWithoutPrefixNextHopOrIPv4RDIsRefused(t *testing.T) {
	noPrefix, noHop, noRD := route("10.20.0.5/32"), route("10.20.0.5/32"), route("10.20.0.5/32")
	noPrefix.Prefix, noHop.NextHop, noRD.RD.Admin = netip.Prefix{}, netip.Addr{}, netip.MustParseAddr("2001:db8::1")
	for _, r := range []Route{noPrefix, noHop, noRD} {
		if _, err := toPath(r); err == nil {
			t.Errorf("toPath(%+v) accepted", r)
		}
	}
}

func TestARDReadsBackFromItsText(t *testing.T) {
	for _, s := range []string{"192.0.2.11:1", "10.0.0.1:0", "255.255.255.255:65535"} {
		d, err := ParseRD(s)
		if err != nil {
			t.Fatalf("ParseRD(%q): %v", s, err)
		}
		if d.String() != s {
			t.Errorf("ParseRD(%q).String() = %q", s, d)
		}
	}
}

func TestAnRDThatIsNotIPv4ColonNumberIsRefused(t *testing.T) {
	for _, s := range []string{"", "192.0.2.11", "192.0.2.11:", ":1", "192.0.2.11:65536", "192.0.2.11:-1",
		"192.0.2.11:x", "2001:db8::1:1", "[2001:db8::1]:1", "65000:100", "node-a:1"} {
		if d, err := ParseRD(s); err == nil {
			t.Errorf("ParseRD(%q) = %v, want an error", s, d)
		}
	}
}

func TestAnRDIsAJSONStringAndMapKey(t *testing.T) {
	in := map[RD]RD{{Admin: netip.MustParseAddr("192.0.2.11"), Assigned: 3}: {Admin: netip.MustParseAddr("192.0.2.12"), Assigned: 4}}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != `{"192.0.2.11:3":"192.0.2.12:4"}` {
		t.Fatalf("encoded as %s", data)
	}
	var out map[RD]RD
	if err := json.Unmarshal(data, &out); err != nil || len(out) != 1 || out[RD{Admin: netip.MustParseAddr("192.0.2.11"), Assigned: 3}] != in[RD{Admin: netip.MustParseAddr("192.0.2.11"), Assigned: 3}] {
		t.Fatalf("decoded %v (%v)", out, err)
	}
	var d RD
	if err := json.Unmarshal([]byte(`"bad"`), &d); err == nil {
		t.Error("a bad RD string was decoded")
	}
}

func TestRoutesAreEqualOnlyWhenEveryAttributeIs(t *testing.T) {
	base := route("10.20.0.5/32")
	change := map[string]func(r *Route){
		"RD":          func(r *Route) { r.RD.Assigned++ },
		"prefix":      func(r *Route) { r.Prefix = netip.MustParsePrefix("10.20.0.6/32") },
		"VNI":         func(r *Route) { r.VNI++ },
		"RT ASN":      func(r *Route) { r.RTASN++ },
		"next hop":    func(r *Route) { r.NextHop = netip.MustParseAddr("192.0.2.12") },
		"router MAC":  func(r *Route) { r.RouterMAC = mac("02:00:c0:00:02:0c") },
		"generation":  func(r *Route) { r.Generation++ },
		"drain":       func(r *Route) { r.Drained = true },
		"MAC missing": func(r *Route) { r.RouterMAC = nil },
	}
	for name, f := range change {
		o := base
		o.RouterMAC = mac(base.RouterMAC.String())
		f(&o)
		if base.Equal(o) || o.Equal(base) {
			t.Errorf("routes differing in %s are equal", name)
		}
	}
	same := base
	same.RouterMAC = mac(base.RouterMAC.String())
	if !base.Equal(same) {
		t.Error("a copy with its own MAC slice is not equal")
	}
	if base.Key() != same.Key() || base.Key().String() != "192.0.2.11:7 10.20.0.5/32" {
		t.Errorf("key %v", base.Key())
	}
}

func TestEveryRouteTargetIsReadAndTheFencingOnlyUnderTheConfiguredAS(t *testing.T) {
	r := route("10.20.0.5/32")
	r.Generation = 8
	p, err := toPath(r)
	if err != nil {
		t.Fatal(err)
	}
	// Put a foreign route target first and a second one of ours last, and
	// a foreign AS's large community that looks like a drain.
	var out []bgp.PathAttributeInterface
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeExtendedCommunities:
			ecs := []bgp.ExtendedCommunityInterface{bgp.NewTwoOctetAsSpecificExtended(bgp.EC_SUBTYPE_ROUTE_TARGET, 65001, 7, true)}
			ecs = append(ecs, a.Value...)
			ecs = append(ecs, bgp.NewTwoOctetAsSpecificExtended(bgp.EC_SUBTYPE_ROUTE_TARGET, 65000, 10200, true))
			out = append(out, bgp.NewPathAttributeExtendedCommunities(ecs))
		case *bgp.PathAttributeLargeCommunities:
			out = append(out, bgp.NewPathAttributeLargeCommunities(append(a.Values, bgp.NewLargeCommunity(65001, LargeCommunityDrain, 0))))
		default:
			out = append(out, a)
		}
	}
	p.Attrs = out
	got, err := fromPath(p, 65000)
	if err != nil {
		t.Fatal(err)
	}
	if vnis := got.TargetVNIs(65000); !slices.Equal(vnis, []uint32{10100, 10200}) {
		t.Errorf("VNIs under 65000: %v, want 10100 and 10200", vnis)
	}
	if got.RTASN != 65000 || got.VNI != 10100 || got.Generation != 8 || got.Drained {
		t.Errorf("got %+v: want RT 65000:10100, generation 8, not drained", got.Route)
	}
}
