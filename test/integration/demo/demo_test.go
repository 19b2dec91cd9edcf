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
	checkTenants(t, rep.Tenants)
}

// checkTenants: every sender's pings reached its own tenant's receiver
// and none the other tenant's workload of the same address; the tenants'
// VPCs have different VNIs and data-plane names; no two of the four
// attachments share a data-plane name, host interface, lease or
// advertisement.
func checkTenants(t *testing.T, tn demo.Tenants) {
	t.Helper()
	if len(tn.Pings) != 4 || len(tn.Objects) != 4 {
		t.Fatalf("tenants: %d senders and %d attachments, want 4 of each", len(tn.Pings), len(tn.Objects))
	}
	for _, p := range tn.Pings {
		if p.Sent == 0 || p.Own < p.Sent || p.Other != 0 {
			t.Errorf("tenants: %s sent %d pings to %s: %d at its tenant's receiver, %d at the other tenant's; want all, none", p.From, p.Sent, p.To, p.Own, p.Other)
		}
	}
	byTenant := map[string][]demo.TenantObject{}
	seen := map[string]string{}
	for _, o := range tn.Objects {
		tenant, _, _ := strings.Cut(o.Name, "/")
		byTenant[tenant] = append(byTenant[tenant], o)
		for _, name := range []string{o.DataplaneVPC + "/" + o.DataplaneAttachment, o.HostInterface, o.Lease, o.Advertisement} {
			if name == "" || seen[name] != "" {
				t.Errorf("tenants: %s's name %q is empty or also %s's", o.Name, name, seen[name])
			}
			seen[name] = o.Name
		}
	}
	a, b := byTenant["tenant-a"], byTenant["tenant-b"]
	if len(a) != 2 || len(b) != 2 {
		t.Fatalf("tenants: attachments %v", tn.Objects)
	}
	for _, x := range a {
		for _, y := range b {
			if x.VNI == y.VNI || x.DataplaneVPC == y.DataplaneVPC {
				t.Errorf("tenants: %s and %s share VNI (%d, %d) or VPC data-plane name (%s, %s)", x.Name, y.Name, x.VNI, y.VNI, x.DataplaneVPC, y.DataplaneVPC)
			}
		}
	}
}
