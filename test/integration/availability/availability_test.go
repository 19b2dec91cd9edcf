package availability

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAfterADDTheHolderIsUnavailableUntilItReportsAndRenewalsKeepItsReport(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "boot", 10, 60)
	node := env.NewNode(t, "node-a")
	c1 := harness.NewContainer(t)
	node.AddIn(t, a, c1)
	h := node.HolderOf(c1)

	l := checkAvailability(t, env, a, h, 1, metav1.ConditionFalse, handoff.ReasonAcquired)
	checkReset(t, l, 1, handoff.ReasonAcquired)
	if harness.LeaseHolder(l) != h || harness.LeaseToken(l) != 1 {
		t.Fatalf("lease held by %q with token %d, want %s with token 1", harness.LeaseHolder(l), harness.LeaseToken(l), h)
	}

	mustReport(t, a, node, "available", c1, exitOK)
	l = checkAvailability(t, env, a, h, 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	// The same report again writes nothing.
	mustReport(t, a, node, "available", c1, exitOK)
	if again := env.Lease(t, a.LeaseName()); again.ResourceVersion != l.ResourceVersion {
		t.Errorf("a repeated report wrote the lease: resourceVersion %s, then %s", l.ResourceVersion, again.ResourceVersion)
	}

	// galactic-gc renews the live holder's lease and keeps its report.
	node.MustGC(t)
	renewed := checkAvailability(t, env, a, h, 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	if renewed.ResourceVersion == l.ResourceVersion || !renewed.Spec.RenewTime.After(l.Spec.RenewTime.Time) {
		t.Errorf("galactic-gc did not renew the lease (resourceVersion %s, renewTime %v)", renewed.ResourceVersion, renewed.Spec.RenewTime)
	}

	mustReport(t, a, node, "unavailable", c1, exitOK, "--reason", "ShuttingDown")
	checkAvailability(t, env, a, h, 1, metav1.ConditionFalse, "ShuttingDown")

	// A reason a condition cannot carry is refused before anything is written.
	before := env.Lease(t, a.LeaseName())
	if r := report(t, a, node, "available", c1, nil, "--reason", "not ready"); r.code != 2 {
		t.Errorf("an invalid reason: exit %d, want 2 (%s)", r.code, r.stderr)
	}
	if env.Lease(t, a.LeaseName()).ResourceVersion != before.ResourceVersion {
		t.Error("an invalid report wrote the lease")
	}

	node.Del(t, a, c1)
	l = checkAvailability(t, env, a, h, 1, metav1.ConditionFalse, handoff.ReasonReleased)
	checkReset(t, l, 1, handoff.ReasonReleased)
	r := mustReport(t, a, node, "available", c1, exitNoRecord)
	if !strings.Contains(r.stderr, "no record") {
		t.Errorf("after DEL: %q should say there is no record", r.stderr)
	}
	if env.Lease(t, a.LeaseName()).ResourceVersion != l.ResourceVersion {
		t.Error("a report after DEL wrote the lease")
	}
}

func TestAnUpgradedSuccessorStartsUnavailableAndThePredecessorCannotReportForIt(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	a := newAttachment(t, env, "upgrade", 60, 60)
	node := env.NewNode(t, "node-a")
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	node.AddIn(t, a, c1)
	h1, h2 := node.HolderOf(c1), node.HolderOf(c2)
	mustReport(t, a, node, "available", c1, exitOK)
	checkAvailability(t, env, a, h1, 1, metav1.ConditionTrue, handoff.ReasonAvailable)

	// The replacement's ADD waits for the lease; the old one's DEL frees it.
	done := node.AddInBackground(t, a, c2)
	harness.Eventually(t, hangGuard, "the successor's ADD waiting for the lease", func() error {
		if got := node.WaitingFor(a.LeaseName()); got != h1 {
			return fmt.Errorf("waiting for %q", got)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("the successor's ADD finished while the predecessor held the lease: %v", err)
	default:
	}
	checkAvailability(t, env, a, h1, 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	node.Del(t, a, c1)
	waitDone(t, "the successor's ADD", done)

	l := checkAvailability(t, env, a, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)
	checkReset(t, l, 2, handoff.ReasonAcquired)
	checkAvailability(t, env, a, h1, 1, metav1.ConditionFalse, handoff.ReasonNotCurrentHolder)

	// The predecessor's late report: its record went with its DEL, and its
	// old grant is refused by the lease itself. Neither writes anything.
	r := mustReport(t, a, node, "available", c1, exitNoRecord)
	if !strings.Contains(r.stderr, "no record") {
		t.Errorf("late report: %q", r.stderr)
	}
	lock, err := handoff.New(env.API.Leases(harness.Namespace), harness.Namespace, a.LeaseName(), handoff.Options{LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.SetAvailable(ctx, h1, 1, true, ""); !errors.Is(err, handoff.ErrLost) {
		t.Fatalf("the predecessor's SetAvailable with its old token: want ErrLost, got %v", err)
	}
	if got := env.Lease(t, a.LeaseName()); got.ResourceVersion != l.ResourceVersion {
		t.Fatalf("refused reports changed the lease: resourceVersion %s, then %s", l.ResourceVersion, got.ResourceVersion)
	}
	checkAvailability(t, env, a, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)

	mustReport(t, a, node, "available", c2, exitOK)
	checkAvailability(t, env, a, h2, 2, metav1.ConditionTrue, handoff.ReasonAvailable)
	node.Del(t, a, c2)
}

func TestACrashTakeoverStartsUnavailableWhateverTheLeaseSaidBefore(t *testing.T) {
	env := harness.Setup(t)
	// The shortest lease galactic-cni allows; no GC renews it here, as on a
	// node that crashed.
	a := newAttachment(t, env, "takeover", 60, 5)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	nodeA.AddIn(t, a, c1)
	h1, h2 := nodeA.HolderOf(c1), nodeB.HolderOf(c2)
	mustReport(t, a, nodeA, "available", c1, exitOK, "--reason", "Serving")
	checkAvailability(t, env, a, h1, 1, metav1.ConditionTrue, "Serving")

	start := time.Now()
	nodeB.AddIn(t, a, c2)
	if took := time.Since(start); took < 5*time.Second {
		t.Errorf("taken over after %v, before the lease expired", took)
	}
	l := checkAvailability(t, env, a, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)
	checkReset(t, l, 2, handoff.ReasonAcquired)
	if got := l.Labels[names.LabelHolderNode]; got != "node-b" {
		t.Errorf("holder-node label %q after the takeover, want node-b", got)
	}

	// node-a still has its record: its late reports name the old token.
	for _, verb := range []string{"available", "unavailable"} {
		r := mustReport(t, a, nodeA, verb, c1, exitStale)
		if !strings.Contains(r.stderr, "stale token") || !strings.Contains(r.stderr, h2) {
			t.Errorf("late %s: %q should say the token is stale and name the new holder", verb, r.stderr)
		}
	}
	if got := env.Lease(t, a.LeaseName()); got.ResourceVersion != l.ResourceVersion {
		t.Fatalf("refused reports changed the lease: resourceVersion %s, then %s", l.ResourceVersion, got.ResourceVersion)
	}
	checkAvailability(t, env, a, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)

	mustReport(t, a, nodeB, "available", c2, exitOK)
	l = checkAvailability(t, env, a, h2, 2, metav1.ConditionTrue, handoff.ReasonAvailable)
	// The old holder's DEL leaves the new holder's lease alone.
	nodeA.Del(t, a, c1)
	if got := env.Lease(t, a.LeaseName()); got.ResourceVersion != l.ResourceVersion {
		t.Errorf("the old holder's DEL wrote the lease")
	}
	nodeB.Del(t, a, c2)
}

func TestTheHolderNodeLabelFollowsTheHolderAcrossAMoveAndGoesWithTheRelease(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "move", 60, 60)
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	check := func(when string, onA, onB bool) {
		t.Helper()
		if got := slices.Contains(heldOn(t, env, "node-a"), a.LeaseName()); got != onA {
			t.Errorf("%s: selected as held on node-a: %v, want %v", when, got, onA)
		}
		if got := slices.Contains(heldOn(t, env, "node-b"), a.LeaseName()); got != onB {
			t.Errorf("%s: selected as held on node-b: %v, want %v", when, got, onB)
		}
	}

	nodeA.AddIn(t, a, c1)
	check("held by node-a", true, false)
	mustReport(t, a, nodeA, "available", c1, exitOK)
	check("reported on node-a", true, false)

	done := nodeB.AddInBackground(t, a, c2)
	harness.Eventually(t, hangGuard, "the ADD on node-b waiting for the lease", func() error {
		if got := nodeB.WaitingFor(a.LeaseName()); got != nodeA.HolderOf(c1) {
			return fmt.Errorf("waiting for %q", got)
		}
		return nil
	})
	mustReport(t, a, nodeA, "unavailable", c1, exitOK, "--reason", "Moving")
	nodeA.Del(t, a, c1)
	waitDone(t, "ADD on node-b", done)
	check("moved to node-b", false, true)
	checkAvailability(t, env, a, nodeB.HolderOf(c2), 2, metav1.ConditionFalse, handoff.ReasonAcquired)
	mustReport(t, a, nodeB, "available", c2, exitOK)
	check("reported on node-b", false, true)

	nodeB.Del(t, a, c2)
	check("released", false, false)
	if l := env.Lease(t, a.LeaseName()); len(l.Labels) != 0 {
		t.Errorf("a released lease keeps labels %v", l.Labels)
	}
}
