package upgrade

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
	// Wait and lease both long: this handoff can only come from A's release.
	a := newAttachment(t, env, "move", 120, 120)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	c1 := harness.NewContainer(t)
	nodeA.AddIn(t, a, c1)
	stopVMM := nodeA.HoldTap(t, a.HostIf())
	before := checkCurrentHolder(t, env, a, nodeA, c1)

	lw := watchLease(t, env, a, nodeA, nodeB)
	taps := sampleTaps(t, a, nodeA, nodeB)
	c2 := harness.NewContainer(t)
	added := nodeB.AddInBackground(t, a, c2)
	harness.Eventually(t, hangGuard, "node-b's ADD to find the lease held", func() error {
		if got := nodeB.WaitingFor(a.LeaseName()); got != nodeA.HolderOf(c1) && len(added) == 0 {
			return fmt.Errorf("waiting for %q", got)
		}
		return nil
	})
	select {
	case err := <-added:
		t.Fatalf("node-b's ADD returned while node-a held the lease: %v", err)
	default:
	}
	if _, ok := nodeB.InspectTap(t, a.HostIf()); ok {
		t.Fatal("node-b created its tap while node-a held the lease")
	}
	if h := harness.LeaseHolder(env.Lease(t, a.LeaseName())); h != nodeA.HolderOf(c1) {
		t.Fatalf("lease holder %q while node-b waits, want node-a's %q", h, nodeA.HolderOf(c1))
	}

	stopVMM()
	nodeA.Del(t, a, c1)
	select {
	case err := <-added:
		if err != nil {
			t.Fatalf("node-b's ADD after node-a released the lease: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("node-b's ADD did not complete after node-a released the lease")
	}
	nodeB.HoldTap(t, a.HostIf())

	after := checkCurrentHolder(t, env, a, nodeB, c2)
	if after != before+1 {
		t.Errorf("token %d after the move, want %d", after, before+1)
	}
	taps.check(t)
	vs := lw.stop(t, env, a)
	if want := []string{nodeA.HolderOf(c1), "", nodeB.HolderOf(c2)}; !slices.Equal(holders(vs), want) {
		t.Errorf("lease holders %q, want %q", holders(vs), want)
	}
	checkNothingOn(t, a, nodeA)
	if st, ok := nodeB.InspectTap(t, a.HostIf()); !ok || !st.Held() {
		t.Errorf("node-b's tap: present %v, held %v", ok, st.Held())
	}
}

func TestAnAddThatCannotGetTheLeaseWithinWaitSecondsFailsWithTryAgainLaterNamingTheHolderAndCreatesNothing(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "busy", 30, 60)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	onB := a
	onB.Handoff = &harness.Handoff{WaitSeconds: 1, LeaseSeconds: 60}
	nodeB.Install(t, onB)
	c1 := harness.NewContainer(t)
	nodeA.AddIn(t, a, c1)
	nodeA.HoldTap(t, a.HostIf())
	before := env.Lease(t, a.LeaseName())
	kernelBefore := nodeB.Snapshot(t)

	c2 := harness.NewContainer(t)
	_, err := harness.LibCNI{Node: nodeB, Network: a.Network()}.Add(context.Background(), harness.RuntimeConf(c2, ifName))
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD while node-a holds the lease: %v; want code %d (try again later)", err, types.ErrTryAgainLater)
	}
	if !strings.Contains(terr.Msg, nodeA.HolderOf(c1)) {
		t.Errorf("the error does not name the holder %q: %s", nodeA.HolderOf(c1), terr.Msg)
	}

	checkNothingOn(t, a, nodeB)
	if got := nodeB.Snapshot(t); got != kernelBefore {
		t.Errorf("node-b's links, rules or routes changed:\nbefore:\n%s\nafter:\n%s", kernelBefore, got)
	}
	if l := env.Lease(t, a.LeaseName()); l.ResourceVersion != before.ResourceVersion {
		t.Errorf("node-b wrote the lease: holder %q token %d", harness.LeaseHolder(l), harness.LeaseToken(l))
	}
	// Only node-a's advertisement, untouched.
	checkCurrentHolder(t, env, a, nodeA, c1)
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
	a := newAttachment(t, env, "crash", 60, leaseSeconds)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	c1 := harness.NewContainer(t)
	nodeA.AddIn(t, a, c1)
	stopVMM := nodeA.HoldTap(t, a.HostIf())
	before := checkCurrentHolder(t, env, a, nodeA, c1)

	// node-a crashes: VMM and container gone, no DEL, no GC, and it cannot
	// reach the API server any more.
	stopVMM()
	c1.Delete()
	if err := nodeA.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodeA.SetAPIReachable(true) })

	lw := watchLease(t, env, a)
	c2 := harness.NewContainer(t)
	start := time.Now()
	nodeB.AddIn(t, a, c2)
	waited := time.Since(start)
	// A lower bound on a wait: B may only take over once it has seen the
	// lease unchanged for its duration.
	if waited < leaseSeconds*time.Second {
		t.Errorf("node-b took over after %s, before the lease duration of %ds", waited, leaseSeconds)
	}

	after := checkCurrentHolder(t, env, a, nodeB, c2)
	if after != before+1 {
		t.Errorf("token %d after the takeover, want %d", after, before+1)
	}
	// Nothing else runs that could delete node-a's advertisement.
	if want := names.Advertisement(vpc, a.Name, nodeA.Name); !slices.Contains(bgpDeleted(t, nodeB), want) {
		t.Errorf("node-b's ADD did not delete %s; it deleted %q", want, bgpDeleted(t, nodeB))
	}
	vs := lw.stop(t, env, a)
	if want := []string{nodeA.HolderOf(c1), nodeB.HolderOf(c2)}; !slices.Equal(holders(vs), want) {
		t.Errorf("lease holders %q, want %q", holders(vs), want)
	}
}

func TestADelThatCannotReachTheAPIServerStillDetachesAndTheLeaseExpiresByItself(t *testing.T) {
	const leaseSeconds = 5
	env := harness.Setup(t)
	a := newAttachment(t, env, "unreleased", 60, leaseSeconds)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	c1 := harness.NewContainer(t)
	nodeA.AddIn(t, a, c1)
	before := checkCurrentHolder(t, env, a, nodeA, c1)

	if err := nodeA.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodeA.SetAPIReachable(true) })
	nodeA.Del(t, a, c1)
	checkNothingOn(t, a, nodeA)
	if l := env.Lease(t, a.LeaseName()); harness.LeaseHolder(l) != nodeA.HolderOf(c1) {
		t.Fatalf("lease holder %q after a DEL that could not reach the API server, want still %q", harness.LeaseHolder(l), nodeA.HolderOf(c1))
	}

	c2 := harness.NewContainer(t)
	start := time.Now()
	nodeB.AddIn(t, a, c2)
	if waited := time.Since(start); waited < leaseSeconds*time.Second {
		t.Errorf("node-b took over after %s, before the lease duration of %ds", waited, leaseSeconds)
	}
	if after := checkCurrentHolder(t, env, a, nodeB, c2); after != before+1 {
		t.Errorf("token %d after the takeover, want %d", after, before+1)
	}
}

func TestTwentyUpgradesAlternatingBetweenTwoNodesRaiseTheTokenByOneEachAndLeaveNothingBehind(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "twenty", 120, 120)
	nodes := [2]*harness.Node{env.NewNode(t, "node-a"), env.NewNode(t, "node-b")}
	cur := 0
	c := harness.NewContainer(t)
	nodes[cur].AddIn(t, a, c)
	stopVMM := nodes[cur].HoldTap(t, a.HostIf())
	tok := checkCurrentHolder(t, env, a, nodes[cur], c)
	prefixes := env.Advertisements(t, vpc, a.Name)[nodes[cur].Name].Spec.Prefixes
	addrs := tapAddresses(t, a, nodes[cur])
	if len(prefixes) != len(addresses) || len(addrs) == 0 {
		t.Fatalf("advertised prefixes %v, tap addresses %v", prefixes, addrs)
	}

	lw := watchLease(t, env, a, nodes[0], nodes[1])
	taps := sampleTaps(t, a, nodes[0], nodes[1])
	wantHolders := []string{nodes[cur].HolderOf(c)}
	for i := 1; i <= 20; i++ {
		from, to := nodes[cur], nodes[1-cur]
		stopVMM()
		from.Del(t, a, c)
		c.Delete()
		c = harness.NewContainer(t)
		to.AddIn(t, a, c)
		stopVMM = to.HoldTap(t, a.HostIf())
		wantHolders = append(wantHolders, "", to.HolderOf(c))

		got := checkCurrentHolder(t, env, a, to, c)
		if got != tok+1 {
			t.Fatalf("upgrade %d: token %d, want %d", i, got, tok+1)
		}
		tok = got
		if p := env.Advertisements(t, vpc, a.Name)[to.Name].Spec.Prefixes; !slices.Equal(p, prefixes) {
			t.Fatalf("upgrade %d: advertised prefixes %v, want %v", i, p, prefixes)
		}
		if ad := tapAddresses(t, a, to); !slices.Equal(ad, addrs) {
			t.Fatalf("upgrade %d: tap addresses %v, want %v", i, ad, addrs)
		}
		checkNothingOn(t, a, from)
		cur = 1 - cur
	}
	stopVMM()
	nodes[cur].Del(t, a, c)
	wantHolders = append(wantHolders, "")

	taps.check(t)
	vs := lw.stop(t, env, a)
	checkNoDirectHandover(t, vs)
	if !slices.Equal(holders(vs), wantHolders) {
		t.Errorf("lease holders %q, want %q", holders(vs), wantHolders)
	}
	if advs := env.Advertisements(t, vpc, a.Name); len(advs) != 0 {
		t.Errorf("advertisements left: %v", nodesOf(advs))
	}
	for _, n := range nodes {
		checkNothingOn(t, a, n)
	}
	if l := env.Lease(t, a.LeaseName()); harness.LeaseHolder(l) != "" || harness.LeaseToken(l) != tok {
		t.Errorf("lease after the last DEL: holder %q token %d, want free with token %d", harness.LeaseHolder(l), harness.LeaseToken(l), tok)
	}
}
