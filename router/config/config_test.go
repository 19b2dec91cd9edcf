package config

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// minimal is the smallest valid file: every optional key is absent.
func minimal() map[string]any {
	return map[string]any{
		"asn":      65010,
		"underlay": "192.0.2.11",
		"peers":    []any{map[string]any{"address": "192.0.2.1", "asn": 65000}},
	}
}

func peer0(m map[string]any) map[string]any { return m["peers"].([]any)[0].(map[string]any) }

func encode(t *testing.T, m map[string]any) []byte {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestEveryInvalidKeyIsRefusedWithAMessageNamingIt(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		key    string
	}{
		{"asn 0", func(m map[string]any) { m["asn"] = 0 }, "asn"},
		{"asn above four octets", func(m map[string]any) { m["asn"] = 4294967296 }, "asn"},
		{"asn negative", func(m map[string]any) { m["asn"] = -1 }, "asn"},
		{"asn missing", func(m map[string]any) { delete(m, "asn") }, "asn"},
		{"underlay missing", func(m map[string]any) { delete(m, "underlay") }, "underlay"},
		{"underlay not an address", func(m map[string]any) { m["underlay"] = "node-a" }, "underlay"},
		{"underlay with a zone", func(m map[string]any) { m["underlay"] = "fe80::1%eth0" }, "underlay"},
		{"underlay IPv6", func(m map[string]any) { m["underlay"] = "2001:db8::11" }, "underlay"},
		{"routerID not an address", func(m map[string]any) { m["routerID"] = "router-1" }, "routerID"},
		{"routerID IPv6", func(m map[string]any) { m["routerID"] = "2001:db8::1" }, "routerID"},
		{"listenPort 0", func(m map[string]any) { m["listenPort"] = 0 }, "listenPort"},
		{"listenPort above 65535", func(m map[string]any) { m["listenPort"] = 65536 }, "listenPort"},
		{"listenPort -2", func(m map[string]any) { m["listenPort"] = -2 }, "listenPort"},
		{"routeTargetASN 0", func(m map[string]any) { m["routeTargetASN"] = 0 }, "routeTargetASN"},
		{"routeTargetASN above two octets", func(m map[string]any) { m["routeTargetASN"] = 65536 }, "routeTargetASN"},
		{"routeTargetASN missing with a four-octet asn", func(m map[string]any) { m["asn"] = 4200000000 }, "routeTargetASN"},
		{"restartSeconds 0", func(m map[string]any) {
			m["gracefulRestart"] = map[string]any{"enabled": true, "restartSeconds": 0}
		}, "gracefulRestart.restartSeconds"},
		{"restartSeconds beyond 12 bits", func(m map[string]any) {
			m["gracefulRestart"] = map[string]any{"restartSeconds": 4096}
		}, "gracefulRestart.restartSeconds"},
		{"withdrawHoldSeconds negative", func(m map[string]any) { m["withdrawHoldSeconds"] = -1 }, "withdrawHoldSeconds"},
		{"withdrawHoldSeconds above an hour", func(m map[string]any) { m["withdrawHoldSeconds"] = 3601 }, "withdrawHoldSeconds"},
		{"staleRoutesSeconds negative", func(m map[string]any) { m["staleRoutesSeconds"] = -1 }, "staleRoutesSeconds"},
		{"staleRoutesSeconds above a day", func(m map[string]any) { m["staleRoutesSeconds"] = 86401 }, "staleRoutesSeconds"},
		{"staleRoutesSeconds not a number", func(m map[string]any) { m["staleRoutesSeconds"] = "1h" }, "staleRoutesSeconds"},
		{"metricsAddress without a port", func(m map[string]any) { m["metricsAddress"] = "127.0.0.1" }, "metricsAddress"},
		{"peers missing", func(m map[string]any) { delete(m, "peers") }, "peers"},
		{"peers empty", func(m map[string]any) { m["peers"] = []any{} }, "peers"},
		{"peer address missing", func(m map[string]any) { delete(peer0(m), "address") }, "peers[0].address"},
		{"peer address not an address", func(m map[string]any) { peer0(m)["address"] = "rr-1" }, "peers[0].address"},
		{"peer address duplicated", func(m map[string]any) {
			m["peers"] = append(m["peers"].([]any), map[string]any{"address": "192.0.2.1", "asn": 65001})
		}, "peers[1].address"},
		{"peer without asn", func(m map[string]any) { delete(peer0(m), "asn") }, "peers[0].asn"},
		{"peer asn 0", func(m map[string]any) { peer0(m)["asn"] = 0 }, "peers[0].asn"},
		{"peer port 0", func(m map[string]any) { peer0(m)["port"] = 0 }, "peers[0].port"},
		{"peer port above 65535", func(m map[string]any) { peer0(m)["port"] = 65536 }, "peers[0].port"},
		{"holdSeconds 0", func(m map[string]any) { peer0(m)["holdSeconds"] = 0 }, "peers[0].holdSeconds"},
		{"holdSeconds below 3", func(m map[string]any) { peer0(m)["holdSeconds"] = 2 }, "peers[0].holdSeconds"},
		{"keepaliveSeconds equal to holdSeconds", func(m map[string]any) {
			peer0(m)["holdSeconds"], peer0(m)["keepaliveSeconds"] = 6, 6
		}, "peers[0].keepaliveSeconds"},
		{"keepaliveSeconds above the default hold", func(m map[string]any) { peer0(m)["keepaliveSeconds"] = 10 }, "peers[0].keepaliveSeconds"},
		{"keepaliveSeconds 0", func(m map[string]any) { peer0(m)["keepaliveSeconds"] = 0 }, "peers[0].keepaliveSeconds"},
		{"password of 81 characters", func(m map[string]any) { peer0(m)["password"] = strings.Repeat("k", 81) }, "peers[0].password"},
		{"unknown top-level key", func(m map[string]any) { m["neighbours"] = []any{} }, "neighbours"},
		{"unknown key inside a peer", func(m map[string]any) { peer0(m)["holdTime"] = 9 }, "peers[0].holdTime"},
		{"unknown key inside gracefulRestart", func(m map[string]any) {
			m["gracefulRestart"] = map[string]any{"restartTime": 120}
		}, "gracefulRestart.restartTime"},
		{"asn as a string", func(m map[string]any) { m["asn"] = "65010" }, "asn"},
		{"asn not an integer", func(m map[string]any) { m["asn"] = 65010.5 }, "asn"},
		{"underlay as a number", func(m map[string]any) { m["underlay"] = 1 }, "underlay"},
		{"peers as an object", func(m map[string]any) { m["peers"] = map[string]any{} }, "peers"},
		{"enabled as a string", func(m map[string]any) { m["gracefulRestart"] = map[string]any{"enabled": "yes"} }, "gracefulRestart.enabled"},
		{"peer holdSeconds as a string", func(m map[string]any) { peer0(m)["holdSeconds"] = "9" }, "peers.holdSeconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := minimal()
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

func TestAnUnknownKeyMessageListsTheKeysAllowedWhereItIs(t *testing.T) {
	m := minimal()
	peer0(m)["holdTime"] = 9
	_, err := Parse(encode(t, m))
	if err == nil || !strings.Contains(err.Error(), "keepaliveSeconds") || strings.Contains(err.Error(), "routerID") {
		t.Fatalf("a peer's unknown key must list a peer's keys, got %v", err)
	}
}

func TestAWrongJSONTypeIsNamedInJSONTerms(t *testing.T) {
	cases := []struct{ data, want string }{
		{`{"asn": "65010"}`, "asn: must be a JSON integer"},
		{`{"peers": {}}`, "peers: must be a JSON array"},
		{`{"underlay": 1}`, "underlay: must be a JSON string"},
		{`{"gracefulRestart": {"enabled": 1}}`, "gracefulRestart.enabled: must be a JSON boolean"},
		{`[]`, "the config must be a JSON object"},
	}
	for _, tc := range cases {
		if _, err := Parse([]byte(tc.data)); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v, want %q", tc.data, err, tc.want)
		}
	}
}

func TestAnythingButOneJSONObjectIsNotValidJSON(t *testing.T) {
	valid := string(encode(t, minimal()))
	for _, data := range []string{"", "{", valid + " {}", valid + " x", valid + valid} {
		_, err := Parse([]byte(data))
		if err == nil || !strings.HasPrefix(err.Error(), "not valid JSON") {
			t.Errorf("Parse(%q) = %v, want a JSON error", data, err)
		}
	}
	if _, err := Parse([]byte(valid + "\n  \n")); err != nil {
		t.Errorf("trailing white space refused: %v", err)
	}
}

func TestAbsentKeysTakeTheirDefaults(t *testing.T) {
	c, err := Parse(encode(t, minimal()))
	if err != nil {
		t.Fatal(err)
	}
	underlay := netip.MustParseAddr("192.0.2.11")
	want := &Config{
		ASN: 65010, RouterID: underlay, Underlay: underlay, ListenPort: 179, RouteTargetASN: 65010,
		GracefulRestart: true, RestartTime: 120 * time.Second, WithdrawHold: 10 * time.Second, StaleRoutes: time.Hour,
		Peers: []Peer{{Address: netip.MustParseAddr("192.0.2.1"), ASN: 65000, Port: 179,
			Hold: 9 * time.Second, Keepalive: 3 * time.Second}},
		MetricsAddress: "127.0.0.1:9655", Role: RoleNode,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
}

func TestGivenKeysOverrideTheDefaults(t *testing.T) {
	data := `{
	  "asn": 4200000000, "routerID": "198.51.100.7", "underlay": "192.0.2.11",
	  "listenPort": -1, "routeTargetASN": 65000,
	  "gracefulRestart": {"enabled": false, "restartSeconds": 300},
	  "withdrawHoldSeconds": 0, "staleRoutesSeconds": 0,
	  "peers": [{"address": "2001:db8::1", "asn": 65000, "port": 1179,
	             "holdSeconds": 3, "keepaliveSeconds": 1, "password": "s3cret"}],
	  "metricsAddress": ""
	}`
	c, err := Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		ASN: 4200000000, RouterID: netip.MustParseAddr("198.51.100.7"), Underlay: netip.MustParseAddr("192.0.2.11"),
		ListenPort: -1, RouteTargetASN: 65000, GracefulRestart: false, RestartTime: 300 * time.Second,
		Peers: []Peer{{Address: netip.MustParseAddr("2001:db8::1"), ASN: 65000, Port: 1179,
			Hold: 3 * time.Second, Keepalive: time.Second, Password: "s3cret"}},
		Role: RoleNode,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
}

func TestThePathIsTheFlagThenTheEnvironmentThenTheDefault(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvConfig {
				return v
			}
			return ""
		}
	}
	cases := []struct{ flag, env, want string }{
		{"/flag.json", "/env.json", "/flag.json"},
		{"", "/env.json", "/env.json"},
		{"", "", DefaultPath},
	}
	for _, tc := range cases {
		if got := Path(tc.flag, env(tc.env)); got != tc.want {
			t.Errorf("Path(%q) with env %q = %q, want %q", tc.flag, tc.env, got, tc.want)
		}
	}
	if DefaultPath != "/etc/galactic/router.json" || EnvConfig != "GALACTIC_ROUTER_CONFIG" {
		t.Errorf("the documented path and variable changed: %s %s", DefaultPath, EnvConfig)
	}
}

func TestLoadNamesTheFileItRefuses(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	if err := os.WriteFile(good, encode(t, minimal()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"asn": 0}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(good); err != nil {
		t.Errorf("Load(good) = %v", err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "asn: ") {
		t.Errorf("Load(bad) = %v, want the path and the key", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file was accepted")
	}
}
