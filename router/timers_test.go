package router

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/netnstest"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/speaker"
)

// loopClock is a fake clock that hands the test the end of every pass:
// the loop resets its timer once per pass, and a reset waits until the
// test lets the loop go on. Between two passes the test alone touches the
// daemon, and whatever it does there (events, clock steps) the next pass
// sees.
type loopClock struct {
	*testingclock.FakeClock
	waits  chan time.Duration
	resume chan struct{}
	stop   chan struct{}
	frozen bool
}

func newLoopClock() *loopClock {
	return &loopClock{FakeClock: testingclock.NewFakeClock(epoch), waits: make(chan time.Duration),
		resume: make(chan struct{}), stop: make(chan struct{})}
}

func (c *loopClock) NewTimer(d time.Duration) clock.Timer {
	return &loopTimer{Timer: c.FakeClock.NewTimer(d), c: c}
}

type loopTimer struct {
	clock.Timer
	c *loopClock
}

func (t *loopTimer) Reset(d time.Duration) bool {
	active := t.Timer.Reset(d)
	select {
	case t.c.waits <- d:
	case <-t.c.stop:
		return active
	}
	select {
	case <-t.c.resume:
	case <-t.c.stop:
	}
	return active
}

// pass lets the loop go on and returns how long it sleeps after its next
// pass, unless an event comes first.
func (c *loopClock) pass(t *testing.T) time.Duration {
	t.Helper()
	if c.frozen {
		c.resume <- struct{}{}
	}
	select {
	case w := <-c.waits:
		c.frozen = true
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("no pass within 10 s")
		return 0
	}
}

// fixedAPI is an API server holding the given advertisements, unchanging.
type fixedAPI struct{ items []v1alpha1.BGPAdvertisement }

func (a fixedAPI) List(context.Context, metav1.ListOptions) (*v1alpha1.BGPAdvertisementList, error) {
	return &v1alpha1.BGPAdvertisementList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: slices.Clone(a.items)}, nil
}

// Watch streams the items and the end of the initial events when asked
// to, as the informers do (WatchListClient), and nothing after.
func (a fixedAPI) Watch(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	w := watch.NewFakeWithChanSize(len(a.items)+1, false)
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		for i := range a.items {
			w.Add(a.items[i].DeepCopy())
		}
		w.Action(watch.Bookmark, &v1alpha1.BGPAdvertisement{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1",
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	}
	return w, nil
}

func (fixedAPI) UpdateStatus(_ context.Context, a *v1alpha1.BGPAdvertisement, _ metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error) {
	return a, nil
}

const (
	timedPeer = "192.0.2.1"
	timedVNI  = 10100
)

// timedNode is a router of VPC blue in a test namespace, on a fake clock
// and a fake speaker.
type timedNode struct {
	t        *testing.T
	clock    *loopClock
	d        *Daemon
	fs       *fakeSpeaker
	stateDir string
	table    int
	// wait is how long the loop sleeps after its last pass.
	wait time.Duration
}

// newTimedNode makes the namespace's underlay and blue's routing domain.
func newTimedNode(t *testing.T) *timedNode {
	underlayUp(t)
	dom, _, err := routing.Ensure("blue", routing.KindTable)
	if err != nil {
		t.Fatal(err)
	}
	return &timedNode{t: t, stateDir: t.TempDir(), table: dom.Table}
}

// start runs a router with withdrawHoldSeconds hold and staleRoutesSeconds
// stale until the test ends or stop is called, its loop on a thread of
// the test's namespace, and returns stop.
func (n *timedNode) start(hold, stale int) (stop func()) {
	t := n.t
	cfg, err := config.Parse(fmt.Appendf(nil, `{"asn": 65000, "underlay": %q, "listenPort": -1, "peers": [{"address": %q, "asn": 65000}],
		"withdrawHoldSeconds": %d, "staleRoutesSeconds": %d, "metricsAddress": ""}`, benchUnderlay, timedPeer, hold, stale))
	if err != nil {
		t.Fatal(err)
	}
	clk := newLoopClock()
	n.clock, n.fs = clk, &fakeSpeaker{}
	adv := advert("web-0", "blue", timedVNI, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, entry("c1", "/live/c1", 1))
	n.d, err = New(Options{
		Config: cfg, Node: "node-a", Namespace: "galactic", StateDir: n.stateDir,
		Adverts: fixedAPI{items: []v1alpha1.BGPAdvertisement{*adv}}, Live: func(string) bool { return true },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Resync: time.Hour,
		Speaker: n.fs.start, BootID: func() (string, error) { return "boot-1", nil }, Clock: n.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.d.kernel.remove, n.d.watch.off = func() error { return nil }, true
	here, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer here.Close()
		// The thread stays in the namespace and ends with the goroutine.
		runtime.LockOSThread()
		if err := netns.Set(here); err != nil {
			t.Error(err)
			return
		}
		if err := n.d.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			close(clk.stop)
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// until runs passes, each kicked, until ok holds after one: the informers
// sync in their own time.
func (n *timedNode) until(what string, ok func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if i > 0 {
			n.d.trigger()
		}
		n.pass()
		if ok() {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("not within 10 s: %s", what)
		}
	}
}

func (n *timedNode) pass() time.Duration {
	n.wait = n.clock.pass(n.t)
	return n.wait
}

// event hands the loop a speaker event and returns how long the loop
// sleeps after the pass it starts.
func (n *timedNode) event(ev speaker.Event) time.Duration {
	n.fs.snapshotOpts().OnEvent(ev)
	return n.pass()
}

// step moves the clock by d and returns after the pass the loop's timer
// starts, or after a kicked one when d is shorter than the loop's sleep.
func (n *timedNode) step(d time.Duration) {
	n.clock.Step(d)
	if d < n.wait {
		n.d.trigger()
	}
	n.pass()
}

var (
	remoteVTEP = netip.MustParseAddr("192.0.2.21")
	remoteMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x21}
)

func remotePath(prefix string) speaker.Received {
	return speaker.Received{Route: speaker.Route{
		RD: speaker.RD{Admin: remoteVTEP, Assigned: 1}, Prefix: netip.MustParsePrefix(prefix), VNI: timedVNI, RTASN: 65000,
		NextHop: remoteVTEP, RouterMAC: remoteMAC, Generation: 1,
	}, Targets: []speaker.RouteTarget{{ASN: 65000, Value: timedVNI}}}
}

// installed says whether blue's table holds the router's route to prefix.
func (n *timedNode) installed(prefix string) bool {
	n.t.Helper()
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: n.table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		n.t.Fatal(err)
	}
	return slices.ContainsFunc(rs, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == prefix })
}

// learn brings the session up, sends prefix and End-of-RIB, and waits
// until the route is installed.
func (n *timedNode) learn(prefix string) {
	n.t.Helper()
	n.until("the API synced and blue's device made", func() bool { return n.d.api.synced() && len(n.d.kernel.synced) == 1 })
	n.event(up(timedPeer))
	n.event(paths(timedPeer, remotePath(prefix)))
	if wait := n.event(eor(timedPeer)); wait != time.Hour {
		n.t.Fatalf("synced and with nothing held the loop sleeps %s, want the resync (1h)", wait)
	}
	if !n.installed(prefix) {
		n.t.Fatalf("%s is not installed after the peer's End-of-RIB", prefix)
	}
}

func (fs *fakeSpeaker) snapshotOpts() speaker.Options {
	o, _ := fs.snapshot()
	return o
}

func TestAWithdrawnRouteIsHeldForTheWithdrawalHoldThenRemoved(t *testing.T) {
	netnstest.Run(t, func() {
		n := newTimedNode(t)
		n.start(10, 3600)
		n.learn("10.20.0.7/32")
		wait := n.event(paths(timedPeer, withdrawn(remotePath("10.20.0.7/32"))))
		if want := 10*time.Second + 10*time.Millisecond; wait != want {
			t.Fatalf("after the withdrawal the loop sleeps %s, want until the hold ends (%s)", wait, want)
		}
		n.step(9 * time.Second)
		if !n.installed("10.20.0.7/32") {
			t.Fatal("the withdrawn route went before its hold ended")
		}
		n.step(wait - 9*time.Second)
		if n.installed("10.20.0.7/32") {
			t.Fatal("the withdrawn route is still installed after its hold")
		}
	})
}

func TestALostSessionsRoutesStayUntilStaleRoutesSecondsThenGo(t *testing.T) {
	netnstest.Run(t, func() {
		n := newTimedNode(t)
		n.start(0, 60)
		n.learn("10.20.0.7/32")
		wait := n.event(down(timedPeer, "IDLE"))
		if want := 60*time.Second + 10*time.Millisecond; wait != want {
			t.Fatalf("after the session went down the loop sleeps %s, want until the stale bound ends (%s)", wait, want)
		}
		n.step(59 * time.Second)
		if !n.installed("10.20.0.7/32") {
			t.Fatal("the lost session's route went before staleRoutesSeconds")
		}
		n.step(wait - 59*time.Second)
		if n.installed("10.20.0.7/32") {
			t.Fatal("the lost session's route is still installed after staleRoutesSeconds")
		}
	})
}

// A restarted router keeps the routes it finds in the kernel until its
// peer's End-of-RIB; a peer that sends none is waited for 30 s.
func TestARestartKeepsTheKernelsRoutesUntilThePeersEndOfRIBOr30Seconds(t *testing.T) {
	netnstest.Run(t, func() {
		n := newTimedNode(t)
		stop := n.start(0, 3600)
		n.learn("10.20.0.7/32")
		stop()

		n.start(0, 3600)
		n.until("the API synced and blue's device made", func() bool { return n.d.api.synced() && len(n.d.kernel.synced) == 1 })
		// The session comes back and sends another route, but no End-of-RIB.
		n.event(up(timedPeer))
		wait := n.event(paths(timedPeer, remotePath("10.20.0.8/32")))
		if wait != time.Second {
			t.Fatalf("waiting for the RIB the loop sleeps %s, want 1 s", wait)
		}
		if !n.installed("10.20.0.7/32") || !n.installed("10.20.0.8/32") {
			t.Fatal("the kernel's route or the new one is missing before the RIB is synced")
		}
		n.step(29 * time.Second)
		if !n.installed("10.20.0.7/32") {
			t.Fatal("the kernel's route went before the 30 s End-of-RIB wait")
		}
		n.step(time.Second)
		if n.installed("10.20.0.7/32") || !n.installed("10.20.0.8/32") {
			t.Fatal("after the 30 s End-of-RIB wait: want the route the peer did not send again removed, its new one kept")
		}
	})
}

// With no End-of-RIB at all (no reflector answers) a restarted router
// keeps what it found in the kernel until staleRoutesSeconds, however
// long past the 30 s wait.
func TestARestartWithoutAnyPeerKeepsTheKernelsRoutesUntilTheStaleBound(t *testing.T) {
	netnstest.Run(t, func() {
		n := newTimedNode(t)
		stop := n.start(0, 60)
		n.learn("10.20.0.7/32")
		stop()

		n.start(0, 60)
		n.until("the API synced and blue's device made", func() bool { return n.d.api.synced() && len(n.d.kernel.synced) == 1 })
		n.step(59 * time.Second)
		if !n.installed("10.20.0.7/32") {
			t.Fatal("the kernel's route went before staleRoutesSeconds with no peer at all")
		}
		n.step(time.Second)
		if n.installed("10.20.0.7/32") {
			t.Fatal("the kernel's route is still installed after staleRoutesSeconds with no peer")
		}
	})
}
