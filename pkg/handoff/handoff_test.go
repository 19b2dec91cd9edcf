package handoff

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var epoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const lease = 10 * time.Second

func newLock(t *testing.T, s Store, c *clocktesting.FakeClock, dir string) *Lock {
	t.Helper()
	l, err := NewWithStore(s, "galactic-system/blue.web-0-net0", Options{LeaseDuration: lease, Clock: c, ObservationDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func held(holder string, token int32) *Record {
	return &Record{HolderIdentity: holder, LeaseDurationSeconds: 10, AcquireTime: epoch, RenewTime: epoch, LeaseTransitions: token}
}

func TestEachOperationDecidesFromTheLeaseAndWritesOnlyWithTheResourceVersionItRead(t *testing.T) {
	acquire := func(h string) func(context.Context, *Lock) (Grant, error) {
		return func(ctx context.Context, l *Lock) (Grant, error) { return l.TryAcquire(ctx, h) }
	}
	renew := func(g Grant) func(context.Context, *Lock) (Grant, error) {
		return func(ctx context.Context, l *Lock) (Grant, error) { return Grant{}, l.Renew(ctx, g) }
	}
	release := func(g Grant) func(context.Context, *Lock) (Grant, error) {
		return func(ctx context.Context, l *Lock) (Grant, error) { return Grant{}, l.Release(ctx, g) }
	}
	report := func(g Grant, available bool, reason string) func(context.Context, *Lock) (Grant, error) {
		return func(ctx context.Context, l *Lock) (Grant, error) {
			return Grant{}, l.SetAvailable(ctx, g.Holder, g.Token, available, reason)
		}
	}
	reported := func(r *Record, rep Report) *Record { r.Report = rep; return r }
	up := Report{Set: true, Available: true, Token: 3, Reason: "Serving"}
	tests := []struct {
		name  string
		lease *Record
		// observedFor > 0: the lock reads the lease once, then its clock
		// moves on by observedFor before the operation.
		observedFor time.Duration
		interfere   func(f *fakeStore)
		do          func(context.Context, *Lock) (Grant, error)
		calls       []string
		want        Grant
		wantErr     error
		// wantHolder, wantToken and wantReport describe the lease afterwards.
		wantHolder string
		wantToken  int32
		wantReport Report
	}{
		{
			name: "a missing lease is created with token 1",
			do:   acquire("node-b/c2"), calls: []string{"get", "create"},
			want: Grant{"node-b/c2", 1}, wantHolder: "node-b/c2", wantToken: 1,
			wantReport: Report{Set: true, Token: 1, Reason: ReasonAcquired},
		},
		{
			name:  "a released lease is taken with the next token",
			lease: reported(held("", 3), Report{Set: true, Token: 3, Reason: ReasonReleased}), do: acquire("node-b/c2"), calls: []string{"get", "update"},
			want: Grant{"node-b/c2", 4}, wantHolder: "node-b/c2", wantToken: 4,
			wantReport: Report{Set: true, Token: 4, Reason: ReasonAcquired},
		},
		{
			name:  "a lease already ours is re-acquired with its token unchanged",
			lease: reported(held("node-b/c2", 3), up), do: acquire("node-b/c2"), calls: []string{"get", "update"},
			want: Grant{"node-b/c2", 3}, wantHolder: "node-b/c2", wantToken: 3, wantReport: up,
		},
		{
			name:  "a lease another holder has, just seen, is left alone",
			lease: held("node-a/c1", 3), do: acquire("node-b/c2"), calls: []string{"get"},
			wantErr: ErrHeld, wantHolder: "node-a/c1", wantToken: 3,
		},
		{
			name:  "a lease seen unchanged for less than its duration is left alone",
			lease: held("node-a/c1", 3), observedFor: lease - time.Second, do: acquire("node-b/c2"), calls: []string{"get"},
			wantErr: ErrHeld, wantHolder: "node-a/c1", wantToken: 3,
		},
		{
			name:  "a lease seen unchanged for its duration is taken over with the next token",
			lease: reported(held("node-a/c1", 3), up), observedFor: lease, do: acquire("node-b/c2"), calls: []string{"get", "update"},
			want: Grant{"node-b/c2", 4}, wantHolder: "node-b/c2", wantToken: 4,
			wantReport: Report{Set: true, Token: 4, Reason: ReasonAcquired},
		},
		{
			name:        "the holder's own lease duration decides expiry, not the acquirer's",
			lease:       &Record{HolderIdentity: "node-a/c1", LeaseDurationSeconds: 30, LeaseTransitions: 3},
			observedFor: lease, do: acquire("node-b/c2"), calls: []string{"get"},
			wantErr: ErrHeld, wantHolder: "node-a/c1", wantToken: 3,
		},
		{
			name:  "a write that lost a race reads again and decides again",
			lease: held("", 3), do: acquire("node-b/c2"), calls: []string{"get", "update", "get"},
			interfere: func(f *fakeStore) { f.put(*held("node-a/c1", 4)) },
			wantErr:   ErrHeld, wantHolder: "node-a/c1", wantToken: 4,
		},
		{
			name: "a create that lost a race reads again and decides again",
			do:   acquire("node-b/c2"), calls: []string{"get", "create", "get"},
			interfere: func(f *fakeStore) { f.put(*held("node-a/c1", 1)) },
			wantErr:   ErrHeld, wantHolder: "node-a/c1", wantToken: 1,
		},
		{
			name:  "a current grant is renewed with one write that keeps the holder's report",
			lease: reported(held("node-a/c1", 3), up), do: renew(Grant{"node-a/c1", 3}), calls: []string{"get", "update"},
			wantHolder: "node-a/c1", wantToken: 3, wantReport: up,
		},
		{
			name:  "a renewal that lost a race to another renewal of the same grant retries",
			lease: held("node-a/c1", 3), do: renew(Grant{"node-a/c1", 3}), calls: []string{"get", "update", "get", "update"},
			interfere:  func(f *fakeStore) { f.put(*held("node-a/c1", 3)) },
			wantHolder: "node-a/c1", wantToken: 3,
		},
		{
			name:  "a renewal whose token moved on is lost and writes nothing",
			lease: held("node-a/c1", 4), do: renew(Grant{"node-a/c1", 3}), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "node-a/c1", wantToken: 4,
		},
		{
			name:  "a renewal of a lease another holder took is lost and writes nothing",
			lease: held("node-b/c2", 4), do: renew(Grant{"node-a/c1", 3}), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "node-b/c2", wantToken: 4,
		},
		{
			name: "a renewal of a missing lease is lost",
			do:   renew(Grant{"node-a/c1", 3}), calls: []string{"get"}, wantErr: ErrLost,
		},
		{
			name:  "a release of a current grant frees the lease, keeps its token and reports it not available",
			lease: reported(held("node-a/c1", 3), up), do: release(Grant{"node-a/c1", 3}), calls: []string{"get", "update"},
			wantHolder: "", wantToken: 3, wantReport: Report{Set: true, Token: 3, Reason: ReasonReleased},
		},
		{
			name:  "a release of a lost grant leaves the new holder alone",
			lease: held("node-b/c2", 4), do: release(Grant{"node-a/c1", 3}), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "node-b/c2", wantToken: 4,
		},
		{
			name:  "a release that lost a race to a takeover is lost and clears nothing",
			lease: held("node-a/c1", 3), do: release(Grant{"node-a/c1", 3}), calls: []string{"get", "update", "get"},
			interfere: func(f *fakeStore) { f.put(*held("node-b/c2", 4)) },
			wantErr:   ErrLost, wantHolder: "node-b/c2", wantToken: 4,
		},
		{
			name:  "a second release of the same grant changes nothing",
			lease: held("", 3), do: release(Grant{"node-a/c1", 3}), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "", wantToken: 3,
		},
		{
			name:  "the current holder reports available with one write",
			lease: held("node-a/c1", 3), do: report(Grant{"node-a/c1", 3}, true, "Serving"), calls: []string{"get", "update"},
			wantHolder: "node-a/c1", wantToken: 3, wantReport: up,
		},
		{
			name:  "the current holder reports not available with its reason",
			lease: reported(held("node-a/c1", 3), up), do: report(Grant{"node-a/c1", 3}, false, "ShuttingDown"), calls: []string{"get", "update"},
			wantHolder: "node-a/c1", wantToken: 3, wantReport: Report{Set: true, Token: 3, Reason: "ShuttingDown"},
		},
		{
			name:  "a report the lease carries already is not written again",
			lease: reported(held("node-a/c1", 3), up), do: report(Grant{"node-a/c1", 3}, true, "Serving"), calls: []string{"get"},
			wantHolder: "node-a/c1", wantToken: 3, wantReport: up,
		},
		{
			name:  "a report under an old token is lost and writes nothing",
			lease: held("node-a/c1", 4), do: report(Grant{"node-a/c1", 3}, true, ""), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "node-a/c1", wantToken: 4,
		},
		{
			name:  "a predecessor's late report is lost and leaves the successor unavailable",
			lease: reported(held("node-b/c2", 4), Report{Set: true, Token: 4, Reason: ReasonAcquired}),
			do:    report(Grant{"node-a/c1", 3}, true, ""), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "node-b/c2", wantToken: 4, wantReport: Report{Set: true, Token: 4, Reason: ReasonAcquired},
		},
		{
			name:  "a report on a released lease is lost",
			lease: held("", 3), do: report(Grant{"node-a/c1", 3}, true, ""), calls: []string{"get"},
			wantErr: ErrLost, wantHolder: "", wantToken: 3,
		},
		{
			name:  "a report that lost a race to a takeover is lost",
			lease: held("node-a/c1", 3), do: report(Grant{"node-a/c1", 3}, true, ""), calls: []string{"get", "update", "get"},
			interfere: func(f *fakeStore) { f.put(*held("node-b/c2", 4)) },
			wantErr:   ErrLost, wantHolder: "node-b/c2", wantToken: 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFakeStore(t)
			if tt.lease != nil {
				f.put(*tt.lease)
			}
			c := clocktesting.NewFakeClock(epoch)
			l := newLock(t, f, c, "")
			if tt.observedFor > 0 {
				if _, err := l.TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
					t.Fatalf("first look: want ErrHeld, got %v", err)
				}
				c.Step(tt.observedFor)
			}
			f.expect, f.interfere = tt.calls, tt.interfere
			f.calls = f.calls[:0]
			g, err := tt.do(ctx, l)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("want error %v, got %v", tt.wantErr, err)
			}
			if g != tt.want {
				t.Errorf("want grant %+v, got %+v", tt.want, g)
			}
			if !slices.Equal(f.calls, tt.calls) {
				t.Errorf("want calls %v, got %v", tt.calls, f.calls)
			}
			r, _ := f.record()
			if r.HolderIdentity != tt.wantHolder || r.LeaseTransitions != tt.wantToken {
				t.Errorf("lease afterwards: want holder %q token %d, got %q token %d", tt.wantHolder, tt.wantToken, r.HolderIdentity, r.LeaseTransitions)
			}
			if r.Report != tt.wantReport {
				t.Errorf("report afterwards: want %+v, got %+v", tt.wantReport, r.Report)
			}
		})
	}
}

func TestACrashedHolderIsTakenOverOnlyAfterTheLeaseDurationOfTheAcquirersClock(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	// The holder's clock is decades behind: its renewTime looks ancient,
	// which must not make its lease look expired to anyone else.
	a := newLock(t, f, clocktesting.NewFakeClock(epoch.AddDate(-30, 0, 0)), "")
	cb := clocktesting.NewFakeClock(epoch)
	b := newLock(t, f, cb, "")

	ga, err := a.Acquire(ctx, "node-a/c1")
	if err != nil || ga.Token != 1 {
		t.Fatalf("first acquisition: want token 1, got %+v, %v", ga, err)
	}
	for _, step := range []time.Duration{0, lease / 2, lease/2 - time.Millisecond} {
		cb.Step(step)
		var held *HeldError
		if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.As(err, &held) || held.Holder != "node-a/c1" || held.Token != 1 {
			t.Fatalf("%v after first seeing the lease: want it held by node-a/c1 with token 1, got %v", cb.Since(epoch), err)
		}
	}
	cb.Step(time.Millisecond)
	gb, err := b.TryAcquire(ctx, "node-b/c2")
	if err != nil || gb != (Grant{"node-b/c2", 2}) {
		t.Fatalf("after the lease duration: want the lease with token 2, got %+v, %v", gb, err)
	}
}

func TestARenewalRestartsTheAcquirersObservation(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	a, b := newLock(t, f, c, ""), newLock(t, f, c, "")
	ga, err := a.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
		t.Fatalf("want ErrHeld, got %v", err)
	}
	c.Step(lease - time.Second)
	if err := a.Renew(ctx, ga); err != nil {
		t.Fatal(err)
	}
	c.Step(time.Second)
	if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
		t.Fatalf("a lease renewed %v ago: want ErrHeld, got %v", time.Second, err)
	}
	c.Step(lease - time.Second)
	if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
		t.Fatalf("a lease first seen renewed %v ago: want ErrHeld, got %v", lease-time.Second, err)
	}
	c.Step(time.Second)
	if g, err := b.TryAcquire(ctx, "node-b/c2"); err != nil || g.Token != 2 {
		t.Fatalf("a renewal seen unchanged for the lease duration: want token 2, got %+v, %v", g, err)
	}
}

func TestObservationDirLetsShortLivedAcquirersOnOneNodeContinueOneObservation(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	if _, err := newLock(t, f, c, "").Acquire(ctx, "node-a/c1"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "handoff")
	// Each attempt is a new Lock, as each CNI ADD is a new process.
	for range 2 {
		if _, err := newLock(t, f, c, dir).TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
			t.Fatalf("at %v: want ErrHeld, got %v", c.Since(epoch), err)
		}
		c.Step(lease / 2)
	}
	if _, err := newLock(t, f, c, "").TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
		t.Fatalf("an acquirer without the observation starts a new one: want ErrHeld, got %v", err)
	}
	g, err := newLock(t, f, c, dir).TryAcquire(ctx, "node-b/c2")
	if err != nil || g.Token != 2 {
		t.Fatalf("an acquirer continuing the kept observation: want token 2, got %+v, %v", g, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("the observation is dropped once the lease is taken, found %v", left)
	}
}

func TestAKeptObservationFromTheFutureStartsOverInsteadOfExpiringEarly(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	if _, err := newLock(t, f, c, "").Acquire(ctx, "node-a/c1"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := newLock(t, f, c, dir).TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
		t.Fatal(err)
	}
	// The node's clock goes back an hour.
	c.SetTime(epoch.Add(-time.Hour))
	for _, step := range []time.Duration{0, lease - time.Second} {
		c.Step(step)
		if _, err := newLock(t, f, c, dir).TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
			t.Fatalf("want ErrHeld, got %v", err)
		}
	}
	c.Step(time.Second)
	if _, err := newLock(t, f, c, dir).TryAcquire(ctx, "node-b/c2"); err != nil {
		t.Fatalf("a lease duration after the clock went back: %v", err)
	}
}

func TestAnUnwritableObservationDirIsAnError(t *testing.T) {
	f := newFakeStore(t)
	f.put(*held("node-a/c1", 1))
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := newLock(t, f, clocktesting.NewFakeClock(epoch), filepath.Join(file, "dir")).TryAcquire(context.Background(), "node-b/c2")
	if err == nil || errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "observation") {
		t.Fatalf("want an error about keeping the observation, got %v", err)
	}
}

func TestALostHolderGetsErrLostAndItsReleaseLeavesTheNewHolder(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	a, b := newLock(t, f, c, ""), newLock(t, f, c, "")
	ga, err := a.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "node-b/c2"); !errors.Is(err, ErrHeld) {
		t.Fatal(err)
	}
	c.Step(lease)
	gb, err := b.TryAcquire(ctx, "node-b/c2")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(ctx, ga); !errors.Is(err, ErrLost) {
		t.Errorf("renewal by the old holder: want ErrLost, got %v", err)
	}
	if err := a.Release(ctx, ga); !errors.Is(err, ErrLost) {
		t.Errorf("release by the old holder: want ErrLost, got %v", err)
	}
	if r, _ := f.record(); r.HolderIdentity != gb.Holder || int64(r.LeaseTransitions) != gb.Token {
		t.Fatalf("the new holder must keep the lease, got %+v", r)
	}
	if err := b.Renew(ctx, gb); err != nil {
		t.Errorf("renewal by the new holder: %v", err)
	}
	if err := b.Release(ctx, gb); err != nil {
		t.Errorf("release by the new holder: %v", err)
	}
	if r, _ := f.record(); r.HolderIdentity != "" || r.LeaseTransitions != 2 {
		t.Fatalf("released: want no holder and token 2, got %+v", r)
	}
}

func TestReacquiringTheSameHolderKeepsTheTokenAndTheNextHolderGetsOneMore(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	l := newLock(t, f, clocktesting.NewFakeClock(epoch), "")
	g1, err := l.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	g2, err := l.Acquire(ctx, "node-a/c1")
	if err != nil || g2 != g1 {
		t.Fatalf("re-acquisition: want %+v, got %+v, %v", g1, g2, err)
	}
	if err := l.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	g3, err := l.Acquire(ctx, "node-a/c2")
	if err != nil || g3.Token != g1.Token+1 {
		t.Fatalf("the next holder: want token %d, got %+v, %v", g1.Token+1, g3, err)
	}
}

func TestALockThatReportsOnAcquisitionWritesTheReportWithTheTokenInOneWrite(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	f.put(Record{LeaseDurationSeconds: 60, LeaseTransitions: 4, Report: Report{Set: true, Token: 4, Reason: ReasonReleased}})
	l, err := NewWithStore(f, "galactic-system/blue.web-0-net0", Options{LeaseDuration: lease, Clock: clocktesting.NewFakeClock(epoch), ReportAvailable: true, ReportReason: "Migrated"})
	if err != nil {
		t.Fatal(err)
	}
	f.expect = []string{"get", "update"}
	g, err := l.TryAcquire(ctx, "node-b/c2")
	if err != nil || g.Token != 5 {
		t.Fatalf("acquisition: want token 5, got %+v, %v", g, err)
	}
	want := Report{Set: true, Available: true, Token: 5, Reason: "Migrated"}
	if r, _ := f.record(); r.Report != want {
		t.Fatalf("report after the acquisition: want %+v, got %+v", want, r.Report)
	}
	// A retried acquisition by the same holder writes the report again,
	// whatever another writer left.
	f.expect = nil
	f.put(Record{HolderIdentity: "node-b/c2", LeaseDurationSeconds: 60, LeaseTransitions: 5, Report: Report{Set: true, Token: 5, Reason: ReasonAcquired}})
	if g, err := l.TryAcquire(ctx, "node-b/c2"); err != nil || g.Token != 5 {
		t.Fatalf("re-acquisition: want token 5, got %+v, %v", g, err)
	}
	if r, _ := f.record(); r.Report != want {
		t.Fatalf("report after the re-acquisition: want %+v, got %+v", want, r.Report)
	}
}

// result is one Acquire call run in the background.
type result struct {
	g   Grant
	err error
}

func acquireInBackground(ctx context.Context, l *Lock, holder string) <-chan result {
	done := make(chan result, 1)
	go func() {
		g, err := l.Acquire(ctx, holder)
		done <- result{g, err}
	}()
	return done
}

// nextWait returns once the background Acquire sleeps on the fake clock or
// has finished; ok is false in the latter case.
func nextWait(c *clocktesting.FakeClock, done <-chan result) (r result, finished bool) {
	for !c.HasWaiters() {
		select {
		case r := <-done:
			return r, true
		case <-time.After(time.Millisecond):
		}
	}
	return result{}, false
}

// heldByA is a lease in a fake store that node-a/c1 holds through a.
func heldByA(t *testing.T) (*fakeStore, *clocktesting.FakeClock, *Lock, Grant) {
	t.Helper()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	a := newLock(t, f, c, "")
	ga, err := a.Acquire(context.Background(), "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	return f, c, a, ga
}

func TestAcquireWaitsUntilTheHolderReleases(t *testing.T) {
	ctx := context.Background()
	f, c, a, ga := heldByA(t)
	done := acquireInBackground(ctx, newLock(t, f, c, ""), "node-b/c2")
	if r, finished := nextWait(c, done); finished {
		t.Fatalf("acquired a held lease: %+v", r)
	}
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	for {
		c.Step(time.Second)
		if r, finished := nextWait(c, done); finished {
			if r.err != nil || r.g != (Grant{"node-b/c2", 2}) {
				t.Fatalf("want token 2, got %+v", r)
			}
			if c.Since(epoch) >= lease {
				t.Errorf("a released lease is taken without waiting for expiry, took %v", c.Since(epoch))
			}
			return
		}
	}
}

func TestAcquireTakesOverACrashedHolderOnlyOnceTheLeaseDurationPassed(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	if _, err := newLock(t, f, c, "").Acquire(ctx, "node-a/c1"); err != nil {
		t.Fatal(err)
	}
	done := acquireInBackground(ctx, newLock(t, f, c, ""), "node-b/c2")
	for {
		r, finished := nextWait(c, done)
		if finished {
			if r.err != nil || r.g.Token != 2 {
				t.Fatalf("want token 2, got %+v", r)
			}
			if c.Since(epoch) < lease {
				t.Fatalf("taken over after %v, before the lease duration %v", c.Since(epoch), lease)
			}
			return
		}
		if rec, _ := f.record(); rec.HolderIdentity != "node-a/c1" {
			t.Fatalf("lease changed hands before Acquire returned: %+v", rec)
		}
		c.Step(300 * time.Millisecond)
	}
}

func TestAcquireGivesUpWithAnErrorNamingTheCurrentHolder(t *testing.T) {
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	if _, err := newLock(t, f, c, "").Acquire(context.Background(), "node-a/c1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := newLock(t, f, c, "").Acquire(ctx, "node-b/c2")
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) || !errors.Is(err, context.Canceled) {
		t.Fatalf("want a *HeldError that is ErrHeld and context.Canceled, got %v", err)
	}
	if held.Holder != "node-a/c1" || held.Token != 1 || !strings.Contains(err.Error(), "node-a/c1") {
		t.Errorf("the error must name holder node-a/c1 with token 1: %+v, %q", held, err)
	}
	if rec, _ := f.record(); rec.HolderIdentity != "node-a/c1" {
		t.Errorf("giving up must change nothing, lease is %+v", rec)
	}
}

func TestGetReadsAMissingLeaseAsFree(t *testing.T) {
	f := newFakeStore(t)
	l := newLock(t, f, clocktesting.NewFakeClock(epoch), "")
	r, err := l.Get(context.Background())
	if err != nil || r != (Record{}) {
		t.Fatalf("want the zero record, got %+v, %v", r, err)
	}
}

func TestBadInputIsRefusedBeforeAnyAPICall(t *testing.T) {
	f := newFakeStore(t)
	f.expect = []string{}
	l := newLock(t, f, clocktesting.NewFakeClock(epoch), "")
	ctx := context.Background()
	if _, err := l.Acquire(ctx, ""); err == nil {
		t.Error("Acquire with an empty holder: want an error")
	}
	for _, g := range []Grant{{}, {Holder: "node-a/c1"}, {Token: 1}} {
		if err := l.Renew(ctx, g); err == nil || errors.Is(err, ErrLost) {
			t.Errorf("Renew(%+v): want a plain error, got %v", g, err)
		}
		if err := l.Release(ctx, g); err == nil || errors.Is(err, ErrLost) {
			t.Errorf("Release(%+v): want a plain error, got %v", g, err)
		}
		if err := l.SetAvailable(ctx, g.Holder, g.Token, true, ""); err == nil || errors.Is(err, ErrLost) {
			t.Errorf("SetAvailable(%+v): want a plain error, got %v", g, err)
		}
	}
	for _, reason := range []string{"shutting down", "1Booting", "Booting:", strings.Repeat("A", 1025)} {
		if err := l.SetAvailable(ctx, "node-a/c1", 1, false, reason); err == nil || errors.Is(err, ErrLost) {
			t.Errorf("SetAvailable with reason %.20q: want a plain error, got %v", reason, err)
		}
	}
}

func TestNewRejectsTimingThatCannotWork(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no lease duration", Options{}, "lease duration"},
		{"a lease duration under a second", Options{LeaseDuration: 500 * time.Millisecond}, "lease duration"},
		{"a lease duration in fractions of a second", Options{LeaseDuration: 1500 * time.Millisecond}, "whole number of seconds"},
		{"a negative retry period", Options{LeaseDuration: lease, RetryPeriod: -time.Second}, "retry period"},
		{"a retry period over the lease duration", Options{LeaseDuration: lease, RetryPeriod: lease + time.Second}, "exceeds the lease duration"},
		{"a report reason that is no condition reason", Options{LeaseDuration: lease, ReportAvailable: true, ReportReason: "up and running"}, "report reason"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewWithStore(newFakeStore(t), "ns/name", tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want an error about %q, got %v", tt.want, err)
			}
		})
	}
	if _, err := New(nil, "ns", "name", Options{LeaseDuration: lease}); err == nil {
		t.Error("New without a client: want an error")
	}
	if _, err := NewWithStore(newFakeStore(t), "ns/name", Options{LeaseDuration: lease}); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

func TestAWaitingAcquireLearnsOfTheReleaseFromItsWatchWithoutWaitingForAPoll(t *testing.T) {
	ctx := context.Background()
	f, c, a, ga := heldByA(t)
	f.mu.Lock()
	f.calls = nil
	f.mu.Unlock()
	done := acquireInBackground(ctx, newLock(t, watchingFake{fakeStore: f}, c, ""), "node-b/c2")
	if r, finished := nextWait(c, done); finished {
		t.Fatalf("acquired a held lease: %+v", r)
	}
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	// The clock stands still: only the watch can end the wait.
	select {
	case r := <-done:
		if r.err != nil || r.g != (Grant{"node-b/c2", 2}) {
			t.Fatalf("want token 2, got %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not end the wait without the clock moving")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// The waiter's get, its watch, the release's get and update, the
	// waiter's update: it decides from the lease its watch reported.
	if want := []string{"get", "watch", "get", "update", "update"}; !slices.Equal(f.calls, want) {
		t.Errorf("calls %v, want %v", f.calls, want)
	}
}

func TestAcquireWhoseWatchFailsPollsInstead(t *testing.T) {
	ctx := context.Background()
	f, c, a, ga := heldByA(t)
	done := acquireInBackground(ctx, newLock(t, watchingFake{fakeStore: f, fail: true}, c, ""), "node-b/c2")
	if r, finished := nextWait(c, done); finished {
		t.Fatalf("acquired a held lease: %+v", r)
	}
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	for {
		c.Step(time.Second)
		if r, finished := nextWait(c, done); finished {
			if r.err != nil || r.g != (Grant{"node-b/c2", 2}) {
				t.Fatalf("want token 2, got %+v", r)
			}
			if c.Since(epoch) >= lease {
				t.Errorf("the released lease was taken only after %v", c.Since(epoch))
			}
			return
		}
	}
}

func TestAWatchingAcquireStillTakesOverACrashedHolderOnceTheLeaseDurationPassed(t *testing.T) {
	ctx := context.Background()
	f := newFakeStore(t)
	c := clocktesting.NewFakeClock(epoch)
	if _, err := newLock(t, f, c, "").Acquire(ctx, "node-a/c1"); err != nil {
		t.Fatal(err)
	}
	done := acquireInBackground(ctx, newLock(t, watchingFake{fakeStore: f}, c, ""), "node-b/c2")
	for {
		r, finished := nextWait(c, done)
		if finished {
			if r.err != nil || r.g.Token != 2 {
				t.Fatalf("want token 2, got %+v", r)
			}
			if c.Since(epoch) < lease {
				t.Fatalf("taken over after %v, before the lease duration %v", c.Since(epoch), lease)
			}
			return
		}
		c.Step(time.Second)
	}
}

func TestAnObjectBackedLockLabelsItsLeaseAndNeverTakesAPredecessorsOfAnotherUID(t *testing.T) {
	ctx := context.Background()
	c := clocktesting.NewFakeClock(epoch)
	mine := Identity{Namespace: "tenant-a", UID: "uid-2"}
	lock := func(f *fakeStore, id Identity) *Lock {
		l, err := NewWithStore(f, "galactic-system/blue-1.web-0-2", Options{LeaseDuration: lease, Clock: c, Identity: id})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	f := newFakeStore(t)
	l := lock(f, mine)
	g, err := l.TryAcquire(ctx, "node-a/c1")
	if err != nil || g.Token != 1 {
		t.Fatalf("a fresh lease: %+v, %v", g, err)
	}
	if r, _ := f.record(); r.Identity != mine {
		t.Fatalf("the created lease carries identity %+v, want %+v", r.Identity, mine)
	}
	// galactic-gc renews from a node record with an inline Lock: the
	// identity stays.
	if err := lock(f, Identity{}).Renew(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.record(); r.Identity != mine || r.HolderIdentity != "" {
		t.Fatalf("a released lease keeps its identity: %+v", r)
	}
	// An inline Lock never takes an object's lease, free as it is.
	var herr *HeldError
	if _, err := lock(f, Identity{}).TryAcquire(ctx, "node-a/c2"); !errors.As(err, &herr) || herr.Predecessor == nil || herr.Predecessor.UID != "uid-2" {
		t.Fatalf("an inline Lock on an object's lease: want a HeldError naming UID uid-2, got %v", err)
	}

	// A predecessor's lease (another UID): not taken, free or expired,
	// not renewed or released; nothing is written.
	for _, rec := range []*Record{
		{LeaseDurationSeconds: 10, LeaseTransitions: 7, Identity: Identity{Namespace: "tenant-a", UID: "uid-1"}},
		held("node-b/c9", 7),
	} {
		f := newFakeStore(t)
		r := *rec
		r.Identity = Identity{Namespace: "tenant-a", UID: "uid-1"}
		f.put(r)
		f.expect = []string{"get", "get", "get", "get"}
		l := lock(f, mine)
		_, err := l.TryAcquire(ctx, "node-a/c1")
		if !errors.As(err, &herr) || herr.Predecessor == nil || !strings.Contains(err.Error(), `UID "uid-1"`) {
			t.Fatalf("a predecessor's lease %+v: want a HeldError naming UID uid-1, got %v", r, err)
		}
		c.Step(2 * lease)
		if _, err := l.TryAcquire(ctx, "node-a/c1"); !errors.As(err, &herr) {
			t.Fatalf("a predecessor's lease unrenewed for twice its duration was taken: %v", err)
		}
		if err := l.Renew(ctx, Grant{"node-b/c9", 7}); !errors.Is(err, ErrLost) {
			t.Fatalf("renewing a predecessor's lease: want ErrLost, got %v", err)
		}
		if err := l.SetAvailable(ctx, "node-b/c9", 7, true, ""); !errors.Is(err, ErrLost) {
			t.Fatalf("reporting on a predecessor's lease: want ErrLost, got %v", err)
		}
		if got, _ := f.record(); !reflect.DeepEqual(got, r) {
			t.Fatalf("the predecessor's lease changed: %+v -> %+v", r, got)
		}
	}

	// An inline lease (adoption) is taken and labelled.
	f = newFakeStore(t)
	f.put(Record{LeaseDurationSeconds: 10, LeaseTransitions: 4})
	if g, err := lock(f, mine).TryAcquire(ctx, "node-a/c1"); err != nil || g.Token != 5 {
		t.Fatalf("an inline lease: %+v, %v", g, err)
	}
	if r, _ := f.record(); r.Identity != mine {
		t.Fatalf("the adopted lease carries identity %+v", r.Identity)
	}
	if _, err := NewWithStore(f, "ns/name", Options{LeaseDuration: lease, Identity: Identity{UID: "u"}}); err == nil {
		t.Fatal("an identity without a namespace was accepted")
	}
}

func TestAnAttemptFromAStaleWatchReportReadsTheLeaseAgainAndSeesItsNewHolder(t *testing.T) {
	ctx := context.Background()
	f, c, a, ga := heldByA(t)
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	// What a waiter's watch reported: the release.
	f.mu.Lock()
	released := f.cur
	f.mu.Unlock()
	// Another node takes the lease before the waiter acts on the report.
	if _, err := newLock(t, f, c, "").Acquire(ctx, "node-c/c3"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.calls = nil
	f.mu.Unlock()
	_, err := newLock(t, f, c, "").attempt(ctx, "node-b/c2", &released)
	var h *HeldError
	if !errors.As(err, &h) || h.Holder != "node-c/c3" || h.Token != 2 {
		t.Fatalf("want the lease held by node-c/c3 with token 2, got %v", err)
	}
	f.mu.Lock()
	calls := f.calls
	f.mu.Unlock()
	// The update from the report conflicts; the lease read after it
	// decides.
	if want := []string{"update", "get"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if r, _ := f.record(); r.HolderIdentity != "node-c/c3" {
		t.Errorf("the lease's holder is %q, want node-c/c3", r.HolderIdentity)
	}
}

func TestAReleaseFromALeaseReadEarlierIsOneWriteAndRereadsALeaseChangedSince(t *testing.T) {
	ctx := context.Background()
	c := clocktesting.NewFakeClock(epoch)
	for _, tc := range []struct {
		name string
		// between runs after the Read, as the holder's own renewal would.
		between   func(l *Lock, g Grant) error
		wantCalls []string
	}{
		{name: "unchanged", between: func(*Lock, Grant) error { return nil }, wantCalls: []string{"get", "update"}},
		{name: "renewed since", between: func(l *Lock, g Grant) error { return l.Renew(ctx, g) }, wantCalls: []string{"get", "get", "update", "update", "get", "update"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeStore(t)
			l := newLock(t, f, c, "")
			g, err := l.Acquire(ctx, "node-a/c1")
			if err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			f.calls = nil
			f.mu.Unlock()
			seen, err := l.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.between(l, g); err != nil {
				t.Fatal(err)
			}
			if err := l.ReleaseFrom(ctx, g, &seen); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			calls := f.calls
			f.mu.Unlock()
			if !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("calls %v, want %v", calls, tc.wantCalls)
			}
			if r, _ := f.record(); r.HolderIdentity != "" || r.LeaseTransitions != 1 {
				t.Errorf("after the release: holder %q token %d, want free with token 1", r.HolderIdentity, r.LeaseTransitions)
			}
		})
	}
}

// A lease read while the caller did other work is taken with one write; a
// lease changed since that read conflicts and the lease is read again.
func TestAnAcquireFromALeaseReadEarlierIsOneWriteAndRereadsALeaseChangedSince(t *testing.T) {
	ctx := context.Background()
	f, c, a, ga := heldByA(t)
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	b := newLock(t, f, c, "")
	seen, err := b.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.calls = nil
	f.mu.Unlock()
	g, err := b.AcquireFrom(ctx, "node-b/c2", &seen)
	if err != nil || g.Token != 2 {
		t.Fatalf("grant %+v, %v; want token 2", g, err)
	}
	f.mu.Lock()
	calls := f.calls
	f.calls = nil
	f.mu.Unlock()
	if want := []string{"update"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}

	// Read free, then another takes it: the write from the stale read
	// conflicts, and the lease read after it says who holds it.
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	stale, err := b.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newLock(t, f, c, "").Acquire(ctx, "node-c/c3"); err != nil {
		t.Fatal(err)
	}
	_, err = newLock(t, f, c, "").TryAcquireFrom(ctx, "node-d/c4", &stale)
	var h *HeldError
	if !errors.As(err, &h) || h.Holder != "node-c/c3" {
		t.Fatalf("want the lease held by node-c/c3, got %v", err)
	}
}
