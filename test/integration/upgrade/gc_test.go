package upgrade

import (
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/test/harness"
)

func TestGalacticGCRenewsTheLeaseOfALiveLocalHolder(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "renew", 30, 60)
	node := env.NewNode(t, "node-a")
	c := harness.NewContainer(t)
	node.AddIn(t, a, c)
	node.HoldTap(t, a.HostIf())
	before := env.Lease(t, a.LeaseName())

	out := node.MustGC(t)
	after := env.Lease(t, a.LeaseName())
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
	a := newAttachment(t, env, "dead", 30, 120)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	// waitSeconds 0: node-b's ADD makes one attempt, which only a free
	// lease lets through (an expiry would take 120s).
	onB := a
	onB.Handoff = &harness.Handoff{WaitSeconds: 0, LeaseSeconds: 120}
	c1 := harness.NewContainer(t)
	nodeA.AddIn(t, a, c1)
	before := checkCurrentHolder(t, env, a, nodeA, c1)

	// The container dies without a DEL; node-a's GC notices.
	c1.Delete()
	nodeA.MustGC(t)
	if l := env.Lease(t, a.LeaseName()); harness.LeaseHolder(l) != "" || harness.LeaseToken(l) != before {
		t.Fatalf("lease after the GC pass: holder %q token %d, want free with token %d", harness.LeaseHolder(l), harness.LeaseToken(l), before)
	}

	c2 := harness.NewContainer(t)
	nodeB.AddIn(t, onB, c2)
	if after := checkCurrentHolder(t, env, a, nodeB, c2); after != before+1 {
		t.Errorf("token %d after node-b's ADD, want %d", after, before+1)
	}

	// node-a's next pass still finds the dead record (its tap is reclaimed
	// only now) and must leave node-b's lease alone.
	held := env.Lease(t, a.LeaseName())
	out := nodeA.MustGC(t)
	if l := env.Lease(t, a.LeaseName()); l.ResourceVersion != held.ResourceVersion {
		t.Errorf("node-a's second pass wrote node-b's lease: holder %q token %d", harness.LeaseHolder(l), harness.LeaseToken(l))
	}
	if !strings.Contains(out, `"leasesReleased":0`) || strings.Contains(out, "released lease of dead holder") {
		t.Errorf("node-a's second pass reports releasing a lease it no longer had:\n%s", out)
	}
}
