package router

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
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
	// Attachments is the VPCAttachment client of all namespaces; without
	// it no object-backed advertisement is announced.
	Attachments AttachmentClient
	Judge       Judge
	Live        func(netns string) bool
	Log         *slog.Logger
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

// Daemon is one node's galactic-router: a loop of passes over stages
// that each own their state. The API stage and the kernel watch run
// beside the loop and mark what changed; the speaker queues what peers
// send; each pass takes those in and applies the difference.
type Daemon struct {
	o       Options
	cfg     *config.Config
	log     *slog.Logger
	clock   clock.Clock
	spk     speaker.Speaker
	plane   dataplane.Plane
	metrics *Metrics
	scale   *scaleCollector

	api     apiStage
	watch   kernelWatch
	rib     ribStage
	ids     identityCheck
	kernel  kernelStage
	exp     exportStage
	cadence cadence

	kick     chan struct{}
	drainReq chan chan error
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
	cfg := o.Config
	d := &Daemon{
		o: o, cfg: cfg, log: o.Log, clock: o.Clock,
		plane:    dataplane.Plane{Underlay: cfg.Underlay, Node: o.Node},
		metrics:  NewMetrics(o.Clock),
		kick:     make(chan struct{}, 1),
		drainReq: make(chan chan error),
		cadence:  cadence{resync: o.Resync},
	}
	d.api = apiStage{node: o.Node, namespace: o.Namespace, judge: o.Judge, clock: o.Clock, kick: d.trigger, leaseEvents: d.metrics.leaseEvents}
	d.watch = kernelWatch{log: o.Log, clock: o.Clock, kick: d.trigger, buffer: defaultWatchBuffer}
	d.rib = ribStage{adj: Adj{Stale: cfg.StaleRoutes, Sync: o.RIBWait}, holder: Holder{Hold: cfg.WithdrawHold},
		imp:  Importer{RTASN: cfg.RouteTargetASN, RouterID: cfg.RouterID, Underlay: cfg.Underlay},
		wait: o.RIBWait, stale: cfg.StaleRoutes}
	d.rib.imp.Adj = &d.rib.adj
	for _, p := range cfg.Peers {
		d.rib.peers = append(d.rib.peers, p.Address.String())
	}
	d.ids = identityCheck{routerID: cfg.RouterID, underlay: cfg.Underlay, log: o.Log, clock: o.Clock, metrics: d.metrics}
	d.kernel = kernelStage{plane: d.plane, stateDir: o.StateDir, log: o.Log, clock: o.Clock, metrics: d.metrics,
		marks: &d.watch.marks, kick: d.trigger, synced: map[string]synced{}, deviceErrs: map[string]error{}, remove: RemoveKernelState}
	d.exp = exportStage{cfg: cfg, log: o.Log, clock: o.Clock, metrics: d.metrics, store: NewStore(o.StateDir),
		exists: o.Live, deviceMAC: d.plane.DeviceMAC, announced: map[speaker.Key]speaker.Route{},
		status: statusQueue{pending: map[string]statusItem{}, kick: make(chan struct{}, 1)}}
	d.scale = &scaleCollector{d: d}
	d.metrics.reg.MustRegister(d.scale)
	return d, nil
}

// trigger starts a pass as soon as the loop is free.
func (d *Daemon) trigger() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run serves until ctx ends. It returns without withdrawing anything or
// closing sessions with a Cease, so a restart is graceful; Drain is the
// way to withdraw on purpose.
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.begin(ctx); err != nil {
		return err
	}
	if err := d.api.start(ctx, d.o); err != nil {
		return err
	}
	go d.exp.writeStatus(ctx, d.o.Adverts)
	if !d.watch.off {
		go d.watch.run(ctx)
	}
	return d.loop(ctx)
}

// begin resumes from the saved state: a restart of this boot and
// identity replays the saved paths with the graceful-restart bits, and
// every start holds the routes it finds in the kernel.
func (d *Daemon) begin(ctx context.Context) error {
	d.rib.start = d.clock.Now()
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
		Membership: savedMembership(d.cfg.RouteTargetASN, saved.VNIs), RTCPeers: loadRTCPeers(d.o.StateDir),
	})
	if err != nil {
		return err
	}
	d.exp.spk = d.spk
	d.exp.replay(ctx)
	if err := d.rib.seed(d.plane); err != nil {
		d.log.Warn("reading the routes installed before this start", "error", err)
	}
	d.log.Info("started", "restarting", restarting, "savedPaths", len(saved.Paths), "asn", d.cfg.ASN, "routerID", d.cfg.RouterID, "underlay", d.cfg.Underlay)
	return nil
}

// loop runs a pass, then sleeps until an event, the pass's next bound or
// the resync; a drain ends it.
func (d *Daemon) loop(ctx context.Context) error {
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
