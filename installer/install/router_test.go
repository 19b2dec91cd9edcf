package install

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

func ptr[T any](v T) *T { return &v }

// routerFlags are the flags a node on the example fabric would be given.
func routerFlags() RouterSettings {
	return RouterSettings{
		ASN: ptr[int64](65010), Underlay: ptr("192.0.2.11"), ListenPort: ptr[int64](-1),
		Peers: []RouterPeer{{Address: "192.0.2.1", ASN: 65000}, {Address: "fd00::1", ASN: 65000, Port: ptr[int64](1179)}},
	}
}

func TestInstallWritesTheRouterConfigFromFlagsAndUninstallRemovesIt(t *testing.T) {
	f := newFixture(t)
	before := harness.Tree(t, f.root, false)
	o := f.options()
	o.Router = routerFlags()
	o.Router.RestartSeconds = ptr[int64](60)
	must(t, Install(o))

	path := f.path("/etc/galactic/router.json")
	st, err := os.Stat(path)
	must(t, err)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("router.json mode %s, want 0600 (it may hold peer passwords)", st.Mode())
	}
	// The router reads it with its own loader.
	c, err := config.Load(path)
	must(t, err)
	if c.ASN != 65010 || c.Underlay.String() != "192.0.2.11" || c.RouterID.String() != "192.0.2.11" || c.ListenPort != -1 ||
		c.RouteTargetASN != 65010 || c.RestartTime != time.Minute || len(c.Peers) != 2 || c.Peers[1].Port != 1179 || c.Peers[0].Port != 179 {
		t.Errorf("router config %+v", c)
	}
	if !strings.Contains(f.out.String(), "install: "+path+"\n") {
		t.Errorf("install output lacks router.json:\n%s", f.out.String())
	}
	r, _, err := readRecord(f.path("/var/lib/galactic/installed.json"))
	must(t, err)
	if !slices.Contains(r.Files, "/etc/galactic/router.json") {
		t.Errorf("router.json is not on the install record: %v", r.Files)
	}

	f.out.Reset()
	must(t, Install(o))
	if !strings.Contains(f.out.String(), "unchanged: "+path+"\n") {
		t.Errorf("a second install should leave router.json alone:\n%s", f.out.String())
	}
	// No galactic-router to drain with: uninstall says so and goes on.
	o.RouterBinary = filepath.Join(t.TempDir(), "missing")
	must(t, Uninstall(o))
	if after := harness.Tree(t, f.root, false); after != before {
		t.Errorf("uninstall did not restore the root:\n%s", after)
	}
}

func TestInstallWithoutRouterInputsWritesNoRouterConfigAndSaysSo(t *testing.T) {
	f := newFixture(t)
	must(t, Install(f.options()))
	if _, err := os.Stat(f.path("/etc/galactic/router.json")); err == nil {
		t.Error("router.json written without router flags")
	}
	if !strings.Contains(f.out.String(), "router: no --router-* flag and no --router-config-file: "+f.path("/etc/galactic/router.json")+" not written") {
		t.Errorf("install should say it wrote no router config:\n%s", f.out.String())
	}

	// A config from an earlier install stays, and stays on the record.
	o := f.options()
	o.Router = routerFlags()
	must(t, Install(o))
	written, err := os.ReadFile(f.path("/etc/galactic/router.json"))
	must(t, err)
	f.out.Reset()
	must(t, Install(f.options()))
	if got, _ := os.ReadFile(f.path("/etc/galactic/router.json")); string(got) != string(written) {
		t.Errorf("an install without router inputs changed router.json:\n%s", got)
	}
	if !strings.Contains(f.out.String(), "router.json kept as it is") || !strings.Contains(f.out.String(), "nothing changed") {
		t.Errorf("install output:\n%s", f.out.String())
	}
}

func TestAMountedRouterConfigIsCopiedAsItIsOrWithTheFlagsOverItsKeys(t *testing.T) {
	f := newFixture(t)
	src := filepath.Join(t.TempDir(), "router.json")
	shared := `{"asn": 65010, "underlay": "192.0.2.99", "gracefulRestart": {"enabled": false}, "peers": [{"address": "192.0.2.1", "asn": 65000, "password": "s3cret"}]}` + "\n"
	must(t, os.WriteFile(src, []byte(shared), 0o644))
	o := f.options()
	o.RouterSource = src
	must(t, Install(o))
	got, err := os.ReadFile(f.path("/etc/galactic/router.json"))
	must(t, err)
	if string(got) != shared {
		t.Errorf("without flags the file is copied verbatim; got\n%s", got)
	}

	// The DaemonSet's case: the node's own underlay over the shared file.
	o.Router = RouterSettings{Underlay: ptr("192.0.2.12"), RestartSeconds: ptr[int64](30)}
	must(t, Install(o))
	c, err := config.Load(f.path("/etc/galactic/router.json"))
	must(t, err)
	if c.Underlay.String() != "192.0.2.12" || c.RouterID.String() != "192.0.2.12" || c.GracefulRestart || c.RestartTime != 30*time.Second ||
		len(c.Peers) != 1 || c.Peers[0].Password != "s3cret" {
		t.Errorf("merged config %+v", c)
	}
}

func TestABadRouterValueFailsInstallNamingTheKeyAndChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		file   string
		router func(r *RouterSettings)
		want   []string
	}{
		{"ASN 0", "", func(r *RouterSettings) { r.ASN = ptr[int64](0) }, []string{"asn: 0 is out of range", "--router-asn"}},
		{"an underlay that is not an address", "", func(r *RouterSettings) { r.Underlay = ptr("node-a") }, []string{"underlay", `"node-a" is not an IP address`, "--router-underlay"}},
		{"a peer ASN out of range", "", func(r *RouterSettings) { r.Peers = []RouterPeer{{Address: "192.0.2.1", ASN: 1 << 33}} }, []string{"peers[0].asn", "--router-peer"}},
		{"a route target ASN over 16 bits", "", func(r *RouterSettings) { r.RouteTargetASN = ptr[int64](70000) }, []string{"routeTargetASN", "1-65535", "--router-route-target-asn"}},
		{"a listen port out of range", "", func(r *RouterSettings) { r.ListenPort = ptr[int64](70000) }, []string{"listenPort", "--router-listen-port"}},
		{"a restart time out of range", "", func(r *RouterSettings) { r.RestartSeconds = ptr[int64](0) }, []string{"gracefulRestart.restartSeconds", "--router-graceful-restart-seconds"}},
		{"a metrics address without a port", "", func(r *RouterSettings) { r.MetricsAddress = ptr("127.0.0.1") }, []string{"metricsAddress", "--router-metrics-address"}},
		{"no ASN anywhere", "", func(r *RouterSettings) { r.ASN = nil }, []string{"asn: is required", "--router-* flags"}},
		{"an unknown key in the file", `{"asn": 65010, "underlay": "192.0.2.11", "peers": [{"address": "192.0.2.1", "asn": 1}], "holdTime": 3}`, nil,
			[]string{"holdTime: unknown key", "--router-config-file"}},
		{"keepalive not below hold time in the file", `{"asn": 65010, "underlay": "192.0.2.11", "peers": [{"address": "192.0.2.1", "asn": 1, "holdSeconds": 3, "keepaliveSeconds": 3}]}`, nil,
			[]string{"peers[0].keepaliveSeconds", "below holdSeconds", "--router-config-file"}},
		{"a file that is not JSON", `asn = 65010`, func(r *RouterSettings) {}, []string{"--router-config-file", "not a JSON object"}},
		{"a missing file", "-", nil, []string{"cannot read --router-config-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			o := f.options()
			if tc.router != nil {
				o.Router = routerFlags()
				tc.router(&o.Router)
			}
			switch tc.file {
			case "":
			case "-":
				o.RouterSource = filepath.Join(t.TempDir(), "absent.json")
			default:
				o.RouterSource = filepath.Join(t.TempDir(), "router.json")
				must(t, os.WriteFile(o.RouterSource, []byte(tc.file), 0o644))
			}
			before := harness.Tree(t, f.root, true)
			err := Install(o)
			if err == nil {
				t.Fatal("install succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if after := harness.Tree(t, f.root, true); after != before {
				t.Errorf("a failed install changed the root:\n%s", after)
			}
		})
	}
}

func TestUninstallDrainsTheRouterFirstAndGoesOnWhenTheDrainFails(t *testing.T) {
	for _, tc := range []struct {
		name, exit, want string
	}{
		{"the router drains", "0", "router drain: drained"},
		{"no router answers", "1", "router drain failed, uninstalling anyway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			o := f.options()
			o.Router = routerFlags()
			must(t, Install(o))
			// A stand-in that records its arguments and whether the config
			// and node settings were still there when it ran.
			calls := filepath.Join(t.TempDir(), "calls")
			o.RouterBinary = filepath.Join(t.TempDir(), "galactic-router")
			script := "#!/bin/sh\necho \"$@\" >>" + calls + "\ntest -f \"$3\" && test -f \"$5\" && echo present >>" + calls + "\necho drained\nexit " + tc.exit + "\n"
			must(t, os.WriteFile(o.RouterBinary, []byte(script), 0o755))
			f.out.Reset()

			must(t, Uninstall(o))
			got, err := os.ReadFile(calls)
			must(t, err)
			want := "drain --config " + f.path("/etc/galactic/router.json") + " --node-config " + f.path("/etc/galactic/node.json") + "\npresent\n"
			if string(got) != want {
				t.Errorf("galactic-router was run as\n%s\nwant\n%s", got, want)
			}
			if !strings.Contains(f.out.String(), tc.want) {
				t.Errorf("uninstall output lacks %q:\n%s", tc.want, f.out.String())
			}
			if _, err := os.Stat(f.path("/etc/galactic/router.json")); err == nil {
				t.Error("router.json survived uninstall")
			}
		})
	}
}

func TestUninstallDrainsNothingWithoutARouterConfigAndADryRunOnlySaysWhatItWouldRun(t *testing.T) {
	f := newFixture(t)
	must(t, Install(f.options()))
	o := f.options()
	calls := filepath.Join(t.TempDir(), "calls")
	o.RouterBinary = filepath.Join(t.TempDir(), "galactic-router")
	must(t, os.WriteFile(o.RouterBinary, []byte("#!/bin/sh\necho ran >>"+calls+"\n"), 0o755))
	o.DryRun = true
	must(t, Uninstall(o))

	o.Router = routerFlags()
	o.DryRun = false
	must(t, Install(o))
	f.out.Reset()
	o.DryRun = true
	must(t, Uninstall(o))
	if _, err := os.Stat(calls); err == nil {
		t.Error("galactic-router ran during a dry run or without a router config")
	}
	if !strings.Contains(f.out.String(), "would run: "+o.RouterBinary+" drain --config ") {
		t.Errorf("dry run output:\n%s", f.out.String())
	}
}

func TestRouterPeersAreAddressASNAndAnOptionalPort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want RouterPeer
		ok   bool
	}{
		{"192.0.2.1:65000", RouterPeer{Address: "192.0.2.1", ASN: 65000}, true},
		{"192.0.2.1:65000:1179", RouterPeer{Address: "192.0.2.1", ASN: 65000, Port: ptr[int64](1179)}, true},
		{"[fd00::1]:65000", RouterPeer{Address: "fd00::1", ASN: 65000}, true},
		{"[fd00::1]:65000:179", RouterPeer{Address: "fd00::1", ASN: 65000, Port: ptr[int64](179)}, true},
		{"192.0.2.1", RouterPeer{}, false},
		{"192.0.2.1:", RouterPeer{}, false},
		{"fd00::1:65000", RouterPeer{}, false},
		{"[fd00::1]65000", RouterPeer{}, false},
		{"192.0.2.1:65000:179:1", RouterPeer{}, false},
		{"rr.example:65000", RouterPeer{}, false},
		{"192.0.2.1:as65000", RouterPeer{}, false},
	} {
		got, err := ParseRouterPeer(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok && (got.Address != tc.want.Address || got.ASN != tc.want.ASN || (got.Port == nil) != (tc.want.Port == nil) || (got.Port != nil && *got.Port != *tc.want.Port)) {
			t.Errorf("%q: got %+v, want %+v", tc.in, got, tc.want)
		}
		if !tc.ok && !strings.Contains(err.Error(), "ADDRESS:ASN[:PORT]") {
			t.Errorf("%q: error %q does not say the form", tc.in, err)
		}
	}
}

func TestTheExampleRouterConfigMapIsValidOnceANodeAddsItsUnderlay(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "manifests", "router-config.yaml"))
	must(t, err)
	var cm struct {
		Data map[string]string `json:"data"`
	}
	must(t, utilyaml.Unmarshal(data, &cm))
	src := filepath.Join(t.TempDir(), "router.json")
	must(t, os.WriteFile(src, []byte(cm.Data["router.json"]), 0o644))

	f := newFixture(t)
	o := f.options()
	o.RouterSource, o.Router = src, RouterSettings{Underlay: ptr("192.0.2.11")}
	must(t, Install(o))
	c, err := config.Load(f.path("/etc/galactic/router.json"))
	must(t, err)
	// The router container has NET_ADMIN only: it cannot bind port 179.
	if c.ListenPort != -1 || c.MetricsAddress != "127.0.0.1:9655" {
		t.Errorf("example config: listenPort %d metricsAddress %q", c.ListenPort, c.MetricsAddress)
	}
	var m map[string]any
	must(t, json.Unmarshal([]byte(cm.Data["router.json"]), &m))
	if _, ok := m["underlay"]; ok {
		t.Error("the shared ConfigMap must not hold one node's underlay")
	}
}
