// Package bgp runs the chain galactic-cni then galactic-bgp with the real
// cnitool (and libcni where error codes matter) against a real
// kube-apiserver, with network namespaces as nodes and containers.
package bgp

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestDelDeletesTheAdvertisementOfTheLastContainer(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	c := harness.NewContainer(t)
	const att = "last-0-net0"
	writeChain(t, node, att, "10.20.1.5/24", "fd20:1::5/64")

	out := run(t, node, "add", att, c)
	var res current.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.IPs) != 2 {
		t.Fatalf("the chain's result should be galactic-cni's, passed through: %v\n%s", err, out)
	}
	adv := advertisement(t, env, att, "node-a")
	if adv == nil {
		t.Fatal("ADD should publish the advertisement")
	}
	if want := []v1alpha1.Prefix{"10.20.1.5/32", "fd20:1::5/128"}; !slices.Equal(adv.Spec.Prefixes, want) {
		t.Fatalf("spec.prefixes = %q, want %q", adv.Spec.Prefixes, want)
	}
	e := adv.Spec.Containers
	if len(e) != 1 || e[0].ContainerID != cid(c) || e[0].IfName != ifName || e[0].Netns != c.Path || e[0].HolderGeneration != 0 {
		t.Fatalf("entries = %+v", e)
	}
	run(t, node, "check", att, c)

	run(t, node, "del", att, c)
	if advertisement(t, env, att, "node-a") != nil {
		t.Fatal("DEL of the last container should delete the advertisement")
	}
	if hostInterfaceExists(node, att) {
		t.Fatal("galactic-cni's DEL should have removed the tap after galactic-bgp's")
	}
	if l := lastLog(t, node, "DEL", c); l.Outcome != "deleted" {
		t.Fatalf("DEL log: %+v", l)
	}
}

func TestDelKeepsTheReplacementsAdvertisementAndPrefixes(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	old, replacement := harness.NewContainer(t), harness.NewContainer(t)
	const att = "upgrade-0-net0"
	writeChain(t, node, att, "10.20.2.5/24")

	run(t, node, "add", att, old)
	before := advertisement(t, env, att, "node-a")
	// The replacement's ADD runs before the predecessor's DEL.
	run(t, node, "add", att, replacement)
	if got := entryIDs(advertisement(t, env, att, "node-a")); !slices.Equal(got, ids(old, replacement)) {
		t.Fatalf("both containers should be published during the upgrade: %q", got)
	}
	run(t, node, "del", att, old)

	after := advertisement(t, env, att, "node-a")
	if after == nil {
		t.Fatal("the predecessor's DEL must keep the replacement's advertisement")
	}
	if after.UID != before.UID {
		t.Fatal("the advertisement must never have been deleted and recreated (routers would flap)")
	}
	if got := entryIDs(after); !slices.Equal(got, ids(replacement)) {
		t.Fatalf("entries = %q, want only the replacement's", got)
	}
	if !slices.Equal(after.Spec.Prefixes, []v1alpha1.Prefix{"10.20.2.5/32"}) {
		t.Fatalf("spec.prefixes = %q", after.Spec.Prefixes)
	}
	if !hostInterfaceExists(node, att) {
		t.Fatal("the replacement keeps its tap too")
	}
	run(t, node, "del", att, replacement)
	if advertisement(t, env, att, "node-a") != nil {
		t.Fatal("the replacement's DEL should delete the advertisement")
	}
}

func TestDelWithNothingToReleaseSucceedsAndWritesNothing(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	const att = "nothing-0-net0"
	writeChain(t, node, att, "10.20.3.5/24")

	t.Run("no advertisement", func(t *testing.T) {
		never := harness.NewContainer(t)
		run(t, node, "del", att, never)
		if advertisement(t, env, att, "node-a") != nil {
			t.Fatal("DEL must not create an advertisement")
		}
		if l := lastLog(t, node, "DEL", never); l.Outcome != "absent" || l.APIRequests != 1 {
			t.Fatalf("want one read and no write: %+v", l)
		}
	})
	t.Run("an advertisement without this entry", func(t *testing.T) {
		published, never := harness.NewContainer(t), harness.NewContainer(t)
		run(t, node, "add", att, published)
		before := advertisement(t, env, att, "node-a")
		run(t, node, "del", att, never)
		after := advertisement(t, env, att, "node-a")
		if after == nil || after.ResourceVersion != before.ResourceVersion {
			t.Fatal("the advertisement must be left exactly as it was")
		}
		if l := lastLog(t, node, "DEL", never); l.Outcome != "unchanged" || l.APIRequests != 1 {
			t.Fatalf("want one read and no write: %+v", l)
		}
		run(t, node, "del", att, published)
	})
}

func TestAddDeletesOnlyOtherNodesAdvertisementsOfTheSameAttachment(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	c := harness.NewContainer(t)
	const att = "moved-0-net0"
	writeChain(t, node, att, "10.20.4.5/24")

	onB := seed(t, env, vpc, att, "node-b", "10.20.4.5/32")
	onC := seed(t, env, vpc, att, "node-c", "10.20.4.5/32")
	otherAttachment := seed(t, env, vpc, "other-0-net0", "node-b", "10.20.4.9/32")
	otherVPC := seed(t, env, "red", att, "node-b", "10.20.4.5/32")

	run(t, node, "add", att, c)
	t.Cleanup(func() { _, _ = node.CNITool("del", att, c, ifName) })

	got := advertisementsOf(t, env, vpc, att)
	if len(got) != 1 || got[0].Spec.Node != "node-a" {
		t.Fatalf("only node-a's advertisement of %s/%s should remain, have %d", vpc, att, len(got))
	}
	for _, keep := range []*v1alpha1.BGPAdvertisement{otherAttachment, otherVPC} {
		if _, err := env.API.BGPAdvertisements(harness.Namespace).Get(context.Background(), keep.Name, metav1.GetOptions{}); err != nil {
			t.Fatalf("%s belongs to another attachment and must be untouched: %v", keep.Name, err)
		}
	}
	l := lastLog(t, node, "ADD", c)
	t.Logf("ADD deleted %s and %s with UID+resourceVersion preconditions (%d API requests)", onB.Name, onC.Name, l.APIRequests)
}

func TestAMoveWithoutHandoffEndsWithExactlyTheNewNodesAdvertisement(t *testing.T) {
	env := harness.Setup(t)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	onA, onB := harness.NewContainer(t), harness.NewContainer(t)
	const att = "move-0-net0"
	writeChain(t, nodeA, att, "10.20.5.5/24")
	writeChain(t, nodeB, att, "10.20.5.5/24")

	run(t, nodeA, "add", att, onA)
	run(t, nodeB, "add", att, onB)
	t.Cleanup(func() { _, _ = nodeB.CNITool("del", att, onB, ifName) })
	// A's DEL arrives late, after B took over.
	run(t, nodeA, "del", att, onA)

	got := advertisementsOf(t, env, vpc, att)
	if len(got) != 1 || got[0].Spec.Node != "node-b" || !slices.Equal(entryIDs(&got[0]), ids(onB)) {
		t.Fatalf("exactly B's advertisement should exist, have %+v", got)
	}
	if l := lastLog(t, nodeA, "DEL", onA); l.Outcome != "absent" || l.APIRequests != 1 {
		t.Fatalf("A's late DEL should find nothing and write nothing: %+v", l)
	}
	if hostInterfaceExists(nodeA, att) {
		t.Fatal("A's tap should be gone")
	}
}

func TestSixteenParallelAddsAndDelsOfOneAttachmentOnOneNode(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	const att = "crowd-0-net0"
	writeChain(t, node, att, "10.20.6.5/24")
	containers := make([]*harness.Netns, 16)
	for i := range containers {
		containers[i] = harness.NewContainer(t)
	}
	parallel := func(verb string) {
		var wg sync.WaitGroup
		errs := make([]error, len(containers))
		for i, c := range containers {
			wg.Go(func() { _, errs[i] = node.CNITool(verb, att, c, ifName) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	conflicts := func(verb string) int {
		n := 0
		for _, l := range bgpLog(t, node) {
			if l.Verb == verb {
				n += l.Conflicts
			}
		}
		return n
	}

	parallel("add")
	adv := advertisement(t, env, att, "node-a")
	if adv == nil || !slices.Equal(entryIDs(adv), ids(containers...)) {
		t.Fatalf("all 16 entries should be present, have %v", adv)
	}
	parallel("del")
	if advertisement(t, env, att, "node-a") != nil {
		t.Fatal("16 DELs should leave no advertisement")
	}
	addConflicts, delConflicts := conflicts("ADD"), conflicts("DEL")
	t.Logf("conflicts retried: %d during the 16 ADDs, %d during the 16 DELs", addConflicts, delConflicts)
	if addConflicts+delConflicts == 0 {
		t.Log("no write raced this time; TestPublishersThatReadTheSameVersionAllLandAfterRetrying forces the race")
	}
}

func TestAddPrunesAnEntryWhoseNetnsWasDeletedWithoutDel(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	gone, next := harness.NewContainer(t), harness.NewContainer(t)
	const att = "prune-0-net0"
	writeChain(t, node, att, "10.20.7.5/24")

	run(t, node, "add", att, gone)
	gone.Delete() // the runtime lost the container; DEL never ran
	run(t, node, "add", att, next)
	t.Cleanup(func() {
		_, _ = node.CNITool("del", att, next, ifName)
		_, _ = node.CNITool("del", att, gone, ifName)
	})

	if got := entryIDs(advertisement(t, env, att, "node-a")); !slices.Equal(got, ids(next)) {
		t.Fatalf("the dead entry should be pruned, entries %q", got)
	}
	if l := lastLog(t, node, "ADD", next); l.Outcome != "updated" {
		t.Fatalf("ADD log: %+v", l)
	}
}

func TestWithTheAPIServerUnreachableChainDelStillRemovesTheHostInterface(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	c := harness.NewContainer(t)
	const att = "cut-0-net0"
	writeChain(t, node, att, "10.20.8.5/24")
	run(t, node, "add", att, c)

	if err := node.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	run(t, node, "del", att, c)
	if err := node.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}

	if hostInterfaceExists(node, att) {
		t.Fatal("galactic-cni's DEL must still remove the tap")
	}
	l := lastLog(t, node, "DEL", c)
	if l.Level != "WARN" || !strings.Contains(l.Outcome, "node GC") || l.Reason == "" {
		t.Fatalf("DEL should log what it could not release: %+v", l)
	}
	left := advertisement(t, env, att, "node-a")
	if left == nil || !slices.Equal(entryIDs(left), ids(c)) {
		t.Fatalf("the entry should be left for the GC, have %+v", left)
	}

	// What the node GC does next: once the netns is gone the entry is
	// dead, and the same guarded writes delete the advertisement.
	c.Delete()
	list, err := env.API.BGPAdvertisements(harness.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: names.NodeSelector("node-a")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := advert.New(env.API.BGPAdvertisements(harness.Namespace)).Prune(context.Background(), "node-a", list.Items); err != nil {
		t.Fatal(err)
	}
	if advertisement(t, env, att, "node-a") != nil {
		t.Fatal("pruning should delete the advertisement DEL left behind")
	}
}

func TestGCWithAValidListDropsExactlyTheEntriesNotInIt(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	c1, c2, c3 := harness.NewContainer(t), harness.NewContainer(t), harness.NewContainer(t)
	const att = "gc-0-net0"
	writeChain(t, node, att, "10.20.9.5/24")
	for _, c := range []*harness.Netns{c1, c2, c3} {
		run(t, node, "add", att, c)
		t.Cleanup(func() { _, _ = node.CNITool("del", att, c, ifName) })
	}

	valid := []types.GCAttachment{{ContainerID: cid(c1), IfName: ifName}, {ContainerID: cid(c3), IfName: ifName}}
	if err := (harness.LibCNI{Node: node, Network: att}).GC(context.Background(), valid...); err != nil {
		t.Fatal(err)
	}
	if got := entryIDs(advertisement(t, env, att, "node-a")); !slices.Equal(got, ids(c1, c3)) {
		t.Fatalf("entries = %q, want exactly the valid ones", got)
	}
}

func TestCommonAddAndDelPathsStayWithinTheirRequestBudget(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	first, second := harness.NewContainer(t), harness.NewContainer(t)
	const att = "budget-0-net0"
	writeChain(t, node, att, "10.20.10.5/24")

	// The plugin counts its HTTP requests with a wrapping transport
	// (rest.Config.Wrap) and logs the count with each verb.
	for _, step := range []struct {
		verb    string
		c       *harness.Netns
		outcome string
		want    int
	}{
		{"ADD", first, "created", 3},   // get (not found), create, list others
		{"ADD", second, "updated", 3},  // get, update, list others
		{"DEL", first, "updated", 2},   // get, update
		{"DEL", second, "deleted", 2},  // get, delete
		{"DEL", second, "absent", 1},   // get
		{"ADD", first, "created", 3},   // again after the advertisement was deleted
		{"ADD", first, "unchanged", 2}, // a repeated ADD: get, list others
		{"DEL", first, "deleted", 2},
	} {
		run(t, node, strings.ToLower(step.verb), att, step.c)
		l := lastLog(t, node, step.verb, step.c)
		if l.Outcome != step.outcome || l.APIRequests != step.want {
			t.Fatalf("%s %s: outcome %q with %d API requests, want %q with %d", step.verb, cid(step.c), l.Outcome, l.APIRequests, step.outcome, step.want)
		}
	}
}

func TestBadInputsGiveClearCNIErrorsAndWriteNothing(t *testing.T) {
	env := harness.Setup(t)
	for _, tc := range []struct {
		name    string
		plugins func(att string) []map[string]any
		node    func(t *testing.T, n *harness.Node)
		code    uint
		msg     string
	}{
		{
			name:    "no prevResult",
			plugins: func(att string) []map[string]any { return []map[string]any{bgpStanza(att)} },
			code:    types.ErrInvalidNetworkConfig, msg: "no prevResult",
		},
		{
			name: "prevResult without IPs although galactic-cni configured addresses",
			plugins: func(att string) []map[string]any {
				return []map[string]any{cniStanza(att, "10.20.11.5/24"), {"type": "dropips"}, bgpStanza(att)}
			},
			code: types.ErrInvalidNetworkConfig, msg: "prevResult has no IPs although galactic-cni configured [10.20.11.5/24]",
		},
		{
			name: "missing node name",
			node: func(t *testing.T, n *harness.Node) {
				s := n.Settings
				s.NodeName = ""
				writeSettings(t, n, s)
			},
			code: types.ErrPluginNotAvailable, msg: "node name is not set",
		},
		{
			name: "unreadable kubeconfig",
			node: func(t *testing.T, n *harness.Node) {
				s := n.Settings
				s.Kubeconfig = n.Dir + "/garbled-kubeconfig"
				if err := os.WriteFile(s.Kubeconfig, []byte("clusters: ["), 0o600); err != nil {
					t.Fatal(err)
				}
				writeSettings(t, n, s)
			},
			code: types.ErrPluginNotAvailable, msg: "garbled-kubeconfig",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := env.NewNode(t, "node-a")
			c := harness.NewContainer(t)
			const att = "bad-0-net0"
			plugins := []map[string]any{cniStanza(att, "10.20.11.5/24"), bgpStanza(att)}
			if tc.plugins != nil {
				plugins = tc.plugins(att)
			}
			writeNetwork(t, node, att, plugins...)
			if tc.node != nil {
				tc.node(t, node)
			}
			cni := harness.LibCNI{Node: node, Network: att}
			_, err := cni.Add(context.Background(), harness.RuntimeConf(c, ifName))
			e := cniCode(t, err)
			if e.Code != tc.code || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("got code %d %q, want code %d mentioning %q", e.Code, e.Msg, tc.code, tc.msg)
			}
			t.Logf("code %d: %s", e.Code, e.Msg)
			if got := advertisementsOf(t, env, vpc, att); len(got) != 0 {
				t.Fatalf("a rejected ADD must write nothing, found %d advertisements", len(got))
			}
			// The runtime's DEL after the failed ADD cleans up galactic-cni's side.
			if err := cni.Del(context.Background(), harness.RuntimeConf(c, ifName)); err != nil {
				t.Fatalf("DEL after a failed ADD: %v", err)
			}
			if hostInterfaceExists(node, att) {
				t.Fatal("DEL should remove the tap galactic-cni created")
			}
		})
	}
}

func writeSettings(t *testing.T, n *harness.Node, s settings.Node) {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.ConfigPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStatusReportsAnUnreachableAPIServer(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	const att = "status-0-net0"
	writeChain(t, node, att, "10.20.12.5/24")
	cni := harness.LibCNI{Node: node, Network: att}
	if err := cni.Status(context.Background()); err != nil {
		t.Fatalf("STATUS with the API server reachable: %v", err)
	}
	if err := node.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	defer node.SetAPIReachable(true)
	e := cniCode(t, cni.Status(context.Background()))
	if e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "API server") {
		t.Fatalf("got code %d %q, want %d naming the API server", e.Code, e.Msg, types.ErrPluginNotAvailable)
	}
}
