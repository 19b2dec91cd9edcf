package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func reflectorFile() map[string]any {
	return map[string]any{
		"role": "reflector", "asn": 65000, "routerID": "192.0.2.3",
		"clientRanges": []any{"192.0.2.0/24"},
	}
}

func TestAReflectorNeedsNoUnderlayPeersOrRouteTargetAndTakesDefaults(t *testing.T) {
	c, err := Parse(encode(t, reflectorFile()))
	if err != nil {
		t.Fatal(err)
	}
	id := netip.MustParseAddr("192.0.2.3")
	want := &Config{
		Role: RoleReflector, ASN: 65000, RouterID: id, ClusterID: id, ListenPort: 179,
		GracefulRestart: true, RestartTime: 120 * time.Second, MetricsAddress: DefaultMetricsAddress,
		ClientRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
}

func TestAReflectorTakesExplicitClientsAndItsRouterIDFromTheUnderlay(t *testing.T) {
	m := reflectorFile()
	delete(m, "routerID")
	delete(m, "clientRanges")
	m["underlay"], m["clusterID"], m["listenPort"] = "192.0.2.4", "10.0.0.1", 1179
	m["peers"] = []any{map[string]any{"address": "192.0.2.11", "asn": 65000}}
	c, err := Parse(encode(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if c.RouterID != netip.MustParseAddr("192.0.2.4") || c.ClusterID != netip.MustParseAddr("10.0.0.1") ||
		c.ListenPort != 1179 || len(c.Peers) != 1 || c.Peers[0].Hold != 9*time.Second {
		t.Fatalf("%+v", c)
	}
}

func TestEveryKeyAReflectorCannotUseIsRefusedByName(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		key    string
	}{
		{"unknown role", func(m map[string]any) { m["role"] = "spine" }, "role"},
		{"role not a string", func(m map[string]any) { m["role"] = 1 }, "role"},
		{"no router ID and no underlay", func(m map[string]any) { delete(m, "routerID") }, "routerID"},
		{"IPv6 underlay", func(m map[string]any) { m["underlay"] = "2001:db8::3" }, "underlay"},
		{"cluster ID not IPv4", func(m map[string]any) { m["clusterID"] = "rr-1" }, "clusterID"},
		{"no sessions accepted", func(m map[string]any) { m["listenPort"] = -1 }, "listenPort"},
		{"route target AS", func(m map[string]any) { m["routeTargetASN"] = 65000 }, "routeTargetASN"},
		{"withdraw hold", func(m map[string]any) { m["withdrawHoldSeconds"] = 10 }, "withdrawHoldSeconds"},
		{"a range that is not a prefix", func(m map[string]any) { m["clientRanges"] = []any{"192.0.2.1"} }, "clientRanges[0]"},
		{"a range with host bits", func(m map[string]any) { m["clientRanges"] = []any{"192.0.2.1/24"} }, "clientRanges[0]"},
		{"no clients at all", func(m map[string]any) { delete(m, "clientRanges") }, "clientRanges"},
		{"an eBGP client", func(m map[string]any) {
			m["peers"] = []any{map[string]any{"address": "192.0.2.11", "asn": 65010}}
		}, "peers[0].asn"},
		{"a client listed twice", func(m map[string]any) {
			m["peers"] = []any{map[string]any{"address": "192.0.2.11", "asn": 65000}, map[string]any{"address": "192.0.2.11", "asn": 65000}}
		}, "peers[1].address"},
		{"restart time beyond 12 bits", func(m map[string]any) {
			m["gracefulRestart"] = map[string]any{"restartSeconds": 5000}
		}, "gracefulRestart.restartSeconds"},
		{"metrics address without a port", func(m map[string]any) { m["metricsAddress"] = "0.0.0.0" }, "metricsAddress"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := reflectorFile()
			tc.mutate(m)
			c, err := Parse(encode(t, m))
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if !strings.HasPrefix(err.Error(), tc.key+": ") {
				t.Fatalf("error %q does not begin with the key %q", err, tc.key)
			}
		})
	}
}

func TestANodeRefusesTheReflectorsKeys(t *testing.T) {
	for _, key := range []string{"clusterID", "clientRanges"} {
		m := minimal()
		m[key] = "192.0.2.1"
		if key == "clientRanges" {
			m[key] = []any{"192.0.2.0/24"}
		}
		if _, err := Parse(encode(t, m)); err == nil || !strings.HasPrefix(err.Error(), key+": applies to role \"reflector\"") {
			t.Errorf("%s on a node: %v", key, err)
		}
	}
	m := minimal()
	m["role"] = "node"
	if c, err := Parse(encode(t, m)); err != nil || c.Role != RoleNode {
		t.Errorf("explicit role node: %+v %v", c, err)
	}
}

func TestAnUnderlayFlagFillsOnlyAnAbsentKey(t *testing.T) {
	dir := t.TempDir()
	m := reflectorFile()
	delete(m, "routerID")
	path := filepath.Join(dir, "router.json")
	if err := os.WriteFile(path, encode(t, m), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadWithUnderlay(path, "192.0.2.9")
	if err != nil || c.RouterID != netip.MustParseAddr("192.0.2.9") || c.Underlay != c.RouterID {
		t.Fatalf("%+v %v", c, err)
	}
	m["underlay"] = "192.0.2.4"
	if err := os.WriteFile(path, encode(t, m), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := LoadWithUnderlay(path, "192.0.2.9"); err != nil || c.Underlay != netip.MustParseAddr("192.0.2.4") {
		t.Fatalf("the file's underlay must win: %+v %v", c, err)
	}
	if _, err := LoadWithUnderlay(path, "not-an-address"); err != nil {
		t.Fatalf("an unused flag value was judged: %v", err)
	}
	delete(m, "underlay")
	if err := os.WriteFile(path, encode(t, m), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadWithUnderlay(path, "not-an-address"); err == nil || !strings.HasPrefix(err.Error(), "router config "+path+": underlay: ") {
		t.Fatalf("a bad flag value must be named as the underlay: %v", err)
	}
}
