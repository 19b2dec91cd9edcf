package hostif

import (
	"net/netip"
	"testing"
)

func TestTheGatewayIsTheFirstUsableAddressOtherThanTheWorkloads(t *testing.T) {
	for _, tc := range []struct{ addr, gw string }{
		{"10.20.0.5/24", "10.20.0.1"},
		{"10.20.0.1/24", "10.20.0.2"},
		{"10.20.0.0/24", "10.20.0.1"},
		{"10.20.0.9/30", "10.20.0.10"},
		{"10.20.0.4/31", "10.20.0.5"},
		{"10.20.0.5/31", "10.20.0.4"},
		{"10.20.0.5/32", "169.254.0.1"},
		{"fd20::5/64", "fd20::1"},
		{"fd20::1/64", "fd20::2"},
		{"fd20::4/127", "fd20::5"},
		{"fd20::5/128", "fe80::1"},
	} {
		if got := Gateway(netip.MustParsePrefix(tc.addr)); got != netip.MustParseAddr(tc.gw) {
			t.Errorf("gateway of %s: want %s, got %s", tc.addr, tc.gw, got)
		}
	}
}

func TestGatewaysAreDistinctAndDefaultsOnePerFamily(t *testing.T) {
	addrs := []netip.Prefix{
		netip.MustParsePrefix("10.20.0.5/24"), netip.MustParsePrefix("10.20.0.6/24"),
		netip.MustParsePrefix("fd20::5/64"), netip.MustParsePrefix("10.30.0.5/24"),
	}
	gws := Gateways(addrs)
	want := []string{"10.20.0.1", "fd20::1", "10.30.0.1"}
	if len(gws) != len(want) {
		t.Fatalf("gateways %v, want %v", gws, want)
	}
	for i := range want {
		if gws[i].String() != want[i] {
			t.Fatalf("gateways %v, want %v", gws, want)
		}
	}
	defs := Defaults(addrs)
	if len(defs) != 2 || defs[0].Dst.String() != "0.0.0.0/0" || defs[0].Via.String() != "10.20.0.1" || defs[1].Dst.String() != "::/0" || defs[1].Via.String() != "fd20::1" {
		t.Fatalf("defaults %+v", defs)
	}
	if len(Defaults(nil)) != 0 {
		t.Fatal("no addresses, no default routes")
	}
}

func TestAPodsFurtherAttachmentsRouteTheirOwnNetworksInsteadOfTheDefault(t *testing.T) {
	addrs := []netip.Prefix{
		netip.MustParsePrefix("10.21.0.5/16"), netip.MustParsePrefix("fd21::a:5/48"),
		netip.MustParsePrefix("10.21.3.9/16"), netip.MustParsePrefix("10.99.0.1/32"),
	}
	if got, want := Routes(addrs, false), Defaults(addrs); len(got) != len(want) || got[0] != want[0] {
		t.Fatalf("the first attachment: %+v, want the defaults %+v", got, want)
	}
	got := Routes(addrs, true)
	want := []Default{
		{Dst: netip.MustParsePrefix("10.21.0.0/16"), Via: netip.MustParseAddr("10.21.0.1")},
		{Dst: netip.MustParsePrefix("fd21::/48"), Via: netip.MustParseAddr("fd21::1")},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("further attachment routes %+v, want %+v", got, want)
	}
}
