package router

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/state"
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
	Adverts client.BGPAdvertisementInterface
	Leases  client.LeaseInterface
	// LeaseSelector selects the leases held by this node's holders.
	LeaseSelector string
	Judge         Judge
	Live          func(netns string) bool
	Log           *slog.Logger
	// Resync bounds how long the kernel goes unchecked without events.
	Resync time.Duration
	// RIBWait bounds how long a (re)started router waits for its peers'
	// End-of-RIB before it removes kernel routes the RIB does not have.
	RIBWait time.Duration
}

// MetricsHandler serves /metrics and /healthz.
func (d *Daemon) MetricsHandler() http.Handler { return d.metrics.Handler(3 * d.o.Resync) }

// Daemon is one node's galactic-router.
type Daemon struct {
	o       Options
	cfg     *config.Config
	log     *slog.Logger
	spk     *speaker.GoBGP
	plane   dataplane.Plane
	store   Store
	saved   Saved
	metrics *Metrics

	advInf   cache.SharedIndexInformer
	leaseInf cache.SharedIndexInformer

	kick     chan struct{}
	drainReq chan chan error
	status   statusQueue

	mu          sync.Mutex
	rib         RIB
	established map[string]bool
	eor         map[string]bool

	// Only the loop touches these.
	announced map[speaker.Key]speaker.Route
	holder    Holder
	start     time.Time
	ribReady  bool
	rdsDirty  bool
}

// New prepares a daemon; Run starts it.
func New(o Options) (*Daemon, error) {
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.RIBWait <= 0 {
		o.RIBWait = 30 * time.Second
	}
	d := &Daemon{
		o: o, cfg: o.Config, log: o.Log,
		plane:       dataplane.Plane{Underlay: o.Config.Underlay, Node: o.Node},
		store:       NewStore(o.StateDir),
		kick:        make(chan struct{}, 1),
		drainReq:    make(chan chan error),
		status:      statusQueue{pending: map[string]statusItem{}, kick: make(chan struct{}, 1)},
		rib:         RIB{},
		established: map[string]bool{},
		eor:         map[string]bool{},
		announced:   map[speaker.Key]speaker.Route{},
		holder:      Holder{Hold: o.Config.WithdrawHold},
		metrics:     NewMetrics(),
	}
	return d, nil
}

func (d *Daemon) trigger() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func listWatch[T runtime.Object](list func(context.Context, metav1.ListOptions) (T, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error), selector string) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return w(ctx, o)
		},
	}
}

// Run serves until ctx ends. It returns without withdrawing anything or
// closing sessions with a Cease, so a restart is graceful; Drain is the
// way to withdraw on purpose.
func (d *Daemon) Run(ctx context.Context) error {
	d.start = time.Now()
	saved, restarting, err := d.store.Load()
	if err != nil {
		return fmt.Errorf("reading the router state: %w", err)
	}
	d.saved = saved
	d.spk, err = speaker.Start(ctx, speaker.Options{
		Config: d.cfg, Restarting: restarting && d.cfg.GracefulRestart, Log: d.log,
		OnReceived: func(rs []speaker.Received) {
			d.mu.Lock()
			d.rib.Apply(rs)
			d.mu.Unlock()
			d.metrics.received.Add(float64(len(rs)))
			d.trigger()
		},
		OnPeer: func(p speaker.PeerState) {
			d.mu.Lock()
			d.established[p.Address] = p.Established
			if !p.Established {
				delete(d.eor, p.Address)
			}
			d.mu.Unlock()
			d.log.Info("peer", "address", p.Address, "state", p.State)
			d.trigger()
		},
		OnEndOfRIB: func(peer string) {
			d.mu.Lock()
			d.eor[peer] = true
			d.mu.Unlock()
			d.trigger()
		},
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

	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.trigger() },
		UpdateFunc: func(any, any) { d.trigger() },
		DeleteFunc: func(any) { d.trigger() },
	}
	d.advInf = cache.NewSharedIndexInformer(listWatch(d.o.Adverts.List, d.o.Adverts.Watch, names.NodeSelector(d.o.Node)),
		&v1alpha1.BGPAdvertisement{}, 0, cache.Indexers{})
	if _, err := d.advInf.AddEventHandler(handler); err != nil {
		return err
	}
	go d.advInf.RunWithContext(ctx)
	go d.writeStatus(ctx)
	if d.o.Leases != nil && d.o.LeaseSelector != "" {
		d.leaseInf = cache.NewSharedIndexInformer(listWatch(d.o.Leases.List, d.o.Leases.Watch, d.o.LeaseSelector),
			&coordinationv1.Lease{}, 0, cache.Indexers{})
		counted := func() { d.metrics.leaseEvents.Inc(); d.trigger() }
		leaseHandler := cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { counted() },
			UpdateFunc: func(any, any) { counted() },
			DeleteFunc: func(any) { counted() },
		}
		if _, err := d.leaseInf.AddEventHandler(leaseHandler); err != nil {
			return err
		}
		go d.leaseInf.RunWithContext(ctx)
	}

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		case <-timer.C:
		case done := <-d.drainReq:
			err := d.drain(ctx)
			done <- err
			return err
		}
		next := d.pass(ctx)
		wait := d.o.Resync
		if !next.IsZero() {
			wait = min(wait, time.Until(next)+10*time.Millisecond)
		}
		if !d.ribReady {
			wait = min(wait, time.Second)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(wait, 10*time.Millisecond))
	}
}

// seedKernel hands the routes a previous run installed to the hold, so
// they stay until the RIB confirms or replaces them.
func (d *Daemon) seedKernel() error {
	devs, err := dataplane.Devices()
	if err != nil {
		return err
	}
	for vpc := range devs {
		dom, err := routing.Find(vpc)
		if err != nil || dom == nil {
			continue
		}
		rs, err := dataplane.Installed(vpc, dom)
		if err != nil {
			return err
		}
		d.holder.Seed(vpc, rs)
	}
	return nil
}

func (d *Daemon) apiSynced() bool {
	return d.advInf.HasSynced() && (d.leaseInf == nil || d.leaseInf.HasSynced())
}

func (d *Daemon) adverts() []*v1alpha1.BGPAdvertisement {
	var out []*v1alpha1.BGPAdvertisement
	for _, o := range d.advInf.GetStore().List() {
		if a, ok := o.(*v1alpha1.BGPAdvertisement); ok && a.Spec.Node == d.o.Node {
			out = append(out, a)
		}
	}
	return out
}

// available judges a whenAvailable advertisement from the lease of its
// attachment, as cached by the lease watch.
func (d *Daemon) available(adv *v1alpha1.BGPAdvertisement, e v1alpha1.ContainerEntry) (metav1.ConditionStatus, string, string) {
	if d.o.Judge == nil || d.leaseInf == nil {
		return metav1.ConditionUnknown, "NoLeaseWatch", "the router does not watch handoff leases"
	}
	var lease *coordinationv1.Lease
	if o, ok, _ := d.leaseInf.GetStore().GetByKey(d.o.Namespace + "/" + names.Lease(adv.Spec.VPC, adv.Spec.Attachment)); ok {
		lease, _ = o.(*coordinationv1.Lease)
	}
	return d.o.Judge(lease, names.Holder(d.o.Node, e.ContainerID), e.HolderGeneration)
}

func (d *Daemon) snapshot() (RIB, bool, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rib := make(RIB, len(d.rib))
	for k, v := range d.rib {
		rib[k] = v
	}
	any, allEOR := false, len(d.cfg.Peers) > 0
	for _, p := range d.cfg.Peers {
		a := p.Address.String()
		if d.established[a] {
			any = true
		}
		if !d.eor[a] {
			allEOR = false
		}
	}
	return rib, any, allEOR
}

// pass computes the desired state afresh and applies the difference. It
// returns when the next hold ends.
func (d *Daemon) pass(ctx context.Context) time.Time {
	began := time.Now()
	defer func() { d.metrics.observePass(time.Since(began)) }()
	rib, anyPeer, allEOR := d.snapshot()
	if !d.ribReady && (allEOR || time.Since(d.start) > d.o.RIBWait) {
		d.ribReady = true
		d.log.Info("RIB synced", "endOfRIB", allEOR, "after", time.Since(d.start).Round(time.Millisecond))
	}
	synced := d.apiSynced()
	var adverts []*v1alpha1.BGPAdvertisement
	vnis := d.saved.VNIs
	if synced {
		adverts = d.adverts()
		vnis = ResolveVNIs(adverts, d.saved.VNIs)
	}

	unlock, err := state.Lock(d.o.StateDir)
	if err != nil {
		d.log.Error("taking the node lock", "error", err)
		return time.Time{}
	}
	devices, domains := d.syncDevices(vnis)
	selected, drainedPfx := Select(rib, d.cfg.RouteTargetASN, vnis)
	managed := map[string]bool{}
	for vpc := range devices {
		managed[vpc] = true
	}
	remotes, next := d.holder.Desired(time.Now(), selected, drainedPfx, managed, !d.ribReady)
	installed := 0
	for vpc, dev := range devices {
		ch, err := d.plane.Sync(dev, domains[vpc], remotes[vpc])
		if err != nil {
			d.log.Error("installing remote routes", "vpc", vpc, "error", err)
		}
		if ch != (dataplane.Changes{}) {
			d.log.Info("remote routes", "vpc", vpc, "added", ch.Added, "replaced", ch.Replaced, "removed", ch.Removed)
		}
		d.metrics.kernelChanges.Add(float64(ch.Added + ch.Replaced + ch.Removed))
		installed += len(remotes[vpc])
	}
	d.syncFilter(remotes)
	unlock()

	if synced {
		d.export(ctx, adverts, vnis, devices, anyPeer)
	}
	d.metrics.set(len(d.announced), installed, rib, d.established)
	d.save(vnis, devices)
	return next
}

// syncDevices keeps one VXLAN device per VPC that has a VNI and a routing
// domain here, and removes the devices of every other VPC.
func (d *Daemon) syncDevices(vnis map[string]uint32) (map[string]*dataplane.Device, map[string]*routing.Domain) {
	devices := map[string]*dataplane.Device{}
	domains := map[string]*routing.Domain{}
	for vpc, vni := range vnis {
		dom, err := routing.Find(vpc)
		if err != nil {
			d.log.Error("reading the routing domain", "vpc", vpc, "error", err)
			continue
		}
		if dom == nil || (dom.Kind == routing.KindVRF && dom.Device == "") {
			continue
		}
		dev, err := d.plane.EnsureDevice(vpc, vni, dom)
		if err != nil {
			d.log.Error("VXLAN device", "vpc", vpc, "error", err)
			continue
		}
		devices[vpc], domains[vpc] = dev, dom
	}
	existing, err := dataplane.Devices()
	if err != nil {
		d.log.Error("listing VXLAN devices", "error", err)
		return devices, domains
	}
	for vpc := range existing {
		if _, keep := devices[vpc]; keep {
			continue
		}
		if _, known := vnis[vpc]; known {
			// A VPC whose domain could not be read keeps its device.
			if dom, err := routing.Find(vpc); err != nil || dom != nil {
				continue
			}
		}
		if err := d.plane.RemoveVPC(vpc); err != nil {
			d.log.Error("removing a VPC's VXLAN device", "vpc", vpc, "error", err)
		} else {
			d.log.Info("removed VXLAN device", "vpc", vpc)
		}
	}
	return devices, domains
}

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
		Adverts: adverts, Live: d.o.Live, Available: d.available, VNIs: vnis, RD: d.rd,
		RouterMAC: func(vpc string) net.HardwareAddr {
			if dev := devices[vpc]; dev != nil {
				return dev.MAC
			}
			return nil
		},
		Underlay: d.cfg.Underlay, RTASN: d.cfg.RouteTargetASN, Announced: d.announced,
	})
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
	d.status.mu.Lock()
	for _, adv := range adverts {
		if v, ok := verdicts[adv.Name]; ok {
			d.status.pending[adv.Name] = statusItem{adv: adv, want: Conditions(v, anyPeer)}
		}
	}
	d.status.mu.Unlock()
	select {
	case d.status.kick <- struct{}{}:
	default:
	}
}

func (d *Daemon) save(vnis map[string]uint32, devices map[string]*dataplane.Device) {
	next := Saved{RDs: d.saved.RDs, VNIs: map[string]uint32{}}
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
}
