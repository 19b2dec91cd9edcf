package soak_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/soak"
)

func TestMain(m *testing.M) { harness.Main(m) }

// seed is the fixed schedule `make test` soaks under.
const seed = 20261201

// A two-minute soak of the real topology under a fixed seed fails on any
// violation, each printed with the command that replays its schedule
// prefix.
func TestATwoMinuteSoakKeepsEveryInvariant(t *testing.T) {
	if testing.Short() {
		t.Skip("a two-minute soak of the real topology")
	}
	env := harness.Setup(t)
	harness.RequireFRR(t)
	var out strings.Builder
	rep, err := soak.Run(context.Background(), soak.Options{Seed: seed, Duration: 2 * time.Minute, Env: env, Out: &out})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	var sum strings.Builder
	rep.Summary(&sum)
	t.Log("\n" + sum.String())
	if f := os.Getenv("SOAK_REPORT"); f != "" {
		if w, err := os.Create(f); err == nil {
			rep.Markdown(w)
			w.Close()
		}
	}
	for _, v := range rep.Violations {
		t.Errorf("%s\n  reproduce: %s", v, rep.Reproduce(v.Step))
	}
	if rep.Executed != len(rep.Steps) {
		t.Errorf("%d of %d steps executed", rep.Executed, len(rep.Steps))
	}
}

// The checkers catch a planted bug: on the simulated world, a router that
// ignores holderGeneration, a GC that skips one dead record and a
// controller that allocates an address an attachment holds each make some
// seed fail; the same seed passes without the bug, and replaying the
// reported prefix of its schedule fails again the same way.
func TestTheCheckersCatchAPlantedBugWithAReproducibleSeed(t *testing.T) {
	const duration = 5 * time.Minute
	for _, tc := range []struct {
		name  string
		bugs  soak.Bugs
		check string
	}{
		{"a router ignoring holderGeneration", soak.Bugs{IgnoreGeneration: true}, "route at holder"},
		{"a GC skipping one record", soak.Bugs{GCSkipsOne: true}, "leak"},
		{"a controller handing out an address twice", soak.Bugs{ReuseAddress: true}, "one identity per address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for s := uint64(1); s <= 40; s++ {
				c := soak.Simulate(s, duration, 0, tc.bugs)
				if len(c.Violations) == 0 {
					continue
				}
				v := c.Violations[0]
				if v.Check != tc.check {
					t.Fatalf("seed %d: the first violation is %s, want a %q one", s, v, tc.check)
				}
				t.Logf("seed %d finds it: %s (replay: SOAK_STEPS=%d)", s, v, v.Step+1)
				if clean := soak.Simulate(s, duration, 0, soak.Bugs{}); len(clean.Violations) > 0 {
					t.Fatalf("seed %d without the bug: %s", s, clean.Violations[0])
				}
				again := soak.Simulate(s, duration, v.Step+1, tc.bugs)
				if len(again.Violations) == 0 || again.Violations[0].Check != tc.check {
					t.Fatalf("seed %d: replaying its first %d steps did not fail the same way: %v", s, v.Step+1, again.Violations)
				}
				return
			}
			t.Fatal("no seed of 40 caught the bug")
		})
	}
}

// Without a planted bug the simulated world passes every checker, whatever
// the seed: the windows the checkers allow hold for a correct world.
func TestTheCheckersPassACorrectWorld(t *testing.T) {
	for s := uint64(1); s <= 10; s++ {
		for _, v := range soak.Simulate(s, 5*time.Minute, 0, soak.Bugs{}).Violations {
			t.Errorf("seed %d: %s", s, v)
		}
	}
}
