package router

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// Judge says whether a lease's current holder, with the given identity
// and token, reports itself available (handoff.Availability).
type Judge func(lease *coordinationv1.Lease, holder string, token int64) (metav1.ConditionStatus, string, string)

// Options are what the daemon runs with.
type Options struct {
	Config    *config.Config
	Node      string
	Namespace string
	StateDir  string
	// Adverts and Leases are the clients of the node's namespace.
	Adverts AdvertClient
	Leases  LeaseClient
	// LeaseSelector selects the leases held by this node's holders.
	LeaseSelector string
	Judge         Judge
	Live          func(netns string) bool
	Log           *slog.Logger
	// Resync bounds how long the kernel goes unchecked without events.
	Resync time.Duration
	// RIBWait is how long a (re)started router waits for every peer's
	// End-of-RIB once one has sent it, and how long an established session
	// may go without one, before routes the RIB does not have are judged.
	RIBWait time.Duration
	// Speaker starts the BGP speaker; nil is GoBGP.
	Speaker func(context.Context, speaker.Options) (speaker.Speaker, error)
	// BootID reads the kernel's boot ID; nil reads BootIDPath.
	BootID func() (string, error)
	// Clock is every time and timer of the daemon; nil is the real clock.
	Clock clock.Clock
}

// BootIDPath is where the kernel tells its boot ID: a new one after every
// boot, the same for every process of one.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// AdvertClient is what the daemon needs of the BGPAdvertisement client.
type AdvertClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.BGPAdvertisementList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	StatusWriter
}

// LeaseClient is what the daemon needs of the Lease client.
type LeaseClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// MetricsHandler serves /metrics, /healthz and /readyz.
func (d *Daemon) MetricsHandler() http.Handler { return d.metrics.Handler(3 * d.o.Resync) }

// Daemon is one node's galactic-router.
type Daemon struct {
	o       Options
	cfg     *config.Config
	log     *slog.Logger
	clock   clock.Clock
	spk     speaker.Speaker
	plane   dataplane.Plane
	metrics *Metrics
	scale   *scaleCollector

	api apiStage
	ids identityCheck
	exp exportStage

	kick     chan struct{}
	drainReq chan chan error

	// mu guards the events the speaker delivered since the last pass
	// took them, and the sessions' last state.
	mu     sync.Mutex
	events []timedEvent
	peerUp map[string]bool

	// Only the loop touches these. The Importer reads the Adj in place.
	adj    Adj
	imp    Importer
	holder Holder
	// ribSize is the RIB view's paths at the last pass, adjCurrent the
	// live sessions' paths the RIB view holds, for the metrics.
	ribSize    atomic.Int64
	adjCurrent atomic.Int64
	start      time.Time
	ribReady   bool
	// deviceErrs are the VPCs whose VXLAN device could not be ensured on
	// the last pass, failures how many passes in a row had one.
	deviceErrs map[string]error
	failures   int
	// synced is what each VPC's kernel state was made at its last sync,
	// vteps the packet filter's last VTEP set: a pass reads and writes
	// only what moved.
	synced   map[string]synced
	vteps    []netip.Addr
	lastFull time.Time
	watch    kernelWatch
	// removeKernel is RemoveKernelState but in unit tests.
	removeKernel func() error
}

// New prepares a daemon; Run starts it.
func New(o Options) (*Daemon, error) {
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.RIBWait <= 0 {
		o.RIBWait = 30 * time.Second
	}
	if o.Speaker == nil {
		o.Speaker = func(ctx context.Context, so speaker.Options) (speaker.Speaker, error) { return speaker.Start(ctx, so) }
	}
	if o.BootID == nil {
		o.BootID = func() (string, error) {
			b, err := os.ReadFile(BootIDPath)
			return strings.TrimSpace(string(b)), err
		}
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	d := &Daemon{
		o: o, cfg: o.Config, log: o.Log, clock: o.Clock,
		plane:        dataplane.Plane{Underlay: o.Config.Underlay, Node: o.Node},
		kick:         make(chan struct{}, 1),
		drainReq:     make(chan chan error),
		adj:          Adj{Stale: o.Config.StaleRoutes, Sync: o.RIBWait},
		deviceErrs:   map[string]error{},
		synced:       map[string]synced{},
		removeKernel: RemoveKernelState,
		holder:       Holder{Hold: o.Config.WithdrawHold},
		imp:          Importer{RTASN: o.Config.RouteTargetASN, RouterID: o.Config.RouterID, Underlay: o.Config.Underlay},
		metrics:      NewMetrics(o.Clock),
	}
	d.imp.Adj = &d.adj
	d.api = apiStage{node: o.Node, namespace: o.Namespace, judge: o.Judge, clock: o.Clock, kick: d.trigger, leaseEvents: d.metrics.leaseEvents}
	d.exp = exportStage{cfg: o.Config, log: o.Log, clock: o.Clock, metrics: d.metrics, store: NewStore(o.StateDir),
		exists: o.Live, deviceMAC: d.plane.DeviceMAC, announced: map[speaker.Key]speaker.Route{},
		status: statusQueue{pending: map[string]statusItem{}, kick: make(chan struct{}, 1)}}
	d.ids = identityCheck{routerID: o.Config.RouterID, underlay: o.Config.Underlay, log: o.Log, clock: o.Clock, metrics: d.metrics}
	d.watch = kernelWatch{log: o.Log, clock: o.Clock, kick: d.trigger, buffer: defaultWatchBuffer}
	d.scale = &scaleCollector{d: d}
	d.metrics.reg.MustRegister(d.scale)
	return d, nil
}

func (d *Daemon) trigger() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// onEvent queues one event of the speaker's stream, in order, for the
// next pass; only events that can change the selection start one.
func (d *Daemon) onEvent(ev speaker.Event) {
	at := d.clock.Now()
	d.mu.Lock()
	d.events = append(d.events, timedEvent{at, ev})
	changed := true
	if ev.Kind == speaker.EventPeer {
		// Only a session's coming up or going down is read by a pass.
		if d.peerUp == nil {
			d.peerUp = map[string]bool{}
		}
		changed = d.peerUp[ev.Peer] != ev.State.Established
		d.peerUp[ev.Peer] = ev.State.Established
	}
	d.mu.Unlock()
	switch ev.Kind {
	case speaker.EventPaths:
		d.metrics.received.Add(float64(len(ev.Paths)))
	case speaker.EventEndOfRIB:
		d.log.Info("End-of-RIB", "peer", ev.Peer)
	case speaker.EventPeer:
		if changed {
			d.log.Info("peer", "address", ev.Peer, "state", ev.State.State, "established", ev.State.Established)
		}
	}
	if changed {
		d.trigger()
	}
}

// timedEvent is a speaker event and when it arrived.
type timedEvent struct {
	at time.Time
	ev speaker.Event
}

// Run serves until ctx ends. It returns without withdrawing anything or
// closing sessions with a Cease, so a restart is graceful; Drain is the
// way to withdraw on purpose.
func (d *Daemon) Run(ctx context.Context) error {
	d.start = d.clock.Now()
	loaded, ok, err := d.exp.store.Load()
	if err != nil {
		return fmt.Errorf("reading the router state: %w", err)
	}
	boot, err := d.o.BootID()
	if err != nil {
		// Without a boot ID a reboot cannot be told from a restart: start
		// fresh rather than replay a previous boot's paths.
		d.log.Warn("reading the boot ID", "path", BootIDPath, "error", err)
	}
	saved, restarting, why := Resume(loaded, ok, boot, Identity(d.cfg))
	d.exp.saved, d.exp.bootID = saved, boot
	if ok && !restarting {
		d.log.Info("starting fresh: the saved state is not this boot's and identity's", "reason", why, "discardedPaths", len(loaded.Paths))
	}
	d.spk, err = d.o.Speaker(ctx, speaker.Options{
		Config: d.cfg, Restarting: restarting && d.cfg.GracefulRestart, Log: d.log, Clock: d.clock,
		OnEvent:    d.onEvent,
		Membership: savedMembership(d.cfg.RouteTargetASN, d.exp.saved.VNIs), RTCPeers: loadRTCPeers(d.o.StateDir),
	})
	if err != nil {
		return err
	}
	d.exp.spk = d.spk
	d.exp.replay(ctx)
	if err := d.seedKernel(); err != nil {
		d.log.Warn("reading the routes installed before this start", "error", err)
	}
	d.log.Info("started", "restarting", restarting, "savedPaths", len(d.exp.saved.Paths), "asn", d.cfg.ASN, "routerID", d.cfg.RouterID, "underlay", d.cfg.Underlay)

	if err := d.api.start(ctx, d.o); err != nil {
		return err
	}
	go d.exp.writeStatus(ctx, d.o.Adverts)
	if !d.watch.off {
		go d.watch.run(ctx)
	}

	timer := d.clock.NewTimer(d.o.Resync)
	defer timer.Stop()
	for {
		wait := d.wait(d.pass(ctx))
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		case <-timer.C():
		case done := <-d.drainReq:
			err := d.drain(ctx)
			done <- err
			return err
		}
	}
}

// wait is how long the loop sleeps after a pass whose next hold or bound
// ends at next, unless an event comes first.
func (d *Daemon) wait(next time.Time) time.Duration {
	wait := d.o.Resync
	if !next.IsZero() {
		wait = min(wait, next.Sub(d.clock.Now())+10*time.Millisecond)
	}
	if !d.ribReady {
		wait = min(wait, time.Second)
	}
	if d.failures > 0 {
		// Local errors are retried with backoff, up to the resync.
		wait = min(wait, time.Duration(1<<min(d.failures-1, 6))*500*time.Millisecond)
	}
	return max(wait, 10*time.Millisecond)
}

// seedKernel hands the routes a previous run installed to the hold, so
// they stay until the RIB confirms or replaces them.
func (d *Daemon) seedKernel() error {
	k, err := d.plane.ReadDevices()
	if err != nil {
		return err
	}
	// One table at a time: a node of many routes holds one VPC's while it
	// reads, not every VPC's.
	for vpc := range k.Devices() {
		dom, err := k.Domain(vpc)
		if err != nil || dom == nil {
			continue
		}
		if err := k.ReadTables([]int{dom.Table}); err != nil {
			return err
		}
		d.holder.Seed(vpc, k.Installed(vpc, dom))
		k.Forget([]int{dom.Table})
	}
	return nil
}

// snapshot applies the speaker's queued events and the stale bounds and
// returns the RIB view's changes, whether a session is established,
// whether the RIB counts as synced for a start, the peers' sessions and
// when a bound ends next.
func (d *Daemon) snapshot(now time.Time) (changes []ribChange, anyPeer, synced bool, established map[string]bool, next time.Time) {
	d.mu.Lock()
	evs := d.events
	d.events = nil
	d.mu.Unlock()
	for _, e := range evs {
		d.adj.Apply(e.at, e.ev)
	}
	next = d.adj.Expire(now)
	changes = d.adj.TakeChanges()
	d.adjCurrent.Store(int64(d.adj.Current()))
	peers := make([]string, 0, len(d.cfg.Peers))
	for _, p := range d.cfg.Peers {
		peers = append(peers, p.Address.String())
	}
	anyPeer, anySynced, allSynced := d.adj.Sessions(peers)
	return changes, anyPeer, StartSynced(now.Sub(d.start), anySynced, allSynced, d.o.RIBWait, d.cfg.StaleRoutes), d.adj.Established(), next
}

// StartSynced says whether a started router may judge the routes it found
// in the kernel: once every peer sent its End-of-RIB, or one did and wait
// has passed; with no End-of-RIB at all (reflectors unreachable) only when
// the stale bound (at least wait) has passed.
func StartSynced(since time.Duration, anySynced, allSynced bool, wait, stale time.Duration) bool {
	return allSynced || anySynced && since >= wait || since >= max(wait, stale)
}

// pass brings the desired state up to date with what changed (everything
// on a resync) and applies the difference. It returns when the next hold
// or bound ends.
func (d *Daemon) pass(ctx context.Context) time.Time {
	now := d.clock.Now()
	defer func() { d.metrics.observePass(d.clock.Since(now)) }()
	changes, anyPeer, synced, established, next := d.snapshot(now)
	d.imp.Apply(changes)
	d.ribSize.Store(int64(d.imp.Len()))
	if !d.ribReady && synced {
		d.ribReady = true
		d.log.Info("RIB synced", "after", now.Sub(d.start).Round(time.Millisecond))
	}
	d.ids.check(ctx, d.spk, d.imp.Duplicates())
	// Taken whatever else makes the pass full, so one request is one resync.
	asked := d.watch.resyncNow.Swap(false)
	full := asked || d.lastFull.IsZero() || d.clock.Since(d.lastFull) >= d.o.Resync || d.failures > 0
	if full {
		d.lastFull = d.clock.Now()
	}
	apiSynced := d.api.synced()
	adverts, vnis, apiMoved := d.api.list(apiSynced, full, d.exp.saved.VNIs, d.exp.savedGen)
	kp, devices := d.devicesStage(vnis, full)
	// The selection follows the RIB's changes exactly, so a resync only
	// reads the kernel again.
	d.imp.SetVNIs(vnis)
	selChanges := d.imp.Select()
	managed := map[string]bool{}
	for vpc := range devices {
		managed[vpc] = true
	}
	// A VPC whose device failed keeps what the holder knows of it: its
	// kernel routes are left as they are until the device is back.
	for vpc := range d.deviceErrs {
		managed[vpc] = true
	}
	holdEnd := d.holder.Update(now, &d.imp, d.imp.Fences(), managed, !d.ribReady, selChanges)
	if !holdEnd.IsZero() && (next.IsZero() || holdEnd.Before(next)) {
		next = holdEnd
	}
	kp.routesStage(devices, &d.holder)
	// The membership goes out before the writes, so the peers send a new
	// VPC's routes while its device is made (a node of many new VPCs
	// spends seconds on devices); a device that fails leaves it again below.
	d.syncMembership(ctx, vnis, devices)
	kp.apply(devices, &d.holder)
	if kp.lockErr != nil {
		d.failures++
		return next
	}
	d.holder.Synced()
	installed := 0
	for vpc := range devices {
		installed += d.holder.Count(vpc)
	}
	d.metrics.observeCost(kp.cost)
	d.syncMembership(ctx, vnis, devices)

	d.exp.sync(ctx, exportView{adverts: adverts, vnis: vnis, devices: devices, deviceErrs: d.deviceErrs, dups: d.ids.dups,
		anyPeer: anyPeer, available: d.api.available}, apiSynced, apiMoved, full, now)
	if len(d.deviceErrs) > 0 {
		d.failures++
	} else {
		d.failures = 0
	}
	d.metrics.set(len(d.exp.announced), installed, established)
	d.metrics.deviceErrors.Set(float64(len(d.deviceErrs)))
	return next
}
