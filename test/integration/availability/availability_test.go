package availability

import (
	"context"
	"errors"
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
	a := newAttachment(t, env, "boot")
	node := env.NewNode(t, "node-a")
	a.install(t, node, 10, 60)
	c1 := harness.NewContainer(t)
	a.add(t, node, c1)
	h := holderOf(node, c1)

	l := a.checkAvailability(t, h, 1, metav1.ConditionFalse, handoff.ReasonAcquired)
	checkReset(t, l, 1, handoff.ReasonAcquired)
	if harness.LeaseHolder(l) != h || harness.LeaseToken(l) != 1 {
		t.Fatalf("lease held by %q with token %d, want %s with token 1", harness.LeaseHolder(l), harness.LeaseToken(l), h)
	}

	a.mustReport(t, node, "available", c1, exitOK)
	l = a.checkAvailability(t, h, 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	// The same report again writes nothing.
	a.mustReport(t, node, "available", c1, exitOK)
	if again := a.lease(t); again.ResourceVersion != l.ResourceVersion {
		t.Errorf("a repeated report wrote the lease: resourceVersion %s, then %s", l.ResourceVersion, again.ResourceVersion)
	}

	// galactic-gc renews the live holder's lease and keeps its report.
	node.MustGC(t)
	renewed := a.checkAvailability(t, h, 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	if renewed.ResourceVersion == l.ResourceVersion || !renewed.Spec.RenewTime.After(l.Spec.RenewTime.Time) {
		t.Errorf("galactic-gc did not renew the lease (resourceVersion %s, renewTime %v)", renewed.ResourceVersion, renewed.Spec.RenewTime)
	}

	a.mustReport(t, node, "unavailable", c1, exitOK, "--reason", "ShuttingDown")
	a.checkAvailability(t, h, 1, metav1.ConditionFalse, "ShuttingDown")

	// A reason a condition cannot carry is refused before anything is written.
	before := a.lease(t)
	if r := a.report(t, node, "available", c1, nil, "--reason", "not ready"); r.code != 2 {
		t.Errorf("an invalid reason: exit %d, want 2 (%s)", r.code, r.stderr)
	}
	if a.lease(t).ResourceVersion != before.ResourceVersion {
		t.Error("an invalid report wrote the lease")
	}

	a.del(t, node, c1)
	l = a.checkAvailability(t, h, 1, metav1.ConditionFalse, handoff.ReasonReleased)
	checkReset(t, l, 1, handoff.ReasonReleased)
	r := a.mustReport(t, node, "available", c1, exitNoRecord)
	if !strings.Contains(r.stderr, "no record") {
		t.Errorf("after DEL: %q should say there is no record", r.stderr)
	}
	if a.lease(t).ResourceVersion != l.ResourceVersion {
		t.Error("a report after DEL wrote the lease")
	}
}

func TestAnUpgradedSuccessorStartsUnavailableAndThePredecessorCannotReportForIt(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	a := newAttachment(t, env, "upgrade")
	node := env.NewNode(t, "node-a")
	a.install(t, node, 60, 60)
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	a.add(t, node, c1)
	h1, h2 := holderOf(node, c1), holderOf(node, c2)
	a.mustReport(t, node, "available", c1, exitOK)
	a.checkAvailability(t, h1, 1, metav1.ConditionTrue, handoff.ReasonAvailable)

	// The replacement's ADD waits for the lease; the old one's DEL frees it.
	done := a.addInBackground(node, c2)
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the successor's ADD finished while the predecessor held the lease: %v", err)
	default:
	}
	a.checkAvailability(t, h1, 1, metav1.ConditionTrue, handoff.ReasonAvailable)
	a.del(t, node, c1)
	waitDone(t, "the successor's ADD", done)

	l := a.checkAvailability(t, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)
	checkReset(t, l, 2, handoff.ReasonAcquired)
	a.checkAvailability(t, h1, 1, metav1.ConditionFalse, handoff.ReasonNotCurrentHolder)

	// The predecessor's late report: its record went with its DEL, and its
	// old grant is refused by the lease itself. Neither writes anything.
	r := a.mustReport(t, node, "available", c1, exitNoRecord)
	if !strings.Contains(r.stderr, "no record") {
		t.Errorf("late report: %q", r.stderr)
	}
	lock, err := handoff.New(env.API.Leases(harness.Namespace), harness.Namespace, a.leaseName(), handoff.Options{LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.SetAvailable(ctx, h1, 1, true, ""); !errors.Is(err, handoff.ErrLost) {
		t.Fatalf("the predecessor's SetAvailable with its old token: want ErrLost, got %v", err)
	}
	if got := a.lease(t); got.ResourceVersion != l.ResourceVersion {
		t.Fatalf("refused reports changed the lease: resourceVersion %s, then %s", l.ResourceVersion, got.ResourceVersion)
	}
	a.checkAvailability(t, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)

	a.mustReport(t, node, "available", c2, exitOK)
	a.checkAvailability(t, h2, 2, metav1.ConditionTrue, handoff.ReasonAvailable)
	a.del(t, node, c2)
}

func TestACrashTakeoverStartsUnavailableWhateverTheLeaseSaidBefore(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "takeover")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	// The shortest lease galactic-cni allows; no GC renews it here, as on a
	// node that crashed.
	a.install(t, nodeA, 60, 5)
	a.install(t, nodeB, 60, 5)
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	a.add(t, nodeA, c1)
	h1, h2 := holderOf(nodeA, c1), holderOf(nodeB, c2)
	a.mustReport(t, nodeA, "available", c1, exitOK, "--reason", "Serving")
	a.checkAvailability(t, h1, 1, metav1.ConditionTrue, "Serving")

	start := time.Now()
	a.add(t, nodeB, c2)
	if took := time.Since(start); took < 5*time.Second {
		t.Errorf("taken over after %v, before the lease expired", took)
	}
	l := a.checkAvailability(t, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)
	checkReset(t, l, 2, handoff.ReasonAcquired)
	if got := l.Labels[names.LabelHolderNode]; got != "node-b" {
		t.Errorf("holder-node label %q after the takeover, want node-b", got)
	}

	// node-a still has its record: its late reports name the old token.
	for _, verb := range []string{"available", "unavailable"} {
		r := a.mustReport(t, nodeA, verb, c1, exitStale)
		if !strings.Contains(r.stderr, "stale token") || !strings.Contains(r.stderr, h2) {
			t.Errorf("late %s: %q should say the token is stale and name the new holder", verb, r.stderr)
		}
	}
	if got := a.lease(t); got.ResourceVersion != l.ResourceVersion {
		t.Fatalf("refused reports changed the lease: resourceVersion %s, then %s", l.ResourceVersion, got.ResourceVersion)
	}
	a.checkAvailability(t, h2, 2, metav1.ConditionFalse, handoff.ReasonAcquired)

	a.mustReport(t, nodeB, "available", c2, exitOK)
	l = a.checkAvailability(t, h2, 2, metav1.ConditionTrue, handoff.ReasonAvailable)
	// The old holder's DEL leaves the new holder's lease alone.
	a.del(t, nodeA, c1)
	if got := a.lease(t); got.ResourceVersion != l.ResourceVersion {
		t.Errorf("the old holder's DEL wrote the lease")
	}
	a.del(t, nodeB, c2)
}

func TestTheHolderNodeLabelFollowsTheHolderAcrossAMoveAndGoesWithTheRelease(t *testing.T) {
	env := harness.Setup(t)
	a := newAttachment(t, env, "move")
	nodeA, nodeB := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	a.install(t, nodeA, 60, 60)
	a.install(t, nodeB, 60, 60)
	c1, c2 := harness.NewContainer(t), harness.NewContainer(t)
	check := func(when string, onA, onB bool) {
		t.Helper()
		if got := slices.Contains(heldOn(t, env, "node-a"), a.leaseName()); got != onA {
			t.Errorf("%s: selected as held on node-a: %v, want %v", when, got, onA)
		}
		if got := slices.Contains(heldOn(t, env, "node-b"), a.leaseName()); got != onB {
			t.Errorf("%s: selected as held on node-b: %v, want %v", when, got, onB)
		}
	}

	a.add(t, nodeA, c1)
	check("held by node-a", true, false)
	a.mustReport(t, nodeA, "available", c1, exitOK)
	check("reported on node-a", true, false)

	done := a.addInBackground(nodeB, c2)
	time.Sleep(500 * time.Millisecond)
	a.mustReport(t, nodeA, "unavailable", c1, exitOK, "--reason", "Moving")
	a.del(t, nodeA, c1)
	waitDone(t, "ADD on node-b", done)
	check("moved to node-b", false, true)
	a.checkAvailability(t, holderOf(nodeB, c2), 2, metav1.ConditionFalse, handoff.ReasonAcquired)
	a.mustReport(t, nodeB, "available", c2, exitOK)
	check("reported on node-b", false, true)

	a.del(t, nodeB, c2)
	check("released", false, false)
	if l := a.lease(t); len(l.Labels) != 0 {
		t.Errorf("a released lease keeps labels %v", l.Labels)
	}
}
