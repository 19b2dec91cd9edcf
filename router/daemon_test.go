package router

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/speaker"
)

// fakeSpeaker records what the daemon asks of its speaker, in order.
type fakeSpeaker struct {
	mu    sync.Mutex
	opts  speaker.Options
	calls []string
	ann   []speaker.Route
}

func (f *fakeSpeaker) start(_ context.Context, o speaker.Options) (speaker.Speaker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opts = o
	f.calls = append(f.calls, "start")
	return f, nil
}

func (f *fakeSpeaker) Announce(_ context.Context, r speaker.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	kind := "announce"
	if r.Drained {
		kind = "announce-drained"
	}
	f.calls = append(f.calls, kind+" "+r.Key().String())
	f.ann = append(f.ann, r)
	return nil
}

func (f *fakeSpeaker) Withdraw(_ context.Context, k speaker.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "withdraw "+k.String())
	return nil
}

func (f *fakeSpeaker) Peers(context.Context) ([]speaker.PeerState, error) { return nil, nil }

func (f *fakeSpeaker) Rejected(context.Context) ([]speaker.Received, error) { return nil, nil }

func (f *fakeSpeaker) SetMembership(context.Context, []speaker.RouteTarget) error { return nil }

func (f *fakeSpeaker) RTCPeers(context.Context) ([]netip.Addr, error) { return nil, nil }

func (f *fakeSpeaker) Stop(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "stop")
	return nil
}

func (f *fakeSpeaker) snapshot() (speaker.Options, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opts, append([]string(nil), f.calls...)
}

// emptyAPI is an API server with no advertisements that never changes.
type emptyAPI struct{}

func (emptyAPI) List(context.Context, metav1.ListOptions) (*v1alpha1.BGPAdvertisementList, error) {
	return &v1alpha1.BGPAdvertisementList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
}

func (emptyAPI) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return watch.NewFake(), nil
}

func (emptyAPI) UpdateStatus(_ context.Context, a *v1alpha1.BGPAdvertisement, _ metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error) {
	return a, nil
}

func testDaemonConfig(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(`{"asn": 65000, "underlay": "192.0.2.11", "listenPort": -1,
		"peers": [{"address": "192.0.2.1", "asn": 65000}], "metricsAddress": ""}`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startDaemon runs a daemon on the fake speaker with the given boot ID
// until the test ends.
func startDaemon(t *testing.T, stateDir, boot string, fs *fakeSpeaker) *Daemon {
	t.Helper()
	d, err := New(Options{
		Config: testDaemonConfig(t), Node: "node-a", Namespace: "galactic", StateDir: stateDir,
		Adverts: emptyAPI{}, Live: func(string) bool { return true },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Resync: time.Hour,
		Speaker: fs.start, BootID: func() (string, error) { return boot, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	d.kernel.remove, d.watch.off = func() error { return nil }, true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

func savedRoute() speaker.Route {
	return speaker.Route{RD: speaker.RD{Admin: netip.MustParseAddr("192.0.2.11"), Assigned: 1}, Prefix: netip.MustParsePrefix("10.20.0.5/32"),
		VNI: 10100, RTASN: 65000, NextHop: netip.MustParseAddr("192.0.2.11"), RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, 11}, Generation: 3}
}

func writeSaved(t *testing.T, dir, boot string, cfg *config.Config) {
	t.Helper()
	if err := NewStore(dir).Save(Saved{RDs: map[string]uint16{"blue": 1}, VNIs: map[string]uint32{},
		Paths: []SavedPath{savedPath(savedRoute())}, BootID: boot, Identity: Identity(cfg)}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestARestartOfTheSameBootReplaysTheSavedPathsWithTheRestartBits(t *testing.T) {
	dir := t.TempDir()
	writeSaved(t, dir, "boot-1", testDaemonConfig(t))
	fs := &fakeSpeaker{}
	startDaemon(t, dir, "boot-1", fs)
	waitFor(t, "the saved path re-announced", func() bool { _, calls := fs.snapshot(); return len(calls) >= 2 })
	o, calls := fs.snapshot()
	if !o.Restarting {
		t.Error("a restart of the same boot and identity did not set the restart bits")
	}
	if calls[0] != "start" || calls[1] != "announce "+savedRoute().Key().String() {
		t.Errorf("calls %v: want the saved path announced right after the start", calls)
	}
}

func TestARebootStartsFreshWithoutRestartBitsOrReplay(t *testing.T) {
	dir := t.TempDir()
	writeSaved(t, dir, "boot-1", testDaemonConfig(t))
	fs := &fakeSpeaker{}
	startDaemon(t, dir, "boot-2", fs)
	// The first pass with the API answering saves this boot's state.
	waitFor(t, "the state saved for the new boot", func() bool {
		s, ok, err := NewStore(dir).Load()
		return err == nil && ok && s.BootID == "boot-2"
	})
	o, calls := fs.snapshot()
	if o.Restarting {
		t.Error("a reboot set the restart bits")
	}
	for _, c := range calls {
		if c != "start" {
			t.Errorf("a reboot asked the speaker to %s", c)
		}
	}
	s, _, _ := NewStore(dir).Load()
	if len(s.Paths) != 0 || s.RDs["blue"] != 1 {
		t.Errorf("saved after the reboot: paths %v (want none), RDs %v (want kept)", s.Paths, s.RDs)
	}
}

func TestAChangedIdentityStartsFresh(t *testing.T) {
	dir := t.TempDir()
	other := testDaemonConfig(t)
	other.RouterID = netip.MustParseAddr("192.0.2.99")
	writeSaved(t, dir, "boot-1", other)
	fs := &fakeSpeaker{}
	startDaemon(t, dir, "boot-1", fs)
	waitFor(t, "the state saved for the new identity", func() bool {
		s, ok, err := NewStore(dir).Load()
		return err == nil && ok && s.Identity == Identity(testDaemonConfig(t))
	})
	if o, calls := fs.snapshot(); o.Restarting || len(calls) != 1 {
		t.Errorf("restarting %v, calls %v: want a fresh start", o.Restarting, calls)
	}
}

func TestDrainMarksEveryPathBeforeWithdrawingAndStopsLast(t *testing.T) {
	drainSpacing = 0
	dir := t.TempDir()
	writeSaved(t, dir, "boot-1", testDaemonConfig(t))
	fs := &fakeSpeaker{}
	d := startDaemon(t, dir, "boot-1", fs)
	waitFor(t, "the saved path re-announced", func() bool { _, calls := fs.snapshot(); return len(calls) >= 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	_, calls := fs.snapshot()
	k := savedRoute().Key().String()
	want := []string{"start", "announce " + k, "announce-drained " + k, "withdraw " + k, "stop"}
	if len(calls) != len(want) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Fatalf("calls %v, want %v", calls, want)
		}
	}
	if _, ok, _ := NewStore(dir).Load(); ok {
		t.Error("the saved state survived the drain")
	}
}

func TestOnlyEstablishedTransitionsOfAPeerStartAPass(t *testing.T) {
	fs := &fakeSpeaker{}
	d := startDaemon(t, t.TempDir(), "boot-1", fs)
	waitFor(t, "the speaker started", func() bool { o, _ := fs.snapshot(); return o.OnEvent != nil })
	o, _ := fs.snapshot()
	passes := func() int64 { return d.metrics.lastPass.Load() }
	// A pass after each of these: synced, then the session lost.
	for _, e := range []speaker.Event{up("192.0.2.1"), eor("192.0.2.1"), down("192.0.2.1", "IDLE")} {
		before := passes()
		o.OnEvent(e)
		waitFor(t, "a pass after "+e.State.State, func() bool { return passes() != before })
	}
	// Synced and no hold running: the loop sleeps until an event. A peer
	// that keeps failing to connect must not wake it.
	before := passes()
	for i := 0; i < 50; i++ {
		o.OnEvent(down("192.0.2.1", []string{"CONNECT", "ACTIVE", "OPENSENT", "IDLE"}[i%4]))
	}
	time.Sleep(200 * time.Millisecond)
	if passes() != before {
		t.Error("state changes between non-established states ran a pass")
	}
}

// A list or watch that cannot reach the API server is retried until it
// can, so the informer never backs off; an answer from the server, even an
// error, is returned at once, and so is the end of the context.
func TestListsAndWatchesAreRetriedUntilTheAPIServerAnswers(t *testing.T) {
	ctx := context.Background()
	calls := 0
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	v, err := untilReached(ctx, clock.RealClock{}, time.Millisecond, func(context.Context) (int, error) {
		calls++
		switch calls {
		case 1:
			return 0, refused
		case 2:
			return 0, apierrors.NewServiceUnavailable("starting")
		}
		return 7, nil
	})
	if v != 7 || err != nil || calls != 3 {
		t.Fatalf("got %d, %v after %d calls", v, err, calls)
	}
	calls = 0
	_, err = untilReached(ctx, clock.RealClock{}, time.Millisecond, func(context.Context) (int, error) {
		calls++
		return 0, apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "x", errors.New("no"))
	})
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Fatalf("a refusal by the server: %v after %d calls", err, calls)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := untilReached(cctx, clock.RealClock{}, time.Hour, func(context.Context) (int, error) { return 0, refused }); err == nil {
		t.Fatal("an ended context still retried")
	}
}

// While the API server cannot be reached a list or watch is asked again
// every interval of the clock, not sooner.
func TestAnUnreachableAPIServerIsAskedAgainEveryInterval(t *testing.T) {
	clk := testingclock.NewFakeClock(epoch)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	var calls atomic.Int32
	done := make(chan error, 1)
	go func() {
		_, err := untilReached(context.Background(), clk, reconnectEvery, func(context.Context) (int, error) {
			if calls.Add(1) < 3 {
				return 0, refused
			}
			return 1, nil
		})
		done <- err
	}()
	for want := int32(1); want <= 2; want++ {
		waitFor(t, "the call waiting for the clock", func() bool { return calls.Load() == want && clk.HasWaiters() })
		clk.Step(reconnectEvery - time.Millisecond)
		if !clk.HasWaiters() || calls.Load() != want {
			t.Fatalf("asked again %d times before the interval passed", calls.Load()-1)
		}
		clk.Step(time.Millisecond)
	}
	if err := <-done; err != nil || calls.Load() != 3 {
		t.Fatalf("%v after %d calls, want the third answered", err, calls.Load())
	}
}

// TestAnExportLooksAtANetnsSeenAliveAtMostOnceASecond: the exports each
// ADD starts check only the entries not seen alive within liveEvery, and
// a netns not seen alive is checked every time.
func TestAnExportLooksAtANetnsSeenAliveAtMostOnceASecond(t *testing.T) {
	checks := map[string]int{}
	e := &exportStage{exists: func(p string) bool { checks[p]++; return p == "/live" }}
	t0 := time.Unix(1000, 0)
	for _, at := range []time.Duration{0, 300 * time.Millisecond, 900 * time.Millisecond, time.Second, 1500 * time.Millisecond} {
		live := e.live(t0.Add(at))
		if !live("/live") || !live("/live") || live("/gone") {
			t.Fatalf("at %s: the liveness answers changed", at)
		}
	}
	// Seen at 0 and again at 1 s, when the first sighting had aged out.
	if checks["/live"] != 2 || checks["/gone"] != 5 {
		t.Fatalf("netns checks: %v, want /live twice and /gone at every export", checks)
	}
}
