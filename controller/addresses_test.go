package controller

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func reservation(addr, attachment string) *v1alpha1.VPCAddress {
	return &v1alpha1.VPCAddress{Spec: v1alpha1.VPCAddressSpec{VPC: "blue", VPCUID: "vpc-uid", Address: v1alpha1.IPAddress(addr),
		Attachment: attachment, State: v1alpha1.AddressRetained}}
}

func heldBy(addr, attachment, uid string) *v1alpha1.VPCAddress {
	return &v1alpha1.VPCAddress{Spec: v1alpha1.VPCAddressSpec{VPC: "blue", VPCUID: "vpc-uid", Address: v1alpha1.IPAddress(addr),
		Attachment: attachment, AttachmentUID: types.UID("uid-" + uid), State: v1alpha1.AddressBound}}
}

// describe renders a plan as one line per slot, for comparisons.
func describe(p addressPlan) string {
	var b strings.Builder
	for _, s := range p.Slots {
		switch {
		case s.Have.IsValid():
			fmt.Fprintf(&b, "%s have %s; ", s.Family, s.Have)
		case s.Bind != nil:
			fmt.Fprintf(&b, "%s bind %s; ", s.Family, s.Bind.Spec.Address)
		case s.Request.IsValid():
			fmt.Fprintf(&b, "%s claim %s; ", s.Family, s.Request)
		default:
			fmt.Fprintf(&b, "%s claim in %s; ", s.Family, joinPrefixes(s.Networks))
		}
	}
	for _, a := range p.Release {
		fmt.Fprintf(&b, "release %s; ", a)
	}
	if p.Problem != nil {
		fmt.Fprintf(&b, "%s: %s", p.Problem.Reason, p.Problem.Message)
	}
	return strings.TrimSuffix(strings.TrimSpace(b.String()), ";")
}

func TestPlanAddresses(t *testing.T) {
	dual := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd20::/48")}
	twoV4 := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/28"), netip.MustParsePrefix("10.2.0.0/24")}
	for _, tc := range []struct {
		name string
		in   addressInputs
		want string
	}{
		{"new attachment: one address per family of the VPC, in the VPC's order",
			addressInputs{Networks: dual},
			"IPv4 claim in 10.20.0.0/16; IPv6 claim in fd20::/48"},
		{"families: only those asked for, in the VPC's networks of that family in order",
			addressInputs{Networks: twoV4, Families: []v1alpha1.IPFamily{v1alpha1.IPv4}},
			"IPv4 claim in 10.1.0.0/28, 10.2.0.0/24"},
		{"families: empty asks for no address",
			addressInputs{Networks: dual, Families: []v1alpha1.IPFamily{}},
			""},
		{"a family the VPC has no network of",
			addressInputs{VPC: "blue", Networks: twoV4, Families: []v1alpha1.IPFamily{v1alpha1.IPv6}},
			"PoolExhausted: VPC blue has no IPv6 network (10.1.0.0/28, 10.2.0.0/24): add one to the VPC's spec.networks, or create a VPCAttachment without IPv6 in spec.ipFamilies"},
		{"bound addresses are kept",
			addressInputs{Networks: dual, Bound: addrs("10.20.0.7", "fd20::9")},
			"IPv4 have 10.20.0.7; IPv6 have fd20::9"},
		{"a race's extra claim is released, the published one kept",
			addressInputs{Networks: dual, Bound: addrs("10.20.0.2", "10.20.0.9", "fd20::2"), Published: []v1alpha1.Prefix{"10.20.0.9/16", "fd20::2/48"}},
			"IPv4 have 10.20.0.9; IPv6 have fd20::2; release 10.20.0.2"},
		{"with nothing published the lowest is kept",
			addressInputs{Networks: dual, Bound: addrs("10.20.0.9", "10.20.0.2")},
			"IPv4 have 10.20.0.2; IPv6 claim in fd20::/48; release 10.20.0.9"},
		{"a reservation of this name is bound instead of a fresh address",
			addressInputs{Name: "web", Networks: dual, Retained: []*v1alpha1.VPCAddress{reservation("10.20.0.5", "web"), reservation("fd20::5", "web")}},
			"IPv4 bind 10.20.0.5; IPv6 bind fd20::5"},
		{"requests are claimed in order",
			addressInputs{Networks: dual, Requests: []v1alpha1.IPAddress{"fd20::5", "10.20.0.5"}},
			"IPv6 claim fd20::5; IPv4 claim 10.20.0.5"},
		{"a request bound already is kept, a reservation of it bound",
			addressInputs{Name: "web", Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5", "fd20::5"}, Bound: addrs("10.20.0.5"),
				Retained: []*v1alpha1.VPCAddress{reservation("fd20::5", "web"), reservation("10.20.0.9", "web")}},
			"IPv4 have 10.20.0.5; IPv6 bind fd20::5"},
		{"a request outside the VPC",
			addressInputs{VPC: "blue", Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5", "10.30.0.5"}},
			"IPv4 claim 10.20.0.5; OutsideVPC: spec.addresses[1] 10.30.0.5 is outside VPC blue (10.20.0.0/16, fd20::/48): request an address in one of its networks or add a network to the VPC"},
		{"a request of the gateway",
			addressInputs{Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.1"}},
			"AddressInUse: spec.addresses[0] 10.20.0.1 is the gateway of 10.20.0.0/16: request another address"},
		{"a request of the broadcast address",
			addressInputs{Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.255.255"}},
			"AddressInUse: spec.addresses[0] 10.20.255.255 is the broadcast address of 10.20.0.0/16: request another address"},
		{"a request another attachment holds",
			addressInputs{Name: "web", UID: "uid-web", Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5"},
				Holders: map[netip.Addr]*v1alpha1.VPCAddress{netip.MustParseAddr("10.20.0.5"): heldBy("10.20.0.5", "db", "db")}},
			"AddressInUse: spec.addresses[0] 10.20.0.5 is held by VPCAttachment db: request another address"},
		{"a request reserved for another name",
			addressInputs{Name: "web", UID: "uid-web", Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5"},
				Holders: map[netip.Addr]*v1alpha1.VPCAddress{netip.MustParseAddr("10.20.0.5"): func() *v1alpha1.VPCAddress {
					r := reservation("10.20.0.5", "db")
					r.Name = "blue.10.20.0.5"
					return r
				}()}},
			"AddressInUse: spec.addresses[0] 10.20.0.5 is reserved for VPCAttachment db (Retained): request another address, or delete VPCAddress blue.10.20.0.5 to release it"},
		{"a request still held by the attachment of this name being replaced",
			addressInputs{Name: "web", UID: "uid-new", Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5"},
				Holders: map[netip.Addr]*v1alpha1.VPCAddress{netip.MustParseAddr("10.20.0.5"): heldBy("10.20.0.5", "web", "old")}},
			"AddressInUse: spec.addresses[0] 10.20.0.5 is still held by the VPCAttachment web this one replaces (UID uid-old); it is released, or kept under Retain, once that one is gone"},
		{"a request that is not an address",
			addressInputs{Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5/16"}},
			`OutsideVPC: spec.addresses[0] "10.20.0.5/16" is not an IP address: create a VPCAttachment with addresses such as 10.20.0.5`},
		{"a problem claims nothing, keeps what is bound and releases nothing published",
			addressInputs{VPC: "blue", Networks: dual, Requests: []v1alpha1.IPAddress{"10.20.0.5", "10.99.0.1"}, Bound: addrs("10.20.0.5"), Published: []v1alpha1.Prefix{"10.20.0.5/16"}},
			"IPv4 have 10.20.0.5; OutsideVPC: spec.addresses[1] 10.99.0.1 is outside VPC blue (10.20.0.0/16, fd20::/48): request an address in one of its networks or add a network to the VPC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describe(planAddresses(tc.in)); got != tc.want {
				t.Errorf("plan:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestStatusAddressesCarryTheirNetworksPrefixLength(t *testing.T) {
	nets := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd20::/48")}
	got := statusAddresses(addrs("10.20.0.5", "fd20::a:5"), nets)
	if fmt.Sprint(got) != "[10.20.0.5/16 fd20::a:5/48]" {
		t.Errorf("statusAddresses = %v", got)
	}
}
