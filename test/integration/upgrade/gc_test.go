package upgrade

import (
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/test/harness"
)

func TestGalacticGCRenewsTheLeaseOfALiveLocalHolder(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "renew")
	node := env.NewNode(t, "node-a")
	a.install(t, node, 30, 60)
	c := harness.NewContainer(t)
	a.add(t, node, c)
	node.HoldTap(t, a.tap())
	before := a.getLease(t)

	out := node.MustGC(t)
	after := a.getLease(t)
	if after.ResourceVersion == before.ResourceVersion || !after.Spec.RenewTime.After(before.Spec.RenewTime.Time) {
		t.Errorf("lease not renewed: resourceVersion %s -> %s, renewTime %v -> %v\n%s",
			before.ResourceVersion, after.ResourceVersion, before.Spec.RenewTime, after.Spec.RenewTime, out)
	}
	if harness.LeaseHolder(after) != harness.LeaseHolder(before) || harness.LeaseToken(after) != harness.LeaseToken(before) {
		t.Errorf("renewal changed the grant: holder %q -> %q, token %d -> %d", harness.LeaseHolder(before), harness.LeaseHolder(after), harness.LeaseToken(before), harness.LeaseToken(after))
	}
	if !strings.Contains(out, `"leasesRenewed":1`) {
		t.Errorf("the pass does not report one renewal:\n%s", out)
	}
}

func TestGalacticGCReleasesTheLeaseOfADeadLocalHolderAndTheNextAddElsewhereGetsItAtOnce(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "dead")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	a.install(t, nodeA, 30, 120)
	// waitSeconds 0: node-b's ADD makes one attempt, which only a free
	// lease lets through (an expiry would take 120s).
	a.install(t, nodeB, 0, 120)
	c1 := harness.NewContainer(t)
	a.add(t, nodeA, c1)
	before := a.checkCurrentHolder(t, nodeA, c1)

	// The container dies without a DEL; node-a's GC notices.
	c1.Delete()
	nodeA.MustGC(t)
	if l := a.getLease(t); harness.LeaseHolder(l) != "" || harness.LeaseToken(l) != before {
		t.Fatalf("lease after the GC pass: holder %q token %d, want free with token %d", harness.LeaseHolder(l), harness.LeaseToken(l), before)
	}

	c2 := harness.NewContainer(t)
	a.add(t, nodeB, c2)
	if after := a.checkCurrentHolder(t, nodeB, c2); after != before+1 {
		t.Errorf("token %d after node-b's ADD, want %d", after, before+1)
	}

	// node-a's next pass still finds the dead record (its tap is reclaimed
	// only now) and must leave node-b's lease alone.
	held := a.getLease(t)
	out := nodeA.MustGC(t)
	if l := a.getLease(t); l.ResourceVersion != held.ResourceVersion {
		t.Errorf("node-a's second pass wrote node-b's lease: holder %q token %d", harness.LeaseHolder(l), harness.LeaseToken(l))
	}
	if !strings.Contains(out, `"leasesReleased":0`) || strings.Contains(out, "released lease of dead holder") {
		t.Errorf("node-a's second pass reports releasing a lease it no longer had:\n%s", out)
	}
}
