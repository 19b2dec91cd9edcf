package soak

import (
	"strings"
	"testing"
	"time"
)

// world is a hand-written sequence of snapshots for one attachment,
// blue/app-1 (announce always), seen from node-c.
type frame struct {
	at      time.Duration
	holder  string // node of the live entry, "" for none
	gen     int64
	via     string
	lease   LeaseView
	entries []EntryView
}

func replay(t *testing.T, frames []frame, steps ...Step) *Checker {
	t.Helper()
	return replayWith(t, SimBounds, frames, steps...)
}

func replayWith(t *testing.T, b Bounds, frames []frame, steps ...Step) *Checker {
	t.Helper()
	start := time.Unix(0, 0)
	c := NewChecker(DefaultTopology(), b, start)
	for _, s := range steps {
		c.Begin(s, start.Add(s.At))
		c.Done(s, start.Add(s.At))
	}
	for i, f := range frames {
		end := f.at
		if i+1 < len(frames) {
			end = frames[i+1].at
		}
		for at := f.at; at <= end; at += sampleEvery {
			s := Snapshot{At: start.Add(at), Leases: map[string]LeaseView{"blue/app-1": f.lease}, Routes: map[RouteKey]string{{Observer: "node-c", Key: "blue/app-1"}: f.via}}
			if f.holder != "" {
				s.Entries = append(s.Entries, EntryView{Key: "blue/app-1", Node: f.holder, ContainerID: "c-" + f.holder, Generation: f.gen, Live: true})
			}
			s.Entries = append(s.Entries, f.entries...)
			c.Observe(s)
		}
	}
	return c
}

func wantViolation(t *testing.T, c *Checker, check string) {
	t.Helper()
	for _, v := range c.Violations {
		if v.Check == check {
			return
		}
	}
	t.Errorf("want a %q violation, got %v", check, c.Violations)
}

func wantNone(t *testing.T, c *Checker) {
	t.Helper()
	for _, v := range c.Violations {
		t.Error(v)
	}
}

func TestARouteFollowingTheHolderWithinConvergencePasses(t *testing.T) {
	wantNone(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 5 * time.Second, holder: "node-b", gen: 2, via: "node-a"},
		{at: 6 * time.Second, holder: "node-b", gen: 2, via: "node-b"},
		{at: 10 * time.Second, holder: "node-b", gen: 2, via: "node-b"},
	}))
}

func TestARouteLaggingAReplacementPastConvergenceFails(t *testing.T) {
	wantViolation(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 5 * time.Second, holder: "node-b", gen: 2, via: "node-a"},
		{at: 10 * time.Second, holder: "node-b", gen: 2, via: "node-a"},
	}), "route at holder")
}

func TestAWithdrawnRouteIsHeldForTheWithdrawalHold(t *testing.T) {
	wantNone(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 5 * time.Second, via: "node-a"},
		{at: 5*time.Second + WithdrawHold, via: ""},
		{at: 60 * time.Second, via: ""},
	}))
	wantViolation(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 5 * time.Second, via: "node-a"},
		{at: 60 * time.Second, via: "node-a"},
	}), "route at holder")
}

func TestARouteToANodeThatNeverHeldTheAttachmentFailsAtOnceEvenDuringAFault(t *testing.T) {
	c := replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 5 * time.Second, holder: "node-a", gen: 1, via: "node-b"},
		{at: 5*time.Second + 200*time.Millisecond, holder: "node-a", gen: 1, via: "node-a"},
	}, Step{Seq: 0, Kind: "reflector-outage", At: time.Second, For: time.Minute})
	wantViolation(t, c, "route at holder")
	if !strings.Contains(c.Violations[0].Detail, "has not held it lately") {
		t.Errorf("got %s", c.Violations[0])
	}
}

// A takeover upgraded in place at once (seed 20261201, step #55): its
// instance held the lease for less than a sample and never showed as an
// entry, but it was announced, and its withdrawal is held at a receiver
// while its successor is not yet available. The lease shows it held the
// attachment.
func TestAHolderSeenOnlyInTheLeaseMayBeRoutedToDuringItsWithdrawalHold(t *testing.T) {
	lease := func(holder string, token int64, available bool) LeaseView {
		return LeaseView{Holder: holder, Token: token, Available: available}
	}
	wantNone(t, replayWith(t, DefaultBounds, []frame{
		{at: 0, holder: "node-b", gen: 7, via: "node-b", lease: lease("node-b/c-node-b", 7, true)},
		{at: 5 * time.Second, via: "node-b", lease: lease("node-a/takeover", 8, false)},
		{at: 5*time.Second + 100*time.Millisecond, via: "node-a", lease: lease("node-a/upgraded", 9, false)},
		{at: 5*time.Second + DefaultBounds.Lag + time.Second, holder: "node-a", gen: 9, via: "node-a", lease: lease("node-a/upgraded", 9, false)},
	}))
}

// The checker's view may trail a receiver's kernel by a sample or an
// informer event, so a next hop with no sign of holding is judged after
// Lag; one that outlasts it fails, whatever fault runs.
func TestARouteToANodeWithNoSignOfHoldingFailsOnceItOutlastsTheLag(t *testing.T) {
	frames := func(d time.Duration) []frame {
		return []frame{
			{at: 0, holder: "node-a", gen: 1, via: "node-a"},
			{at: 5 * time.Second, holder: "node-a", gen: 1, via: "node-b"},
			{at: 5*time.Second + d, holder: "node-a", gen: 1, via: "node-a"},
		}
	}
	fault := Step{Seq: 0, Kind: "reflector-outage", At: time.Second, For: time.Minute}
	wantNone(t, replayWith(t, DefaultBounds, frames(DefaultBounds.Lag/2), fault))
	wantViolation(t, replayWith(t, DefaultBounds, frames(DefaultBounds.Lag+time.Second), fault), "route at holder")
}

func TestStaleRoutesAreAllowedWhileARoutingFaultRuns(t *testing.T) {
	wantNone(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 5 * time.Second, holder: "node-b", gen: 2, via: "node-a"},
		{at: 40 * time.Second, holder: "node-b", gen: 2, via: "node-b"},
	}, Step{Seq: 0, Kind: "reflector-outage", At: time.Second, For: time.Minute}))
}

func TestTwoHoldersUnderOneTokenFail(t *testing.T) {
	wantViolation(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a", lease: LeaseView{Holder: "node-a/c-node-a", Token: 1}},
		{at: time.Second, holder: "node-a", gen: 1, via: "node-a", lease: LeaseView{Holder: "node-b/x", Token: 1}},
	}), "one holder")
}

func TestATokenGoingBackFails(t *testing.T) {
	wantViolation(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 2, via: "node-a", lease: LeaseView{Holder: "node-a/c-node-a", Token: 2}},
		{at: time.Second, holder: "node-a", gen: 2, via: "node-a", lease: LeaseView{Holder: "node-a/c-node-a", Token: 1}},
	}), "one holder")
}

func TestTwoLiveEntriesWithOneGenerationFail(t *testing.T) {
	wantViolation(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 3, via: "node-a",
			entries: []EntryView{{Key: "blue/app-1", Node: "node-b", ContainerID: "other", Generation: 3, Live: true}}},
	}), "unique generation")
}

func TestAMoveThatFlipsAReceiverBackFails(t *testing.T) {
	move := Step{Seq: 0, Kind: "move", Attachment: "blue/app-1", Node: "node-a", To: "node-b", At: time.Second}
	wantViolation(t, replay(t, []frame{
		{at: 0, holder: "node-a", gen: 1, via: "node-a"},
		{at: 2 * time.Second, holder: "node-b", gen: 2, via: "node-b"},
		{at: 3 * time.Second, holder: "node-b", gen: 2, via: "node-a"},
		{at: 3*time.Second + 300*time.Millisecond, holder: "node-b", gen: 2, via: "node-b"},
		{at: 60 * time.Second, holder: "node-b", gen: 2, via: "node-b"},
	}, move), "one change per move")
}

func TestBlackoutBoundsAddOverlappingFaults(t *testing.T) {
	topo := DefaultTopology()
	steps := []Step{
		{Seq: 0, Kind: "router-kill", Node: "node-c", For: 5 * time.Second},
		{Seq: 1, Kind: "move", Attachment: "blue/app-1", Node: "node-a", To: "node-b"},
		{Seq: 2, Kind: "router-kill", End: true, Start: 0},
	}
	t0 := time.Unix(0, 0)
	w := map[int]Window{0: {t0, t0.Add(10 * time.Second)}, 1: {t0.Add(2 * time.Second), t0.Add(4 * time.Second)}}
	if b, ok := BlackoutBound(topo, steps, w, 1, "blue/app-1"); !ok || b != 20*time.Second+NoLossBound {
		t.Errorf("the move's bound: %s %v", b, ok)
	}
	if _, ok := BlackoutBound(topo, steps, w, 0, "blue/app-1"); ok {
		t.Error("the router-kill bounds an attachment a move explains")
	}
	if b, ok := BlackoutBound(topo, steps, w, 0, "red/app-0"); !ok || b != NoLossBound {
		t.Errorf("the router-kill's bound on another attachment: %s %v", b, ok)
	}
}

// A live migration's lease goes from the source's token to free to the
// target's next token; a third holder, or a token further on, fails.
func TestAMigrationKeepsOneHolderFromSourceToTarget(t *testing.T) {
	run := func(leases ...LeaseView) *Checker {
		start := time.Unix(0, 0)
		c := NewChecker(DefaultTopology(), SimBounds, start)
		rk := RouteKey{Observer: "node-c", Key: "blue/app-1"}
		at := start
		observe := func(l LeaseView, holder string, gen int64) {
			at = at.Add(sampleEvery)
			c.Observe(Snapshot{At: at, Leases: map[string]LeaseView{"blue/app-1": l}, Routes: map[RouteKey]string{rk: holder},
				Entries: []EntryView{{Key: "blue/app-1", Node: holder, ContainerID: "c-" + holder, Generation: gen, Live: true}}})
		}
		observe(LeaseView{Holder: "node-a/src", Token: 4}, "node-a", 4)
		m := Step{Seq: 1, Kind: "migrate", Attachment: "blue/app-1", Node: "node-a", To: "node-b"}
		c.Begin(m, at)
		for _, l := range leases {
			observe(l, "node-a", 4)
		}
		observe(LeaseView{Holder: "node-b/dst", Token: 5}, "node-b", 5)
		c.Done(m, at)
		return c
	}
	wantNone(t, run(LeaseView{Holder: "node-a/src", Token: 4}, LeaseView{Token: 4}, LeaseView{Holder: "node-b/dst", Token: 5}))
	wantViolation(t, run(LeaseView{Token: 4}, LeaseView{Holder: "node-c/other", Token: 5}), "one holder")
	wantViolation(t, run(LeaseView{Token: 4}, LeaseView{Holder: "node-b/dst", Token: 6}), "one holder")
}

// A migration needs a route change; while the reflector or a router is
// down it cannot reach the receivers, so the migration is bounded like a
// move. Other faults only add their own bound to the migration's.
func TestAMigrationThatAStallingFaultOverlapsIsBoundedLikeAMove(t *testing.T) {
	topo := DefaultTopology()
	t0 := time.Unix(0, 0)
	migrate := Step{Seq: 1, Kind: "migrate", Attachment: "blue/app-1", Node: "node-c", To: "node-b"}
	for _, tc := range []struct {
		fault string
		want  time.Duration
	}{
		{"reflector-outage", StalledBound + NoLossBound},
		{"router-term", StalledBound + NoLossBound},
		{"gc-kill", MigrationBound + NoLossBound},
		{"packet-loss", MigrationBound + NoLossBound},
	} {
		steps := []Step{{Seq: 0, Kind: tc.fault, Node: "node-c", For: 10 * time.Second}, migrate, {Seq: 2, Kind: tc.fault, End: true, Start: 0}}
		w := map[int]Window{0: {t0, t0.Add(10 * time.Second)}, 1: {t0.Add(2 * time.Second), t0.Add(4 * time.Second)}}
		if b, ok := BlackoutBound(topo, steps, w, 1, "blue/app-1"); !ok || b != tc.want {
			t.Errorf("a migration during %s: bound %s %v, want %s", tc.fault, b, ok, tc.want)
		}
	}
	alone := map[int]Window{1: {t0, t0.Add(time.Second)}}
	if b, ok := BlackoutBound(topo, []Step{{Seq: 0, Kind: "gc-kill"}, migrate}, alone, 1, "blue/app-1"); !ok || b != MigrationBound {
		t.Errorf("a migration alone: bound %s %v", b, ok)
	}
}

// Two attachment identities holding one address of one VPC fail once the
// conflict outlasts Lag; the same address in two VPCs, or one identity
// named by several sources, does not.
func TestAnAddressHeldByTwoIdentitiesFails(t *testing.T) {
	run := func(lasting time.Duration, claims ...AddressClaim) *Checker {
		start := time.Unix(0, 0)
		c := NewChecker(DefaultTopology(), DefaultBounds, start)
		for at := time.Duration(0); at <= lasting; at += sampleEvery {
			c.Observe(Snapshot{At: start.Add(at), Claims: claims})
		}
		return c
	}
	bound := AddressClaim{VPC: "v1", Address: "10.30.0.10", UID: "a", Source: "VPCAddress green.10.30.0.10"}
	status := AddressClaim{VPC: "v1", Address: "10.30.0.10", UID: "a", Source: "the status of green/keeper"}
	other := AddressClaim{VPC: "v1", Address: "10.30.0.10", UID: "b", Source: "the status of green/cycled"}
	elsewhere := AddressClaim{VPC: "v2", Address: "10.30.0.10", UID: "b", Source: "the status of another tenant's attachment"}
	wantNone(t, run(10*time.Second, bound, status, elsewhere))
	wantNone(t, run(DefaultBounds.Lag/2, bound, other))
	c := run(DefaultBounds.Lag+time.Second, bound, status, other)
	wantViolation(t, c, "one identity per address")
	if len(c.Violations) != 1 || !strings.Contains(c.Violations[0].Detail, "green/cycled") {
		t.Errorf("got %v", c.Violations)
	}
}
