package soak_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/soak"
)

// The 30-minute soak's violation (seed 2026, step #183): right after an
// API outage longer than client-go's backoff cap, an upgrade on node-b
// stayed unannounced until node-b's router was restarted, because its
// informers waited out their backoff before listing again. After a 31 s
// outage of every node's API, an upgrade must lose no more than an upgrade
// does without one.
func TestAnUpgradeRightAfterALongAPIOutageIsAnnouncedAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("an API outage of half a minute on the real topology")
	}
	env := harness.Setup(t)
	harness.RequireFRR(t)
	outage := soak.Step{Seq: 0, At: time.Second, Kind: "api-outage", For: 31 * time.Second}
	plan := []soak.Step{
		outage,
		{Seq: 1, At: 32 * time.Second, Kind: "api-outage", End: true, Start: 0, For: outage.For},
		{Seq: 2, At: 32*time.Second + 400*time.Millisecond, Kind: "upgrade", Attachment: "red/app-0", Node: "node-b"},
		// A fault that changes nothing (loss 0 %) measures red/app-0's
		// blackout over the 20 s after the upgrade against the no-loss
		// bound.
		{Seq: 3, At: 34 * time.Second, Kind: "packet-loss", For: 20 * time.Second},
		{Seq: 4, At: 54 * time.Second, Kind: "packet-loss", End: true, Start: 3, For: 20 * time.Second},
	}
	var out strings.Builder
	rep, err := soak.Run(context.Background(), soak.Options{Plan: plan, Duration: time.Minute, Quiet: 5 * time.Second, Env: env, Out: &out})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Error(v)
	}
	if len(rep.Blackouts["packet-loss"]) == 0 {
		t.Error("nothing measured after the upgrade")
	}
}
