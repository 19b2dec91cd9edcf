package soak_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/soak"
)

// The 30-minute soak's old violation (seed 2026, step #183): an upgrade
// right after an API outage longer than client-go's backoff cap stayed
// unannounced for seconds, because node-b's router waited out its
// informers' backoff before it listed again. After a 31 s outage of every
// node's API, the upgraded instance must answer again within the
// upgrade's settle time, as it does without an outage.
func TestAnUpgradeRightAfterALongAPIOutageAnswersWithinItsSettleTime(t *testing.T) {
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
	// Measured from the upgrade's start to SettleTime after its end: a
	// router that has not resynced leaves it dark for all of that.
	if b := rep.Blackouts["upgrade"]; len(b) != 1 || b[0] >= soak.SettleTime {
		t.Errorf("the upgrade's blackout: %v, want one under %s", b, soak.SettleTime)
	}
}
