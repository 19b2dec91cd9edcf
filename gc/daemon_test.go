package gc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// countedAdverts counts the passes by their one list of advertisements.
type countedAdverts struct {
	Advertisements
	lists atomic.Int64
}

func (c *countedAdverts) List(ctx context.Context) ([]v1alpha1.BGPAdvertisement, error) {
	c.lists.Add(1)
	return c.Advertisements.List(ctx)
}

func TestPassesRunAnIntervalApart(t *testing.T) {
	w := newWorld(t)
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	adverts := &countedAdverts{Advertisements: w.advs}
	w.c.Clock, w.c.Adverts = clk, adverts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, w.c, Options{Interval: 30 * time.Second, PassTimeout: time.Minute, Log: w.c.Log})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// The loop waits on the clock once a pass is done.
	waitForPasses := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); adverts.lists.Load() != n || !clk.HasWaiters(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10 s: %d passes and the loop waiting (%d passes)", n, adverts.lists.Load())
			}
		}
	}
	waitForPasses(1)
	clk.Step(29 * time.Second)
	// Still waiting: the interval has not passed.
	if !clk.HasWaiters() || adverts.lists.Load() != 1 {
		t.Fatalf("after 29 s of a 30 s interval: %d passes", adverts.lists.Load())
	}
	clk.Step(time.Second)
	waitForPasses(2)
	clk.Step(30 * time.Second)
	waitForPasses(3)
}
