package controller

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

func TestParseNetworksRefusesWhatTheCRDRefusesNamingTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		nets []v1alpha1.CIDR
		want string
	}{
		{"dual stack", []v1alpha1.CIDR{"10.20.0.0/16", "fd20::/48"}, ""},
		{"none", nil, "spec.networks has 0 networks"},
		{"not a CIDR", []v1alpha1.CIDR{"10.20.0.0"}, `spec.networks[0] "10.20.0.0" is not a CIDR`},
		{"host bits", []v1alpha1.CIDR{"fd20::/48", "10.20.0.1/16"}, `spec.networks[1] "10.20.0.1/16" has host bits set: write it as 10.20.0.0/16`},
		{"overlap", []v1alpha1.CIDR{"10.20.0.0/16", "10.20.5.0/24"}, "spec.networks[1] 10.20.5.0/24 overlaps spec.networks[0] 10.20.0.0/16"},
		{"nine", []v1alpha1.CIDR{"10.1.0.0/24", "10.2.0.0/24", "10.3.0.0/24", "10.4.0.0/24", "10.5.0.0/24", "10.6.0.0/24", "10.7.0.0/24", "10.8.0.0/24", "10.9.0.0/24"}, "has 9 networks: give 1 to 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nets, err := parseNetworks(tc.nets)
			if tc.want == "" {
				if err != nil || len(nets) != len(tc.nets) {
					t.Fatalf("parseNetworks = %v, %v", nets, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseNetworks error = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

func TestNextFreeNeverGivesTheNetworkGatewayOrBroadcast(t *testing.T) {
	n := netip.MustParsePrefix("10.0.0.0/29")
	var got []string
	taken := map[netip.Addr]bool{}
	for {
		a, ok := nextFree(n, netip.Addr{}, func(a netip.Addr) bool { return taken[a] })
		if !ok {
			break
		}
		taken[a] = true
		got = append(got, a.String())
	}
	if want := "10.0.0.2 10.0.0.3 10.0.0.4 10.0.0.5 10.0.0.6"; strings.Join(got, " ") != want {
		t.Errorf("a /29 gives %v, want %s (not .0 the network, .1 the gateway, .7 the broadcast)", got, want)
	}
	if usableCount(n) != "5" {
		t.Errorf("usableCount(/29) = %s, want 5", usableCount(n))
	}

	v6 := netip.MustParsePrefix("fd20::/126")
	a, _ := nextFree(v6, netip.Addr{}, func(netip.Addr) bool { return false })
	if a != netip.MustParseAddr("fd20::2") {
		t.Errorf("first IPv6 address = %s, want fd20::2", a)
	}
	last, ok := nextFree(v6, netip.MustParseAddr("fd20::3"), func(netip.Addr) bool { return false })
	if !ok || last != netip.MustParseAddr("fd20::3") {
		t.Errorf("IPv6 has no broadcast: the last address is usable, got %s %v", last, ok)
	}
	for _, small := range []string{"10.0.0.0/31", "10.0.0.4/32", "fd20::/127"} {
		if a, ok := nextFree(netip.MustParsePrefix(small), netip.Addr{}, func(netip.Addr) bool { return false }); ok {
			t.Errorf("%s has no address for an attachment, got %s", small, a)
		}
	}
	// A hint below the first usable address, or of another family, is ignored.
	if a, _ := nextFree(n, netip.MustParseAddr("10.0.0.0"), func(netip.Addr) bool { return false }); a != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("hint at the network address gave %s", a)
	}
	if a, _ := nextFree(n, netip.MustParseAddr("10.0.0.5"), func(netip.Addr) bool { return false }); a != netip.MustParseAddr("10.0.0.5") {
		t.Errorf("hint 10.0.0.5 gave %s", a)
	}
}

func TestReservedSaysWhichAddressItIs(t *testing.T) {
	n := netip.MustParsePrefix("10.20.0.0/16")
	for addr, want := range map[string]string{
		"10.20.0.0":     "the network address of 10.20.0.0/16",
		"10.20.0.1":     "the gateway of 10.20.0.0/16",
		"10.20.255.255": "the broadcast address of 10.20.0.0/16",
		"10.20.0.2":     "",
	} {
		if got := reserved(n, netip.MustParseAddr(addr)); got != want {
			t.Errorf("reserved(%s) = %q, want %q", addr, got, want)
		}
	}
}
