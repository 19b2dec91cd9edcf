package names

import (
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestHostInterfaceNamesAreStableShortAndModeSpecific(t *testing.T) {
	for _, tc := range []struct {
		mode, vpc, att, want string
	}{
		{ModeTap, "blue", "web-0-net0", "gt72f115ce5f437"},
		{ModeVeth, "blue", "web-0-net0", "gv72f115ce5f437"},
		{"", "blue", "web-0-net0", "gt" + sum("blue/web-0-net0")[:13]},
	} {
		got := HostInterface(tc.mode, tc.vpc, tc.att)
		if got != tc.want {
			t.Errorf("HostInterface(%q,%q,%q) = %q, want %q", tc.mode, tc.vpc, tc.att, got, tc.want)
		}
		if len(got) != 15 {
			t.Errorf("%q must use all 15 characters IFNAMSIZ allows", got)
		}
		if !IsHostInterface(tc.mode, got) {
			t.Errorf("IsHostInterface(%q, %q) = false", tc.mode, got)
		}
	}
	if HostInterface(ModeTap, "blue", "a") == HostInterface(ModeTap, "red", "a") {
		t.Error("two VPCs must not share a host interface name")
	}
	for _, name := range []string{"eth0", "gt123", "gv0123456789abc", "gt0123456789abZ", "gt0123456789abcd"} {
		if IsHostInterface(ModeTap, name) {
			t.Errorf("IsHostInterface(tap, %q) = true", name)
		}
	}
}

func TestAliasRoundTrips(t *testing.T) {
	a := Alias("blue", "web-0-net0")
	if a != "galactic:blue/web-0-net0" {
		t.Fatalf("Alias = %q", a)
	}
	vpc, att, ok := ParseAlias(a)
	if !ok || vpc != "blue" || att != "web-0-net0" {
		t.Fatalf("ParseAlias(%q) = %q %q %v", a, vpc, att, ok)
	}
	for _, bad := range []string{"", "galactic:", "galactic:blue", "galactic:/x", "other:blue/x", "galactic:blue/x/", "galactic:blue/x/u/v"} {
		if _, _, ok := ParseAlias(bad); ok {
			t.Errorf("ParseAlias(%q) accepted", bad)
		}
	}
}

func TestAnObjectBackedAliasCarriesTheUIDAndAnInlineOneNone(t *testing.T) {
	if a := AliasOf("blue", "web-0-net0", ""); a != Alias("blue", "web-0-net0") {
		t.Fatalf("inline AliasOf = %q", a)
	}
	a := AliasOf("blue-1a2b3c4d", "web-0-5e6f7a8b", "0f1e2d3c-aaaa-bbbb-cccc-000000000001")
	if a != "galactic:blue-1a2b3c4d/web-0-5e6f7a8b/0f1e2d3c-aaaa-bbbb-cccc-000000000001" {
		t.Fatalf("AliasOf = %q", a)
	}
	vpc, att, uid, ok := ParseAliasUID(a)
	if !ok || vpc != "blue-1a2b3c4d" || att != "web-0-5e6f7a8b" || uid != "0f1e2d3c-aaaa-bbbb-cccc-000000000001" {
		t.Fatalf("ParseAliasUID(%q) = %q %q %q %v", a, vpc, att, uid, ok)
	}
	if vpc, att, ok := ParseAlias(a); !ok || vpc != "blue-1a2b3c4d" || att != "web-0-5e6f7a8b" {
		t.Fatalf("ParseAlias(%q) = %q %q %v", a, vpc, att, ok)
	}
	if _, _, uid, ok := ParseAliasUID(Alias("blue", "a")); !ok || uid != "" {
		t.Fatalf("an inline alias has no UID: %q %v", uid, ok)
	}
}

func TestIdentityLabelsAndSecondaryInterfaceNames(t *testing.T) {
	if l := IdentityLabels("tenant-a", ""); l != nil {
		t.Fatalf("an inline attachment has no identity labels: %v", l)
	}
	l := IdentityLabels("tenant-a", "u1")
	if len(l) != 2 || l["network.galactic.dev/namespace"] != "tenant-a" || l["network.galactic.dev/attachment-uid"] != "u1" {
		t.Fatalf("IdentityLabels = %v", l)
	}
	if SecondaryIfName(1) != "net1" || SecondaryIfName(12) != "net12" {
		t.Fatalf("secondary names %q %q", SecondaryIfName(1), SecondaryIfName(12))
	}
}

func TestAdvertisementNamesAndLabels(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	longNode := strings.Repeat("n", 200)
	for _, tc := range []struct {
		name           string
		vpc, att, node string
		wantName       string
		wantNodeLabel  string
	}{
		{"short", "blue", "web-0-net0", "node-a", "blue.web-0-net0.node-a", "node-a"},
		{"node label over 63 chars is hashed", "blue", "a", longNode, "blue.a." + longNode, sum(longNode)[:63]},
		{"name over 253 chars hashes the node", long63, long63, longNode, long63 + "." + long63 + "." + sum(longNode)[:32], sum(longNode)[:63]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Advertisement(tc.vpc, tc.att, tc.node)
			if got != tc.wantName {
				t.Errorf("Advertisement = %q, want %q", got, tc.wantName)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("%q is not a valid object name: %v", got, errs)
			}
			labels := AdvertisementLabels(tc.vpc, tc.att, tc.node)
			if labels["network.galactic.dev/node"] != tc.wantNodeLabel {
				t.Errorf("node label = %q, want %q", labels["network.galactic.dev/node"], tc.wantNodeLabel)
			}
			for k, v := range labels {
				if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
					t.Errorf("label %s=%q invalid: %v", k, v, errs)
				}
			}
		})
	}
}

func TestLeaseAndHolderNames(t *testing.T) {
	if got := Lease("blue", "web-0-net0"); got != "blue.web-0-net0" {
		t.Errorf("Lease = %q", got)
	}
	h := Holder("node-a", "3f1c")
	if h != "node-a/3f1c" {
		t.Errorf("Holder = %q", h)
	}
	node, cid, ok := ParseHolder(h)
	if !ok || node != "node-a" || cid != "3f1c" {
		t.Errorf("ParseHolder = %q %q %v", node, cid, ok)
	}
	for _, bad := range []string{"", "node-a", "/c", "node-a/"} {
		if _, _, ok := ParseHolder(bad); ok {
			t.Errorf("ParseHolder(%q) accepted", bad)
		}
	}
}

func TestValidateLabelNamesTheField(t *testing.T) {
	if err := ValidateLabel("vpc", "blue"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ value, want string }{
		{"", "vpc is required"},
		{"Blue", `vpc "Blue" is not a DNS-1123 label`},
		{strings.Repeat("a", 64), "not a DNS-1123 label"},
		{"a.b", "not a DNS-1123 label"},
	} {
		err := ValidateLabel("vpc", tc.value)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateLabel(%q) = %v, want %q", tc.value, err, tc.want)
		}
	}
}

func TestTheHolderNodeSelectorMatchesTheNodeLabelOfAdvertisements(t *testing.T) {
	longNode := strings.Repeat("n", 200)
	for node, want := range map[string]string{
		"node-a": "network.galactic.dev/holder-node=node-a",
		longNode: "network.galactic.dev/holder-node=" + sum(longNode)[:63],
	} {
		if got := HolderNodeSelector(node); got != want {
			t.Errorf("HolderNodeSelector(%.10s...) = %q, want %q", node, got, want)
		}
		if got := HolderNodeSelector(node); got != LabelHolderNode+"="+AdvertisementLabels("blue", "a", node)["network.galactic.dev/node"] {
			t.Errorf("the holder-node label of %.10s... differs from its advertisement node label", node)
		}
	}
}

func TestDataplaneNamesAreLabelsThatDifferByUID(t *testing.T) {
	long := strings.Repeat("a", 60) + "-b"
	for _, name := range []string{"blue", "web-0-net0", long, strings.Repeat("x", 54) + "-y"} {
		a, b := DataplaneName(name, "uid-1"), DataplaneName(name, "uid-2")
		if a == b {
			t.Errorf("%q: one data-plane name for two UIDs: %s", name, a)
		}
		for _, n := range []string{a, b} {
			if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
				t.Errorf("%q: data-plane name %q is not a label: %v", name, n, errs)
			}
		}
	}
	if got := DataplaneName("blue", "u"); !strings.HasPrefix(got, "blue-") || len(got) != len("blue-")+8 {
		t.Errorf("DataplaneName(blue) = %q, want blue- and 8 hex digits", got)
	}
}

func TestVPCAddressNamesAreOnePerAddress(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"10.20.0.5", "blue.10.20.0.5"},
		{"::ffff:10.20.0.5", "blue.10.20.0.5"},
		{"fd20::a:5", "blue.fd20-0-0-0-0-0-a-5"},
		{"::1", "blue.0-0-0-0-0-0-0-1"},
		{"fd20:0:0:0:0:0:a:5", "blue.fd20-0-0-0-0-0-a-5"},
	} {
		got := VPCAddressName("blue", netip.MustParseAddr(tc.addr))
		if got != tc.want {
			t.Errorf("VPCAddressName(%s) = %q, want %q", tc.addr, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("%q is not an object name: %v", got, errs)
		}
	}
}
