package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/advert/adverttest"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

const advName = "blue.web-0-net0.node-a"

// testEnv is a plugin wired to an in-memory API and a temporary node.
type testEnv struct {
	p      *plugin
	api    *adverttest.Fake
	stdout *bytes.Buffer
	dir    string
	env    map[string]string
	live   map[string]bool
}

func newTestEnv(t *testing.T, allowed ...string) *testEnv {
	dir := t.TempDir()
	e := &testEnv{
		api:    adverttest.New(t, allowed...),
		stdout: &bytes.Buffer{},
		dir:    dir,
		live:   map[string]bool{},
		env: map[string]string{
			settings.EnvConfig:   filepath.Join(dir, "absent-node.json"),
			settings.EnvNodeName: "node-a",
			settings.EnvStateDir: filepath.Join(dir, "state"),
			settings.EnvLogFile:  filepath.Join(dir, "galactic.log"),
		},
	}
	e.p = &plugin{
		getenv:      func(k string) string { return e.env[k] },
		stdout:      e.stdout,
		now:         time.Now,
		live:        func(p string) bool { return e.live[p] },
		connect:     func(settings.Node) (advert.API, error) { return e.api, nil },
		apiRequests: func() int64 { return int64(len(e.api.Calls())) },
		timeouts:    defaultTimeouts,
		sleep:       func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
	}
	return e
}

func (e *testEnv) record(t *testing.T, r state.Record) {
	t.Helper()
	if err := state.NewStore(e.env[settings.EnvStateDir]).Put(r); err != nil {
		t.Fatal(err)
	}
}

// logLines returns the node log's JSON lines.
func (e *testEnv) logLines(t *testing.T) []map[string]any {
	t.Helper()
	f, err := os.Open(e.env[settings.EnvLogFile])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	s := bufio.NewScanner(f)
	for s.Scan() {
		var m map[string]any
		if err := json.Unmarshal(s.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", s.Text(), err)
		}
		lines = append(lines, m)
	}
	return lines
}

const prevResult = `{"cniVersion":"1.1.0","interfaces":[{"name":"gt72f115ce5f437"}],` +
	`"ips":[{"address":"10.20.0.5/24","gateway":"10.20.0.1"},{"address":"fd20::5/64"}]}`

func stanza(extra string) []byte {
	s := `{"cniVersion":"1.1.0","name":"vpc-blue","type":"galactic-bgp","vpc":"blue","attachment":"web-0-net0"`
	if extra != "" {
		s += "," + extra
	}
	return []byte(s + "}")
}

func args(cid string, conf []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: cid, IfName: "net0", Netns: "/run/netns/" + cid, StdinData: conf}
}

func wantCode(t *testing.T, err error, code uint, msg string) {
	t.Helper()
	var terr *types.Error
	if !errors.As(err, &terr) {
		t.Fatalf("want CNI error %d, got %v", code, err)
	}
	if terr.Code != code || !strings.Contains(terr.Msg, msg) {
		t.Fatalf("got code %d %q, want code %d mentioning %q", terr.Code, terr.Msg, code, msg)
	}
}

func TestParseConfRejectsBadStanzasAndPrevResults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		conf     string
		needPrev bool
		code     uint
		msg      string
	}{
		{"not JSON", `{"vpc":`, false, types.ErrDecodingFailure, "not valid JSON"},
		{"no vpc", `{"cniVersion":"1.1.0","attachment":"a"}`, false, types.ErrInvalidNetworkConfig, `attachment "a" needs namespace`},
		{"no vpc beside a vni", `{"cniVersion":"1.1.0","attachment":"a","vni":5}`, false, types.ErrInvalidNetworkConfig, "vpc is required"},
		{"bad attachment", `{"cniVersion":"1.1.0","vpc":"blue","attachment":"Web_0"}`, false, types.ErrInvalidNetworkConfig, `attachment "Web_0"`},
		{"no prevResult", string(stanza("")), true, types.ErrInvalidNetworkConfig, "no prevResult"},
		{"prevResult of the wrong shape", string(stanza(`"prevResult":{"ips":"10.20.0.5"}`)), true, types.ErrDecodingFailure, "prevResult"},
		{"prevResult IP without an address", string(stanza(`"prevResult":{"cniVersion":"1.1.0","ips":[{"gateway":"10.20.0.1"}]}`)), true, types.ErrDecodingFailure, "without an address"},
		{"vni zero", string(stanza(`"vni":0`)), false, types.ErrInvalidNetworkConfig, "vni 0 is out of range"},
		{"vni past 24 bits", string(stanza(`"vni":16777216`)), false, types.ErrInvalidNetworkConfig, "1-16777215"},
		{"negative vni", string(stanza(`"vni":-5`)), false, types.ErrInvalidNetworkConfig, "vni -5"},
		{"vni not a number", string(stanza(`"vni":"10100"`)), false, types.ErrDecodingFailure, "not valid JSON"},
		{"unknown announce", string(stanza(`"announce":"sometimes"`)), false, types.ErrInvalidNetworkConfig, `announce "sometimes"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConf([]byte(tc.conf), tc.needPrev, netconf.ResolveOptions{Required: true})
			wantCode(t, err, tc.code, tc.msg)
		})
	}
}

func TestParseConfReadsThePrevResultInTheConfigsVersion(t *testing.T) {
	conf := `{"cniVersion":"0.4.0","name":"n","type":"galactic-bgp","vpc":"blue","attachment":"a",` +
		`"prevResult":{"interfaces":[{"name":"x"}],"ips":[{"version":"4","address":"10.0.0.2/24"}]}}`
	c, err := parseConf([]byte(conf), true, netconf.ResolveOptions{Required: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Prev.Version() != "0.4.0" || len(c.IPs) != 1 || !c.IPs[0].Equal(net.ParseIP("10.0.0.2")) {
		t.Fatalf("prev %s ips %v", c.Prev.Version(), c.IPs)
	}
	if c, err := parseConf(stanza(""), false, netconf.ResolveOptions{Required: true}); err != nil || c.Prev != nil {
		t.Fatalf("verbs without prevResult: %v %v", c, err)
	}
}

func TestAddPublishesHostPrefixesAndPassesPrevResultThrough(t *testing.T) {
	e := newTestEnv(t, "get", "create", "list")
	e.record(t, state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0",
		Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, HolderGeneration: 7})
	if err := e.p.cmdAdd(args("c1", stanza(`"prevResult":`+prevResult))); err != nil {
		t.Fatal(err)
	}
	obj := e.api.Object(advName)
	if obj == nil {
		t.Fatal("no advertisement")
	}
	want := []v1alpha1.Prefix{"10.20.0.5/32", "fd20::5/128"}
	if !slices.Equal(obj.Spec.Prefixes, want) {
		t.Errorf("spec.prefixes = %q, want %q", obj.Spec.Prefixes, want)
	}
	c := obj.Spec.Containers[0]
	if c.ContainerID != "c1" || c.IfName != "net0" || c.Netns != "/run/netns/c1" || c.HolderGeneration != 7 || !slices.Equal(c.Prefixes, want) {
		t.Errorf("entry = %+v", c)
	}
	var got, sent map[string]any
	if err := json.Unmarshal(e.stdout.Bytes(), &got); err != nil {
		t.Fatalf("stdout %q: %v", e.stdout, err)
	}
	_ = json.Unmarshal([]byte(prevResult), &sent)
	gotJSON, _ := json.Marshal(got)
	sentJSON, _ := json.Marshal(sent)
	if !bytes.Equal(gotJSON, sentJSON) {
		t.Errorf("result %s\nwant prevResult %s", gotJSON, sentJSON)
	}
	if calls := e.api.Calls(); len(calls) != 3 {
		t.Errorf("calls = %q, want get, create and list", calls)
	}
	lines := e.logLines(t)
	if len(lines) != 1 || lines[0]["verb"] != "ADD" || lines[0]["outcome"] != "created" || lines[0]["containerID"] != "c1" || lines[0]["apiRequests"] != 3.0 {
		t.Errorf("log = %v", lines)
	}
}

func TestAddRecordsTheVNIAndAnnouncePolicy(t *testing.T) {
	e := newTestEnv(t, "get", "create", "list")
	e.record(t, state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0",
		Addresses: []string{"10.20.0.5/24"}, Holder: "node-a/c1", HolderGeneration: 2})
	if err := e.p.cmdAdd(args("c1", stanza(`"vni":10100,"announce":"whenAvailable","prevResult":`+prevResult))); err != nil {
		t.Fatal(err)
	}
	obj := e.api.Object(advName)
	if obj == nil || obj.Spec.VNI != 10100 || obj.Spec.Announce != v1alpha1.AnnounceWhenAvailable {
		t.Fatalf("advertisement = %+v", obj)
	}
}

func TestAddWithoutAVNIRecordsAnnounceAlwaysAndNoVNI(t *testing.T) {
	e := newTestEnv(t, "get", "create", "list")
	if err := e.p.cmdAdd(args("c1", stanza(`"prevResult":`+prevResult))); err != nil {
		t.Fatal(err)
	}
	if obj := e.api.Object(advName); obj == nil || obj.Spec.VNI != 0 || obj.Spec.Announce != v1alpha1.AnnounceAlways {
		t.Fatalf("advertisement = %+v", obj)
	}
}

func TestAddRejectsWhenAvailableWithoutHandoffAndPublishesNothing(t *testing.T) {
	e := newTestEnv(t)
	e.record(t, state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0",
		Addresses: []string{"10.20.0.5/24"}})
	err := e.p.cmdAdd(args("c1", stanza(`"vni":10100,"announce":"whenAvailable","prevResult":`+prevResult)))
	wantCode(t, err, types.ErrInvalidNetworkConfig, "needs the handoff lease")
	if calls := e.api.Calls(); len(calls) != 0 {
		t.Errorf("calls = %q, want none", calls)
	}
}

func TestAddWithoutAddressesPublishesNothingButStillCleansUpOtherNodes(t *testing.T) {
	e := newTestEnv(t, "list", "delete")
	stale := e.api.Seed(&v1alpha1.BGPAdvertisement{
		ObjectMeta: metaFor("blue", "web-0-net0", "node-b"),
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "web-0-net0", Node: "node-b"},
	})
	e.record(t, state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0"})
	if err := e.p.cmdAdd(args("c1", stanza(`"prevResult":{"cniVersion":"1.1.0"}`))); err != nil {
		t.Fatal(err)
	}
	if e.api.Object(advName) != nil {
		t.Error("nothing to advertise must not create an advertisement")
	}
	if e.api.Object(stale.Name) != nil {
		t.Error("the other node's advertisement must be deleted")
	}
}

func TestAddKeepsGoingWhenOtherNodesCannotBeCleanedUp(t *testing.T) {
	e := newTestEnv(t, "get", "create", "list")
	e.api.React = func(verb, _ string) error {
		if verb == "list" {
			return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
		}
		return nil
	}
	if err := e.p.cmdAdd(args("c1", stanza(`"prevResult":`+prevResult))); err != nil {
		t.Fatalf("a failed cleanup must not fail ADD: %v", err)
	}
	if e.stdout.Len() == 0 {
		t.Error("ADD must still print its result")
	}
	if l := e.logLines(t)[0]; l["level"] != "WARN" || !strings.Contains(l["deleteOthersError"].(string), "refused") {
		t.Errorf("log = %v", l)
	}
}

func TestBadAddInputsGiveClearErrorsAndTouchNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*testEnv)
		conf  []byte
		code  uint
		msg   string
	}{
		{"no prevResult", nil, stanza(""), types.ErrInvalidNetworkConfig, "no prevResult"},
		{"prevResult without IPs while galactic-cni configured addresses", func(e *testEnv) {
			_ = state.NewStore(e.env[settings.EnvStateDir]).Put(state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0", Addresses: []string{"10.20.0.5/24"}})
		}, stanza(`"prevResult":{"cniVersion":"1.1.0"}`), types.ErrInvalidNetworkConfig, "prevResult has no IPs although galactic-cni configured [10.20.0.5/24]"},
		{"a stanza naming another attachment than galactic-cni's", func(e *testEnv) {
			_ = state.NewStore(e.env[settings.EnvStateDir]).Put(state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "db-0-net0"})
		}, stanza(`"prevResult":` + prevResult), types.ErrInvalidNetworkConfig, "both stanzas must name the same"},
		{"missing node name", func(e *testEnv) { delete(e.env, settings.EnvNodeName) }, stanza(`"prevResult":` + prevResult), types.ErrPluginNotAvailable, "node name is not set"},
		{"unreadable node config", func(e *testEnv) {
			p := filepath.Join(e.dir, "node.json")
			_ = os.WriteFile(p, []byte("{"), 0o644)
			e.env[settings.EnvConfig] = p
		}, stanza(`"prevResult":` + prevResult), types.ErrPluginNotAvailable, "not valid JSON"},
		{"unreadable kubeconfig", func(e *testEnv) {
			e.env[settings.EnvKubeconfig] = filepath.Join(e.dir, "missing-kubeconfig")
			e.p.connect = connect
		}, stanza(`"prevResult":` + prevResult), types.ErrPluginNotAvailable, "missing-kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t) // the catch-all fails on any API call
			if tc.setup != nil {
				tc.setup(e)
			}
			wantCode(t, e.p.cmdAdd(args("c1", tc.conf)), tc.code, tc.msg)
			if e.stdout.Len() != 0 {
				t.Errorf("a failed ADD printed %q", e.stdout)
			}
		})
	}
}

func TestAddFailsWithTryAgainLaterWhenTheAPIServerStaysUnreachable(t *testing.T) {
	e := newTestEnv(t, "get")
	e.api.React = func(string, string) error { return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED} }
	e.p.timeouts.add = 50 * time.Millisecond
	e.p.sleep = nil
	err := e.p.cmdAdd(args("c1", stanza(`"prevResult":`+prevResult)))
	wantCode(t, err, types.ErrTryAgainLater, "publishing")
}

func metaFor(vpc, att, node string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: names.Advertisement(vpc, att, node), Labels: names.AdvertisementLabels(vpc, att, node)}
}

func seedEntries(e *testEnv, entries ...v1alpha1.ContainerEntry) {
	obj := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metaFor("blue", "web-0-net0", "node-a"),
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "web-0-net0", Node: "node-a", Containers: entries, Prefixes: advert.Union(entries)},
	}
	e.api.Seed(obj)
}

func TestDelReleasesTheEntryAndDeletesTheLastAdvertisement(t *testing.T) {
	e := newTestEnv(t, "get", "delete")
	seedEntries(e, v1alpha1.ContainerEntry{ContainerID: "c1", IfName: "net0", Netns: "/run/netns/c1", Prefixes: []v1alpha1.Prefix{"10.20.0.5/32"}})
	if err := e.p.cmdDel(args("c1", stanza(""))); err != nil {
		t.Fatal(err)
	}
	if e.api.Object(advName) != nil {
		t.Error("the advertisement must be deleted")
	}
	if l := e.logLines(t)[0]; l["outcome"] != "deleted" {
		t.Errorf("log = %v", l)
	}
}

func TestDelSucceedsWhenItCannotRelease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*testEnv)
	}{
		{"API server unreachable", func(e *testEnv) {
			e.api = adverttest.New(t, "get")
			e.api.React = func(string, string) error { return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED} }
			e.p.timeouts.del = 50 * time.Millisecond
			e.p.sleep = nil
		}},
		{"node name missing", func(e *testEnv) { delete(e.env, settings.EnvNodeName) }},
		{"kubeconfig unreadable", func(e *testEnv) {
			e.env[settings.EnvKubeconfig] = filepath.Join(e.dir, "missing-kubeconfig")
			e.p.connect = connect
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			tc.setup(e)
			if err := e.p.cmdDel(args("c1", stanza(""))); err != nil {
				t.Fatalf("DEL must succeed so galactic-cni's DEL runs: %v", err)
			}
			l := e.logLines(t)
			if len(l) != 1 || l[0]["level"] != "WARN" || !strings.Contains(l[0]["outcome"].(string), "node GC") {
				t.Errorf("log = %v", l)
			}
		})
	}
}

func TestDelWithAnInvalidStanzaSucceedsSoGalacticCNIsDelStillRuns(t *testing.T) {
	e := newTestEnv(t) // no API call allowed
	if err := e.p.cmdDel(args("c1", []byte(`{"cniVersion":"1.1.0","vpc":"blue"}`))); err != nil {
		t.Fatal(err)
	}
	if l := e.logLines(t)[0]; l["level"] != "WARN" || !strings.Contains(l["reason"].(string), "attachment is required") {
		t.Errorf("log = %v", l)
	}
}

func TestCheckVerifiesTheEntryAndItsPrefixes(t *testing.T) {
	good := v1alpha1.ContainerEntry{ContainerID: "c1", IfName: "net0", Netns: "/run/netns/c1", Prefixes: []v1alpha1.Prefix{"10.20.0.5/32", "fd20::5/128"}}
	for _, tc := range []struct {
		name  string
		entry *v1alpha1.ContainerEntry
		msg   string
	}{
		{"published", &good, ""},
		{"no advertisement", nil, "does not exist"},
		{"other prefixes", &v1alpha1.ContainerEntry{ContainerID: "c1", IfName: "net0", Netns: "/run/netns/c1", Prefixes: []v1alpha1.Prefix{"10.20.0.5/32"}}, "prevResult has"},
		{"no entry", &v1alpha1.ContainerEntry{ContainerID: "c2", IfName: "net0", Netns: "/run/netns/c2"}, "no entry for container c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, "get")
			if tc.entry != nil {
				seedEntries(e, *tc.entry)
			}
			err := e.p.cmdCheck(args("c1", stanza(`"prevResult":`+prevResult)))
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, types.ErrInternal, tc.msg)
		})
	}
}

func TestStatusReportsWhyThePluginIsNotAvailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*testEnv)
		msg   string
	}{
		{"missing node name", func(e *testEnv) { delete(e.env, settings.EnvNodeName) }, "node name is not set"},
		{"unreadable kubeconfig", func(e *testEnv) {
			e.env[settings.EnvKubeconfig] = filepath.Join(e.dir, "missing-kubeconfig")
			e.p.connect = connect
		}, "missing-kubeconfig"},
		{"API server down", func(e *testEnv) {
			e.api = adverttest.New(t, "list")
			e.api.React = func(string, string) error { return &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED} }
		}, "API server cannot be used"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			tc.setup(e)
			wantCode(t, e.p.cmdStatus(&skel.CmdArgs{StdinData: stanza("")}), types.ErrPluginNotAvailable, tc.msg)
		})
	}
	e := newTestEnv(t, "list")
	if err := e.p.cmdStatus(&skel.CmdArgs{StdinData: stanza("")}); err != nil {
		t.Fatalf("a reachable API server: %v", err)
	}
	if calls := e.api.Calls(); !slices.Equal(calls, []string{"list " + names.NodeSelector("node-a")}) {
		t.Errorf("calls = %q", calls)
	}
}

func TestGCDropsExactlyTheEntriesNotValid(t *testing.T) {
	e := newTestEnv(t, "get", "update")
	var entries []v1alpha1.ContainerEntry
	for _, id := range []string{"c1", "c2", "c3"} {
		e.live["/run/netns/"+id] = true
		entries = append(entries, v1alpha1.ContainerEntry{ContainerID: id, IfName: "net0", Netns: "/run/netns/" + id})
	}
	seedEntries(e, entries...)
	conf := stanza(`"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net0"},{"containerID":"c3","ifname":"net0"},{"containerID":"c2","ifname":"net9"}]`)
	if err := e.p.cmdGC(&skel.CmdArgs{StdinData: conf}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range e.api.Object(advName).Spec.Containers {
		ids = append(ids, c.ContainerID)
	}
	if !slices.Equal(ids, []string{"c1", "c3"}) {
		t.Errorf("entries = %q", ids)
	}
}
