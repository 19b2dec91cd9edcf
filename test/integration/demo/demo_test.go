package demo_test

import (
	"context"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/test/demo"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

func TestMain(m *testing.M) { harness.Main(m) }

// The demo is also a test: every step checks what it shows, and the
// figures it reports are checked here once more against the story.
func TestTheDemoObservesEveryExpectedState(t *testing.T) {
	env := harness.Setup(t)
	harness.RequireFRR(t)
	if err := vm.Available(); err != nil {
		t.Skipf("the demo's VM is a qemu guest: %v", err)
	}
	var out strings.Builder
	rep, err := demo.Run(context.Background(), &out, env)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if l := rep.Live; l.RouteChanges != 1 || !l.TCPSurvived || l.UptimeAfter <= l.UptimeBefore {
		t.Errorf("live migration: node-c's route changed %d times, TCP survived %v, uptime %s then %s; want once, true, growing",
			l.RouteChanges, l.TCPSurvived, l.UptimeBefore, l.UptimeAfter)
	}
	if rep.RepliesBeforeAvailable != 0 {
		t.Errorf("attach: %d replies before the guest reported available", rep.RepliesBeforeAvailable)
	}
	if !rep.IPv6Routed || rep.IPv6AfterDrain {
		t.Errorf("IPv6: routed after attach %v, answered after the drain %v; want true, false", rep.IPv6Routed, rep.IPv6AfterDrain)
	}
	if rep.Upgrade.Lost == 0 || rep.Upgrade.Lost == rep.Upgrade.Sent || len(rep.Upgrade.RouteChanges) != 0 {
		t.Errorf("upgrade: %d of %d lost, node-c's route changed %q; a replacement that boots loses some replies, never all, and no route changes",
			rep.Upgrade.Lost, rep.Upgrade.Sent, rep.Upgrade.RouteChanges)
	}
	if w, a := rep.Move.Withdrawn, rep.Move.Announced; len(w) != 1 || w["node-a"] != 1 || len(a) != 1 || a["node-b"] != 1 {
		t.Errorf("move: FRR received withdrawals %v and announcements %v, want one from node-a and one from node-b", w, a)
	}
	for name, f := range map[string]demo.Figures{"move": rep.Move, "crash": rep.Crash} {
		if len(f.RouteChanges) != 1 {
			t.Errorf("%s: node-c's route changed %d times, want once: %q", name, len(f.RouteChanges), f.RouteChanges)
		}
	}
	if rep.ViaAtLeaseExpiry != "node-b" {
		t.Errorf("crash: at the lease's expiry node-c's route led to %q, want node-b (kept through the session's loss)", rep.ViaAtLeaseExpiry)
	}
	if len(rep.Return.RouteChanges) != 0 || rep.Return.Lost != 0 {
		t.Errorf("node-b's return: node-c's route changed %q, %d replies lost", rep.Return.RouteChanges, rep.Return.Lost)
	}
	if rep.Restart.Lost != 0 || rep.Restart.Sent == 0 || len(rep.Restart.RouteChanges) != 0 {
		t.Errorf("router restart: %d of %d replies lost, node-c's route changed %q; want none", rep.Restart.Lost, rep.Restart.Sent, rep.Restart.RouteChanges)
	}
	if rep.LostBeforeDrain != 0 || rep.RepliesAfterWithdrawal != 0 {
		t.Errorf("drain: %d replies lost before the report, %d after node-c's route went; want none of either", rep.LostBeforeDrain, rep.RepliesAfterWithdrawal)
	}
}
