package upgrade

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAMoveWaitsForTheOldNodesReleaseAndTheLeaseIsFreeBetweenTheTwoHolders(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "move")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	// Wait and lease both long: this handoff can only come from A's release.
	a.install(t, nodeA, 120, 120)
	a.install(t, nodeB, 120, 120)
	c1 := harness.NewContainer(t)
	a.add(t, nodeA, c1)
	stopVMM := nodeA.HoldTap(t, a.tap())
	before := a.checkCurrentHolder(t, nodeA, c1)

	lw := a.watchLease(t, nodeA, nodeB)
	taps := a.sampleTaps(t, nodeA, nodeB)
	c2 := harness.NewContainer(t)
	added := make(chan error, 1)
	go func() {
		_, err := nodeB.CNITool("add", a.network(), c2, ifName)
		added <- err
	}()

	// B's ADD keeps its observation of a lease held by another in B's
	// state dir: once it is there, the ADD has found the lease held.
	waitUntil(t, "node-b's ADD to find the lease held", func() bool {
		seen, _ := filepath.Glob(filepath.Join(nodeB.Settings.StateDir, "handoff", "*"))
		return len(seen) > 0 || len(added) > 0
	})
	select {
	case err := <-added:
		t.Fatalf("node-b's ADD returned while node-a held the lease: %v", err)
	default:
	}
	if _, ok := a.inspectTap(t, nodeB); ok {
		t.Fatal("node-b created its tap while node-a held the lease")
	}
	if h := harness.LeaseHolder(a.getLease(t)); h != holderOf(nodeA, c1) {
		t.Fatalf("lease holder %q while node-b waits, want node-a's %q", h, holderOf(nodeA, c1))
	}

	stopVMM()
	a.del(t, nodeA, c1)
	select {
	case err := <-added:
		if err != nil {
			t.Fatalf("node-b's ADD after node-a released the lease: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("node-b's ADD did not complete after node-a released the lease")
	}
	nodeB.HoldTap(t, a.tap())

	after := a.checkCurrentHolder(t, nodeB, c2)
	if after != before+1 {
		t.Errorf("token %d after the move, want %d", after, before+1)
	}
	taps.check(t)
	vs := lw.stop(t, a)
	if want := []string{holderOf(nodeA, c1), "", holderOf(nodeB, c2)}; !slices.Equal(holders(vs), want) {
		t.Errorf("lease holders %q, want %q", holders(vs), want)
	}
	a.checkNothingOn(t, nodeA)
	if st, ok := a.inspectTap(t, nodeB); !ok || !st.Held() {
		t.Errorf("node-b's tap: present %v, held %v", ok, st.Held())
	}
}

// snapshot is a node's links, rules and routes as `ip` prints them.
func snapshot(t *testing.T, node *harness.Node) string {
	t.Helper()
	var out strings.Builder
	for _, args := range [][]string{{"-o", "link"}, {"rule"}, {"-6", "rule"}, {"route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}} {
		s, err := node.Run("ip", args...)
		if err != nil {
			t.Fatalf("ip %v on %s: %v: %s", args, node.Name, err, s)
		}
		out.WriteString(s)
	}
	return out.String()
}

func TestAnAddThatCannotGetTheLeaseWithinWaitSecondsFailsWithTryAgainLaterNamingTheHolderAndCreatesNothing(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "busy")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	a.install(t, nodeA, 30, 60)
	a.install(t, nodeB, 1, 60)
	c1 := harness.NewContainer(t)
	a.add(t, nodeA, c1)
	nodeA.HoldTap(t, a.tap())
	before := a.getLease(t)
	kernelBefore := snapshot(t, nodeB)

	c2 := harness.NewContainer(t)
	_, err := harness.LibCNI{Node: nodeB, Network: a.network()}.Add(context.Background(), harness.RuntimeConf(c2, ifName))
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD while node-a holds the lease: %v; want code %d (try again later)", err, types.ErrTryAgainLater)
	}
	if !strings.Contains(terr.Msg, holderOf(nodeA, c1)) {
		t.Errorf("the error does not name the holder %q: %s", holderOf(nodeA, c1), terr.Msg)
	}

	a.checkNothingOn(t, nodeB)
	if got := snapshot(t, nodeB); got != kernelBefore {
		t.Errorf("node-b's links, rules or routes changed:\nbefore:\n%s\nafter:\n%s", kernelBefore, got)
	}
	if l := a.getLease(t); l.ResourceVersion != before.ResourceVersion {
		t.Errorf("node-b wrote the lease: holder %q token %d", harness.LeaseHolder(l), harness.LeaseToken(l))
	}
	// Only node-a's advertisement, untouched.
	a.checkCurrentHolder(t, nodeA, c1)
}

// bgpDeleted returns the advertisements galactic-bgp's ADDs on node deleted
// as other nodes' leftovers, from the node log.
func bgpDeleted(t *testing.T, node *harness.Node) []string {
	t.Helper()
	f, err := os.Open(node.Settings.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var deleted []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Plugin        string   `json:"plugin"`
			Verb          string   `json:"verb"`
			DeletedOthers []string `json:"deletedOthers"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Plugin == "galactic-bgp" && line.Verb == "ADD" {
			deleted = append(deleted, line.DeletedOthers...)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return deleted
}

func TestACrashedHolderIsTakenOverOnlyAfterTheLeaseDurationAndTheTakingAddDeletesItsAdvertisement(t *testing.T) {
	const leaseSeconds = 5 // the shortest galactic-cni accepts
	env := harness.Setup(t)
	a := newAttachment(t, env, "crash")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	a.install(t, nodeA, 60, leaseSeconds)
	a.install(t, nodeB, 60, leaseSeconds)
	c1 := harness.NewContainer(t)
	a.add(t, nodeA, c1)
	stopVMM := nodeA.HoldTap(t, a.tap())
	before := a.checkCurrentHolder(t, nodeA, c1)

	// node-a crashes: VMM and container gone, no DEL, no GC, and it cannot
	// reach the API server any more.
	stopVMM()
	c1.Delete()
	if err := nodeA.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodeA.SetAPIReachable(true) })

	lw := a.watchLease(t)
	c2 := harness.NewContainer(t)
	start := time.Now()
	a.add(t, nodeB, c2)
	waited := time.Since(start)
	// A lower bound on a wait: B may only take over once it has seen the
	// lease unchanged for its duration.
	if waited < leaseSeconds*time.Second {
		t.Errorf("node-b took over after %s, before the lease duration of %ds", waited, leaseSeconds)
	}

	after := a.checkCurrentHolder(t, nodeB, c2)
	if after != before+1 {
		t.Errorf("token %d after the takeover, want %d", after, before+1)
	}
	// Nothing else runs that could delete node-a's advertisement.
	if want := names.Advertisement(vpc, a.name, nodeA.Name); !slices.Contains(bgpDeleted(t, nodeB), want) {
		t.Errorf("node-b's ADD did not delete %s; it deleted %q", want, bgpDeleted(t, nodeB))
	}
	vs := lw.stop(t, a)
	if want := []string{holderOf(nodeA, c1), holderOf(nodeB, c2)}; !slices.Equal(holders(vs), want) {
		t.Errorf("lease holders %q, want %q", holders(vs), want)
	}
}

func TestADelThatCannotReachTheAPIServerStillDetachesAndTheLeaseExpiresByItself(t *testing.T) {
	const leaseSeconds = 5
	env := harness.Setup(t)
	a := newAttachment(t, env, "unreleased")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	a.install(t, nodeA, 60, leaseSeconds)
	a.install(t, nodeB, 60, leaseSeconds)
	c1 := harness.NewContainer(t)
	a.add(t, nodeA, c1)
	before := a.checkCurrentHolder(t, nodeA, c1)

	if err := nodeA.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodeA.SetAPIReachable(true) })
	a.del(t, nodeA, c1)
	a.checkNothingOn(t, nodeA)
	if l := a.getLease(t); harness.LeaseHolder(l) != holderOf(nodeA, c1) {
		t.Fatalf("lease holder %q after a DEL that could not reach the API server, want still %q", harness.LeaseHolder(l), holderOf(nodeA, c1))
	}

	c2 := harness.NewContainer(t)
	start := time.Now()
	a.add(t, nodeB, c2)
	if waited := time.Since(start); waited < leaseSeconds*time.Second {
		t.Errorf("node-b took over after %s, before the lease duration of %ds", waited, leaseSeconds)
	}
	if after := a.checkCurrentHolder(t, nodeB, c2); after != before+1 {
		t.Errorf("token %d after the takeover, want %d", after, before+1)
	}
}

func TestTwentyUpgradesAlternatingBetweenTwoNodesRaiseTheTokenByOneEachAndLeaveNothingBehind(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "twenty")
	nodes := [2]*harness.Node{env.NewNode(t, "node-a"), env.NewNode(t, "node-b")}
	for _, n := range nodes {
		a.install(t, n, 120, 120)
	}
	cur := 0
	c := harness.NewContainer(t)
	a.add(t, nodes[cur], c)
	stopVMM := nodes[cur].HoldTap(t, a.tap())
	tok := a.checkCurrentHolder(t, nodes[cur], c)
	prefixes := a.advertisements(t)[nodes[cur].Name].Spec.Prefixes
	addrs := a.tapAddresses(t, nodes[cur])
	if len(prefixes) != len(addresses) || len(addrs) == 0 {
		t.Fatalf("advertised prefixes %v, tap addresses %v", prefixes, addrs)
	}

	lw := a.watchLease(t, nodes[0], nodes[1])
	taps := a.sampleTaps(t, nodes[0], nodes[1])
	wantHolders := []string{holderOf(nodes[cur], c)}
	for i := 1; i <= 20; i++ {
		from, to := nodes[cur], nodes[1-cur]
		stopVMM()
		a.del(t, from, c)
		c.Delete()
		c = harness.NewContainer(t)
		a.add(t, to, c)
		stopVMM = to.HoldTap(t, a.tap())
		wantHolders = append(wantHolders, "", holderOf(to, c))

		got := a.checkCurrentHolder(t, to, c)
		if got != tok+1 {
			t.Fatalf("upgrade %d: token %d, want %d", i, got, tok+1)
		}
		tok = got
		if p := a.advertisements(t)[to.Name].Spec.Prefixes; !slices.Equal(p, prefixes) {
			t.Fatalf("upgrade %d: advertised prefixes %v, want %v", i, p, prefixes)
		}
		if ad := a.tapAddresses(t, to); !slices.Equal(ad, addrs) {
			t.Fatalf("upgrade %d: tap addresses %v, want %v", i, ad, addrs)
		}
		a.checkNothingOn(t, from)
		cur = 1 - cur
	}
	stopVMM()
	a.del(t, nodes[cur], c)
	wantHolders = append(wantHolders, "")

	taps.check(t)
	vs := lw.stop(t, a)
	checkNoDirectHandover(t, vs)
	if !slices.Equal(holders(vs), wantHolders) {
		t.Errorf("lease holders %q, want %q", holders(vs), wantHolders)
	}
	if advs := a.advertisements(t); len(advs) != 0 {
		t.Errorf("advertisements left: %v", nodesOf(advs))
	}
	for _, n := range nodes {
		a.checkNothingOn(t, n)
	}
	if l := a.getLease(t); harness.LeaseHolder(l) != "" || harness.LeaseToken(l) != tok {
		t.Errorf("lease after the last DEL: holder %q token %d, want free with token %d", harness.LeaseHolder(l), harness.LeaseToken(l), tok)
	}
}
