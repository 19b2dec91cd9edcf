package soak

import (
	"testing"
	"time"
)

func TestTheSimulatedWorldPassesTheCheckers(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		c := Simulate(seed, 5*time.Minute, 0, Bugs{})
		for _, v := range c.Violations {
			t.Errorf("seed %d: %s", seed, v)
		}
	}
}

func TestSimPlantedBugs(t *testing.T) {
	for name, bugs := range map[string]Bugs{"ignore generation": {IgnoreGeneration: true}, "gc skips one": {GCSkipsOne: true}} {
		found := false
		for seed := uint64(1); seed <= 30 && !found; seed++ {
			c := Simulate(seed, 5*time.Minute, 0, bugs)
			if len(c.Violations) > 0 {
				found = true
				t.Logf("%s: seed %d: %s", name, seed, c.Violations[0])
			}
		}
		if !found {
			t.Errorf("%s: no seed found it", name)
		}
	}
}
