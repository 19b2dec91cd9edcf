package router

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/dataplane"
)

// kernelWatch marks for the next pass the tables whose routes others
// change and notices changes of the VPCs' devices, so a pass reads the
// kernel only for what moved. A route of another protocol that leaves a
// VPC table starts a pass at once: a local host route that went may
// uncover a remote route of the same prefix, which local always beats.
//
// A subscription ends when its socket overflows (the router's own route
// writes come back as notifications, 100,000 of them when a node joins
// every VPC): the watch then subscribes again and the next pass reads
// everything, since what changed meanwhile is unknown.
type kernelWatch struct {
	log   *slog.Logger
	clock clock.Clock
	// kick starts a pass.
	kick func()
	// marks are what the watch saw change since a pass last took them.
	marks kernelMarks
	// resyncNow asks the next pass to read everything: a subscription
	// was down, so the marks are incomplete.
	resyncNow atomic.Bool
	// buffer is the subscriptions' receive buffer (defaultWatchBuffer
	// unless a test makes it overflow).
	buffer int
	// off leaves the host's routes unwatched: unit tests.
	off bool
}

// defaultWatchBuffer is the kernel watches' socket receive buffer: a burst of
// route writes queues a notification each (about 1 KiB of buffer apiece)
// faster than a loaded router may read them.
const defaultWatchBuffer = 8 << 20

// watchSubs are a running watch's two subscriptions; a nil channel is
// one to make again.
type watchSubs struct {
	routes chan netlink.RouteUpdate
	links  chan netlink.LinkUpdate
	// Each subscription's socket is closed when its stopper stops: an
	// ended subscription's socket would otherwise stay open, and fill.
	routesSub, linksSub stopper
	// lost is set when a subscription ended, wait is how long until the
	// next attempt to subscribe.
	lost bool
	wait time.Duration
}

func (s *watchSubs) up() bool { return s.routes != nil && s.links != nil }

// run watches until ctx ends.
func (w *kernelWatch) run(ctx context.Context) {
	var s watchSubs
	defer func() { s.routesSub.stop(); s.linksSub.stop() }()
	var retry <-chan time.Time
	for {
		if !s.up() && retry == nil {
			retry = w.clock.After(s.wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-retry:
			retry = nil
			w.subscribe(ctx, &s)
		case u, ok := <-s.routes:
			if !ok {
				if ctx.Err() != nil {
					return
				}
				w.log.Warn("watching routes: the kernel ended the subscription; subscribing again")
				s.routesSub.stop()
				s.routes, s.lost = nil, true
				continue
			}
			w.route(u)
		case u, ok := <-s.links:
			if !ok {
				if ctx.Err() != nil {
					return
				}
				w.log.Warn("watching links: the kernel ended the subscription; subscribing again")
				s.linksSub.stop()
				s.links, s.lost = nil, true
				continue
			}
			w.link(u)
		}
	}
}

// subscribe makes the subscriptions s lacks. One that fails is retried
// with backoff; meanwhile the periodic resync reads what the watch would
// have marked.
func (w *kernelWatch) subscribe(ctx context.Context, s *watchSubs) {
	if s.routes == nil {
		done := s.routesSub.next(ctx)
		s.routes = subscribe(w.log, "routes", 1024, func(ch chan netlink.RouteUpdate, force bool) error {
			return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{
				ErrorCallback: w.onError("routes"), ReceiveBufferSize: w.buffer, ReceiveBufferForceSize: force})
		})
	}
	if s.links == nil {
		done := s.linksSub.next(ctx)
		s.links = subscribe(w.log, "links", 256, func(ch chan netlink.LinkUpdate, force bool) error {
			return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{
				ErrorCallback: w.onError("links"), ReceiveBufferSize: w.buffer, ReceiveBufferForceSize: force})
		})
	}
	if !s.up() {
		s.wait = min(max(2*s.wait, time.Second), 30*time.Second)
		return
	}
	s.wait = 0
	if s.lost {
		// Whatever changed while a subscription was down is unknown.
		s.lost = false
		w.resyncNow.Store(true)
		w.kick()
	}
}

// route marks what a route's change may have moved.
func (w *kernelWatch) route(u netlink.RouteUpdate) {
	if u.Table <= unix.RT_TABLE_MAIN || u.Table == unix.RT_TABLE_LOCAL {
		return
	}
	ours := int(u.Protocol) == dataplane.Protocol
	if u.Type == unix.RTM_NEWROUTE && ours {
		return
	}
	if p, ok := markerOf(u.Route); ok {
		// A domain came or went.
		w.marks.marker(p)
		w.kick()
		return
	}
	w.marks.table(u.Table)
	if u.Type == unix.RTM_DELROUTE && !ours {
		w.kick()
	}
}

// link marks a change of one of galactic's devices.
func (w *kernelWatch) link(u netlink.LinkUpdate) {
	if name := u.Attrs().Name; len(name) == 15 && (strings.HasPrefix(name, "gx") || strings.HasPrefix(name, "gr")) {
		w.marks.link(name)
		w.kick()
	}
}

// subscribe makes a channel of capacity n and runs sub on it with the
// receive buffer forced past rmem_max, which takes CAP_NET_ADMIN, and
// else as rmem_max allows; nil when the kernel refused both.
func subscribe[U any](log *slog.Logger, what string, n int, sub func(ch chan U, force bool) error) chan U {
	ch := make(chan U, n)
	err := sub(ch, true)
	if err != nil {
		err = sub(ch, false)
	}
	if err != nil {
		log.Warn("watching "+what+": kernel changes wait for the resync", "error", err)
		return nil
	}
	return ch
}

// stopper ends one kernel subscription at a time.
type stopper struct{ cancel context.CancelFunc }

// next stops the previous subscription and returns the done channel of
// the next, which ends with ctx too.
func (s *stopper) next(ctx context.Context) <-chan struct{} {
	s.stop()
	c, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	return c.Done()
}

func (s *stopper) stop() {
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
}

// onError is a subscription's error callback: every VPC's devices are
// read again. An error that ends the subscription also closes its
// channel, after which the watch subscribes again and asks for a resync.
func (w *kernelWatch) onError(what string) func(error) {
	return func(err error) { w.log.Warn("watching "+what, "error", err); w.marks.device(); w.kick() }
}

// markerOf is r's prefix when r is a routing domain's marker route:
// galactic's protocol, a /128 in 100::/64.
func markerOf(r netlink.Route) (netip.Prefix, bool) {
	p, ok := routing.PrefixOf(r.Dst)
	return p, ok && int(r.Protocol) == routing.Protocol && p.Bits() == 128 && p.Addr().Is6() && markerNet.Contains(p.Addr())
}

var markerNet = netip.MustParsePrefix("100::/64")

// kernelMarks are what the kernel watches saw change since the last pass:
// tables whose routes others changed (their VPCs' routes are read again),
// galactic's devices by name and domains by marker (their VPCs' devices
// are read again), and devices whatever they are (every VPC is).
type kernelMarks struct {
	mu      sync.Mutex
	tables  map[int]bool
	names   map[string]bool
	markers map[netip.Prefix]bool
	devices bool
}

// marked is what kernelMarks.take returns.
type marked struct {
	tables  map[int]bool
	names   map[string]bool
	markers map[netip.Prefix]bool
	devices bool
}

func (m *kernelMarks) link(name string)      { markIn(&m.mu, &m.names, name) }
func (m *kernelMarks) marker(p netip.Prefix) { markIn(&m.mu, &m.markers, p) }
func (m *kernelMarks) table(t int)           { markIn(&m.mu, &m.tables, t) }

func markIn[K comparable](mu *sync.Mutex, set *map[K]bool, k K) {
	mu.Lock()
	defer mu.Unlock()
	if *set == nil {
		*set = map[K]bool{}
	}
	(*set)[k] = true
}

func (m *kernelMarks) device() {
	m.mu.Lock()
	m.devices = true
	m.mu.Unlock()
}

func (m *kernelMarks) take() marked {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := marked{tables: m.tables, names: m.names, markers: m.markers, devices: m.devices}
	m.tables, m.names, m.markers, m.devices = nil, nil, nil, false
	return out
}

// touched are the VPCs whose devices or domain the watches saw change; a
// VXLAN device of no VPC here (one the router removes) counts as every
// VPC's.
func (mk marked) touched(vnis map[string]uint32) (vpcs map[string]bool, all bool) {
	if len(mk.names) == 0 && len(mk.markers) == 0 {
		return nil, mk.devices
	}
	vpcs = map[string]bool{}
	ours := map[string]bool{}
	for vpc := range vnis {
		vx := routing.VXLANDeviceName(vpc)
		ours[vx] = true
		if mk.names[vx] || mk.names[routing.DeviceName(vpc)] || mk.markers[routing.Marker(vpc)] || mk.markers[routing.VRFMarker(vpc)] {
			vpcs[vpc] = true
		}
	}
	all = mk.devices
	for name := range mk.names {
		all = all || strings.HasPrefix(name, "gx") && !ours[name]
	}
	return vpcs, all
}
