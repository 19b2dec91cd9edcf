package router

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
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
	store   Store
	saved   Saved
	bootID  string
	metrics *Metrics
	scale   *scaleCollector

	api apiStage
	ids identityCheck

	kick     chan struct{}
	drainReq chan chan error
	status   statusQueue

	// mu guards the events the speaker delivered since the last pass
	// took them, and the sessions' last state.
	mu     sync.Mutex
	events []timedEvent
	peerUp map[string]bool

	// Only the loop touches these. The Importer reads the Adj in place.
	adj       Adj
	announced map[speaker.Key]speaker.Route
	imp       Importer
	holder    Holder
	// ribSize is the RIB view's paths at the last pass, adjCurrent the
	// live sessions' paths the RIB view holds, for the metrics.
	ribSize    atomic.Int64
	adjCurrent atomic.Int64
	start      time.Time
	ribReady   bool
	rdsDirty   bool
	// deviceErrs are the VPCs whose VXLAN device could not be ensured on
	// the last pass, failures how many passes in a row had one.
	deviceErrs map[string]error
	failures   int
	// exported fingerprints export's other inputs when it last ran, at
	// exportedAt; savedGen counts the saved states written.
	exported   uint64
	exportedAt time.Time
	savedGen   uint64
	// aliveAt is when each entry's netns was last seen to exist; see live.
	aliveAt map[string]time.Time
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
		store:        NewStore(o.StateDir),
		kick:         make(chan struct{}, 1),
		drainReq:     make(chan chan error),
		status:       statusQueue{pending: map[string]statusItem{}, kick: make(chan struct{}, 1)},
		adj:          Adj{Stale: o.Config.StaleRoutes, Sync: o.RIBWait},
		announced:    map[speaker.Key]speaker.Route{},
		deviceErrs:   map[string]error{},
		synced:       map[string]synced{},
		removeKernel: RemoveKernelState,
		holder:       Holder{Hold: o.Config.WithdrawHold},
		imp:          Importer{RTASN: o.Config.RouteTargetASN, RouterID: o.Config.RouterID, Underlay: o.Config.Underlay},
		metrics:      NewMetrics(o.Clock),
	}
	d.imp.Adj = &d.adj
	d.api = apiStage{node: o.Node, namespace: o.Namespace, judge: o.Judge, clock: o.Clock, kick: d.trigger, leaseEvents: d.metrics.leaseEvents}
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
	loaded, ok, err := d.store.Load()
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
	d.saved, d.bootID = saved, boot
	if ok && !restarting {
		d.log.Info("starting fresh: the saved state is not this boot's and identity's", "reason", why, "discardedPaths", len(loaded.Paths))
	}
	d.spk, err = d.o.Speaker(ctx, speaker.Options{
		Config: d.cfg, Restarting: restarting && d.cfg.GracefulRestart, Log: d.log, Clock: d.clock,
		OnEvent:    d.onEvent,
		Membership: savedMembership(d.cfg.RouteTargetASN, d.saved.VNIs), RTCPeers: loadRTCPeers(d.o.StateDir),
	})
	if err != nil {
		return err
	}
	// Re-announce the last desired paths before anything else, so a
	// restart that cannot reach the API server still sends the same routes
	// with the same RDs.
	for _, p := range d.saved.Paths {
		r, err := p.route()
		if err != nil {
			continue
		}
		if err := d.spk.Announce(ctx, r); err != nil {
			d.log.Warn("re-announcing a saved path", "error", err)
			continue
		}
		d.announced[r.Key()] = r
	}
	if err := d.seedKernel(); err != nil {
		d.log.Warn("reading the routes installed before this start", "error", err)
	}
	d.log.Info("started", "restarting", restarting, "savedPaths", len(d.saved.Paths), "asn", d.cfg.ASN, "routerID", d.cfg.RouterID, "underlay", d.cfg.Underlay)

	if err := d.api.start(ctx, d.o); err != nil {
		return err
	}
	go d.writeStatus(ctx)
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
	adverts, vnis, apiMoved := d.api.list(apiSynced, full, d.saved.VNIs, d.savedGen)
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

	// Export and the saved state follow the API, the devices, the
	// sessions and the entries' netns: a pass for remote routes alone
	// changes none of them, so it skips both, but for the liveness of the
	// entries, looked at again every liveEvery.
	in := d.exportInputs(devices, anyPeer)
	if apiSynced && (full || apiMoved || in != d.exported || now.Sub(d.exportedAt) >= liveEvery) {
		d.export(ctx, adverts, vnis, devices, anyPeer)
		d.exported, d.exportedAt = in, now
		d.save(vnis, devices)
	} else if !apiSynced || d.rdsDirty {
		d.save(vnis, devices)
	}
	if len(d.deviceErrs) > 0 {
		d.failures++
	} else {
		d.failures = 0
	}
	d.metrics.set(len(d.announced), installed, established)
	d.metrics.deviceErrors.Set(float64(len(d.deviceErrs)))
	return next
}

// liveEvery is how often a pass that changes nothing else looks at the
// entries' netns again (a workload gone without a DEL).
const liveEvery = time.Second

// live is the liveness check of an export at now: a netns seen to exist
// less than liveEvery ago is not looked at again, so the exports that
// each ADD's API events start cost the new entries' checks, not every
// entry's on the node. One not seen to exist is looked at every time.
func (d *Daemon) live(now time.Time) func(string) bool {
	if d.aliveAt == nil {
		d.aliveAt = map[string]time.Time{}
	}
	for p, at := range d.aliveAt {
		if now.Sub(at) >= liveEvery {
			delete(d.aliveAt, p)
		}
	}
	return func(netns string) bool {
		if _, ok := d.aliveAt[netns]; ok {
			return true
		}
		if !d.o.Live(netns) {
			return false
		}
		d.aliveAt[netns] = now
		return true
	}
}

// exportInputs fingerprints what export reads besides the API: each
// device's VPC, index and MAC, the VPCs whose device failed, the other
// VTEPs with this router ID and whether a session is up.
func (d *Daemon) exportInputs(devices map[string]*dataplane.Device, anyPeer bool) uint64 {
	var sum uint64
	for vpc, dev := range devices {
		var h maphash.Hash
		h.SetSeed(exportSeed)
		h.WriteString(vpc)
		h.WriteString(strconv.Itoa(dev.Index))
		h.Write(dev.MAC)
		sum += h.Sum64()
	}
	for vpc := range d.deviceErrs {
		sum += maphash.String(exportSeed, "error "+vpc)
	}
	for _, v := range d.ids.dups {
		sum += maphash.String(exportSeed, "duplicate "+v.String())
	}
	if anyPeer {
		sum++
	}
	return sum
}

var exportSeed = maphash.MakeSeed()

func (d *Daemon) rd(vpc string) speaker.RD {
	_, had := d.saved.RDs[vpc]
	n, err := AllocateRD(d.saved.RDs, vpc)
	d.rdsDirty = d.rdsDirty || !had
	if err != nil {
		d.log.Error("allocating an RD", "vpc", vpc, "error", err)
	}
	return speaker.RD{Admin: d.cfg.RouterID, Assigned: n}
}

// export announces what changed, withdraws what is no longer desired and
// writes the advertisements' conditions where they moved.
func (d *Daemon) export(ctx context.Context, adverts []*v1alpha1.BGPAdvertisement, vnis map[string]uint32, devices map[string]*dataplane.Device, anyPeer bool) {
	want, verdicts := Desired(ExportInput{
		Adverts: adverts, Live: d.live(d.clock.Now()), Available: d.api.available, VNIs: vnis, RD: d.rd,
		RouterMAC: func(vpc string) net.HardwareAddr {
			if dev := devices[vpc]; dev != nil {
				return dev.MAC
			}
			// A local error never withdraws: the device's MAC is derived,
			// so the paths stay what peers already have.
			if _, failed := d.deviceErrs[vpc]; failed {
				return d.plane.DeviceMAC(vpc)
			}
			return nil
		},
		Underlay: d.cfg.Underlay, RTASN: d.cfg.RouteTargetASN, Announced: d.announced,
	})
	// A VPC whose device failed keeps what peers have, and gets nothing
	// new until the device works: traffic to a new path would be dropped.
	if len(d.deviceErrs) > 0 {
		for k := range want {
			if _, had := d.announced[k]; had {
				continue
			}
			for vpc := range d.deviceErrs {
				if n, ok := d.saved.RDs[vpc]; ok && n == k.RD.Assigned {
					delete(want, k)
				}
			}
		}
	}
	for k, r := range want {
		if cur, ok := d.announced[k]; ok && cur.Equal(r) {
			continue
		}
		if err := d.spk.Announce(ctx, r); err != nil {
			d.log.Error("announce", "route", k.String(), "error", err)
			continue
		}
		d.announced[k] = r
		d.metrics.updates.WithLabelValues("announce").Inc()
		d.log.Info("announced", "route", k.String(), "generation", r.Generation, "drained", r.Drained)
	}
	for k := range d.announced {
		if _, ok := want[k]; ok {
			continue
		}
		if err := d.spk.Withdraw(ctx, k); err != nil {
			d.log.Error("withdraw", "route", k.String(), "error", err)
			continue
		}
		delete(d.announced, k)
		d.metrics.updates.WithLabelValues("withdraw").Inc()
		d.log.Info("withdrew", "route", k.String())
	}
	for _, adv := range adverts {
		v, ok := verdicts[adv.Name]
		if !ok || !v.Announced {
			continue
		}
		switch err := d.deviceErrs[adv.Spec.VPC]; {
		case len(d.ids.dups) > 0:
			v.Announced, v.Reason = false, ReasonDuplicateRouterID
			v.Message = fmt.Sprintf("announced, but router ID %s is also used by the VTEP(s) %v: give every node its own routerID in router.json", d.cfg.RouterID, d.ids.dups)
		case err != nil:
			v.Announced, v.Reason = false, ReasonDeviceError
			v.Message = "the VPC's VXLAN device failed (retrying; what peers already have stays announced): " + err.Error()
		}
		verdicts[adv.Name] = v
	}
	d.status.mu.Lock()
	for _, adv := range adverts {
		if v, ok := verdicts[adv.Name]; ok {
			// The cached object is the last status written (or one whose
			// write failed): queue only what it does not say yet.
			if want := Conditions(v, anyPeer); conditionsDiffer(adv, want) {
				d.status.pending[adv.Name] = statusItem{adv: adv, want: want}
			} else {
				delete(d.status.pending, adv.Name)
			}
		}
	}
	d.status.mu.Unlock()
	select {
	case d.status.kick <- struct{}{}:
	default:
	}
}

// Reasons of Programmed=False this package adds to the API's.
const (
	ReasonDeviceError       = "DeviceError"
	ReasonDuplicateRouterID = "DuplicateRouterID"
)

func (d *Daemon) save(vnis map[string]uint32, devices map[string]*dataplane.Device) {
	next := Saved{RDs: d.saved.RDs, VNIs: map[string]uint32{}, BootID: d.bootID, Identity: Identity(d.cfg)}
	for vpc, v := range vnis {
		if _, ok := devices[vpc]; ok || d.saved.VNIs[vpc] == v {
			next.VNIs[vpc] = v
		}
	}
	for _, r := range d.announced {
		next.Paths = append(next.Paths, savedPath(r))
	}
	if !d.rdsDirty && equalSaved(next, d.saved) {
		return
	}
	if err := d.store.Save(next); err != nil {
		d.log.Error("saving the router state", "error", err)
		return
	}
	d.saved, d.rdsDirty = next, false
	d.savedGen++
}
