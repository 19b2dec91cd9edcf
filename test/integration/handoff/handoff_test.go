package handoff

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// lease names a fresh lease for one test and deletes it afterwards.
func lease(t *testing.T, env *harness.Env, attachment string) string {
	name := names.Lease("blue", attachment)
	t.Cleanup(func() {
		_ = env.API.Leases(harness.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

func newLock(t *testing.T, env *harness.Env, name string, opts handoff.Options) *handoff.Lock {
	t.Helper()
	l, err := handoff.New(env.API.Leases(harness.Namespace), harness.Namespace, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTenContendersHoldTheLeaseOneAtATimeAndEachHandoffRaisesTheTokenByOne(t *testing.T) {
	env := harness.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name := lease(t, env, "contended")
	w, err := env.API.Leases(harness.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	const contenders = 10
	var inside atomic.Int32
	tokens := make(chan int64, contenders)
	var wg sync.WaitGroup
	for i := range contenders {
		wg.Go(func() {
			// A long lease: every handoff here must come from a release.
			l, err := handoff.New(env.API.Leases(harness.Namespace), harness.Namespace, name, handoff.Options{LeaseDuration: time.Minute, RetryPeriod: 200 * time.Millisecond})
			if err != nil {
				t.Error(err)
				return
			}
			g, err := l.Acquire(ctx, names.Holder(fmt.Sprintf("node-%d", i), "c"))
			if err != nil {
				t.Errorf("contender %d: %v", i, err)
				return
			}
			if n := inside.Add(1); n != 1 {
				t.Errorf("contender %d holds the lease with %d others", i, n-1)
			}
			if err := l.Renew(ctx, g); err != nil {
				t.Errorf("contender %d renewing its grant: %v", i, err)
			}
			inside.Add(-1)
			if err := l.Release(ctx, g); err != nil {
				t.Errorf("contender %d releasing its grant: %v", i, err)
			}
			tokens <- g.Token
		})
	}
	wg.Wait()
	close(tokens)

	got := slices.Sorted(func(yield func(int64) bool) {
		for tok := range tokens {
			if !yield(tok) {
				return
			}
		}
	})
	want := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if !slices.Equal(got, want) {
		t.Fatalf("every contender gets the lease once with the next token: want tokens %v, got %v", want, got)
	}

	// Every version of the lease, in order, up to the last release.
	var seen []handoff.Record
	for last := (handoff.Record{}); last.LeaseTransitions != contenders || last.HolderIdentity != ""; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended after %d versions", len(seen))
			}
			l, isLease := ev.Object.(*coordinationv1.Lease)
			if !isLease || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				t.Fatalf("unexpected watch event %s %T", ev.Type, ev.Object)
			}
			last = handoff.RecordFromSpec(l.Spec)
			seen = append(seen, last)
		case <-ctx.Done():
			t.Fatalf("watching the lease: %v after %d versions", ctx.Err(), len(seen))
		}
	}
	holders := map[string]bool{}
	prev := handoff.Record{}
	for i, r := range seen {
		switch {
		case r.HolderIdentity == "":
			if r.LeaseTransitions != prev.LeaseTransitions {
				t.Errorf("version %d: a release changed the token from %d to %d", i, prev.LeaseTransitions, r.LeaseTransitions)
			}
		case r.HolderIdentity == prev.HolderIdentity:
			if r.LeaseTransitions != prev.LeaseTransitions {
				t.Errorf("version %d: a renewal changed the token from %d to %d", i, prev.LeaseTransitions, r.LeaseTransitions)
			}
		default:
			if prev.HolderIdentity != "" {
				t.Errorf("version %d: %s took the lease from %s without a release in between", i, r.HolderIdentity, prev.HolderIdentity)
			}
			if r.LeaseTransitions != prev.LeaseTransitions+1 {
				t.Errorf("version %d: handoff to %s: want token %d, got %d", i, r.HolderIdentity, prev.LeaseTransitions+1, r.LeaseTransitions)
			}
			if holders[r.HolderIdentity] {
				t.Errorf("version %d: %s acquired twice", i, r.HolderIdentity)
			}
			holders[r.HolderIdentity] = true
		}
		prev = r
	}
	if len(holders) != contenders {
		t.Errorf("want %d holders in the watch, saw %d", contenders, len(holders))
	}
}

func TestAHolderThatLostTheLeaseGetsErrLostAndItsReleaseLeavesTheNewHolder(t *testing.T) {
	env := harness.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := lease(t, env, "lost")
	short := handoff.Options{LeaseDuration: time.Second, RetryPeriod: 100 * time.Millisecond}
	a, b := newLock(t, env, name, short), newLock(t, env, name, short)

	ga, err := a.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	// A stops renewing; B takes over once the lease expired by its clock.
	gb, err := b.Acquire(ctx, "node-b/c2")
	if err != nil {
		t.Fatal(err)
	}
	if gb.Token != ga.Token+1 {
		t.Errorf("takeover: want token %d, got %d", ga.Token+1, gb.Token)
	}
	if err := a.Renew(ctx, ga); !errors.Is(err, handoff.ErrLost) {
		t.Errorf("renewal by the old holder: want ErrLost, got %v", err)
	}
	if err := a.Release(ctx, ga); !errors.Is(err, handoff.ErrLost) {
		t.Errorf("release by the old holder: want ErrLost, got %v", err)
	}
	r, err := a.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.HolderIdentity != gb.Holder || int64(r.LeaseTransitions) != gb.Token {
		t.Fatalf("the new holder must keep the lease: want %s with token %d, got %+v", gb.Holder, gb.Token, r)
	}
	if err := b.Release(ctx, gb); err != nil {
		t.Errorf("release by the new holder: %v", err)
	}
}

func TestACrashedHolderIsTakenOverOnlyAfterTheLeaseDuration(t *testing.T) {
	env := harness.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := lease(t, env, "crashed")
	const duration = 2 * time.Second
	opts := handoff.Options{LeaseDuration: duration, RetryPeriod: 100 * time.Millisecond}
	ga, err := newLock(t, env, name, opts).Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	// node-a/c1 never renews. The successor's observation starts after
	// this instant, so it cannot take over before duration has passed.
	start := time.Now()
	gb, err := newLock(t, env, name, opts).Acquire(ctx, "node-b/c2")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < duration {
		t.Errorf("taken over after %v, before the lease duration %v", took, duration)
	}
	if gb.Token != ga.Token+1 {
		t.Errorf("takeover: want token %d, got %d", ga.Token+1, gb.Token)
	}
}

func TestARenewingHolderIsNeverTakenOverAndAWaitThatEndsNamesIt(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	name := lease(t, env, "renewing")
	const duration = time.Second
	opts := handoff.Options{LeaseDuration: duration, RetryPeriod: 100 * time.Millisecond}
	a, b := newLock(t, env, name, opts), newLock(t, env, name, opts)
	ga, err := a.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.Is(err, handoff.ErrHeld) {
		t.Fatalf("want ErrHeld, got %v", err)
	}
	time.Sleep(duration + duration/2)
	// The renewal is a new version: B's observation starts over, however
	// long ago it first looked.
	if err := a.Renew(ctx, ga); err != nil {
		t.Fatal(err)
	}
	var held *handoff.HeldError
	if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.As(err, &held) || held.Holder != "node-a/c1" || held.Token != ga.Token {
		t.Fatalf("a renewed lease: want it held by node-a/c1 with token %d, got %v", ga.Token, err)
	}

	// An Acquire whose deadline passes says who holds the lease.
	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = newLock(t, env, name, handoff.Options{LeaseDuration: time.Minute, RetryPeriod: 100 * time.Millisecond}).Acquire(waitCtx, "node-c/c3")
	if err := a.Renew(ctx, ga); err != nil {
		t.Fatalf("the holder lost its lease to a waiter: %v", err)
	}
	if !errors.As(err, &held) || !errors.Is(err, context.DeadlineExceeded) || held.Holder != "node-a/c1" {
		t.Fatalf("want a *HeldError naming node-a/c1 after the deadline, got %v", err)
	}
}

func TestRetriesInNewProcessesContinueOneObservationThroughObservationDir(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	name := lease(t, env, "observed")
	const duration = time.Second
	opts := handoff.Options{LeaseDuration: duration}
	ga, err := newLock(t, env, name, opts).Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	kept := opts
	kept.ObservationDir = t.TempDir()
	// Each attempt builds a new Lock, as each CNI ADD is a new process.
	if _, err := newLock(t, env, name, kept).TryAcquire(ctx, "node-b/c2"); !errors.Is(err, handoff.ErrHeld) {
		t.Fatalf("first attempt: want ErrHeld, got %v", err)
	}
	time.Sleep(duration + duration/2)
	if _, err := newLock(t, env, name, opts).TryAcquire(ctx, "node-b/c2"); !errors.Is(err, handoff.ErrHeld) {
		t.Fatalf("an attempt without the kept observation starts over: want ErrHeld, got %v", err)
	}
	gb, err := newLock(t, env, name, kept).TryAcquire(ctx, "node-b/c2")
	if err != nil {
		t.Fatalf("an attempt continuing the kept observation: %v", err)
	}
	if gb.Token != ga.Token+1 {
		t.Errorf("want token %d, got %d", ga.Token+1, gb.Token)
	}
}
