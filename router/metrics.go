package router

import (
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"
)

// Metrics are galactic-router's Prometheus metrics.
type Metrics struct {
	reg           *prometheus.Registry
	peers         *prometheus.GaugeVec
	announced     prometheus.Gauge
	installed     prometheus.Gauge
	received      prometheus.Counter
	updates       *prometheus.CounterVec
	kernelChanges prometheus.Counter
	statusWrites  prometheus.Counter
	leaseEvents   prometheus.Counter
	passDuration  prometheus.Histogram
	deviceErrors  prometheus.Gauge
	duplicates    *prometheus.GaugeVec
	passes        *prometheus.CounterVec
	objectsRead   prometheus.Counter
	kernelWrites  prometheus.Counter
	lockHeld      prometheus.Histogram
	lastCost      *prometheus.GaugeVec
	clock         clock.PassiveClock
	lastPass      atomic.Int64
	// established is the number of sessions up at the last pass.
	established atomic.Int64
}

// NewMetrics registers the metrics in a registry of their own; clk
// dates the passes for /healthz.
func NewMetrics(clk clock.PassiveClock) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(), clock: clk,
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "galactic_router_peers",
			Help: "Configured BGP peers by session state (established or not)."}, []string{"state"}),
		announced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "galactic_router_paths_announced",
			Help: "EVPN type-5 paths this node announces."}),
		installed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "galactic_router_routes_installed",
			Help: "Remote routes installed in VPC tables, held ones included."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "galactic_router_received_updates_total",
			Help: "Paths peers announced or withdrew, as each sent them."}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "galactic_router_updates_total",
			Help: "Paths this node announced or withdrew."}, []string{"kind"}),
		kernelChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "galactic_router_kernel_route_changes_total",
			Help: "Remote routes added, replaced or removed in the kernel."}),
		statusWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "galactic_router_status_writes_total",
			Help: "BGPAdvertisement status updates written."}),
		leaseEvents: prometheus.NewCounter(prometheus.CounterOpts{Name: "galactic_router_lease_events_total",
			Help: "Events of the watch on the leases this node's holders hold."}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "galactic_router_reconcile_duration_seconds",
			Help: "Duration of one reconcile pass.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		deviceErrors: prometheus.NewGauge(prometheus.GaugeOpts{Name: "galactic_router_device_errors",
			Help: "VPCs whose VXLAN device could not be ensured on the last pass (their routes stay announced)."}),
		duplicates: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "galactic_router_duplicate_router_id",
			Help: "1 for each other VTEP whose paths carry this node's router ID."}, []string{"vtep"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "galactic_router_passes_total",
			Help: "Reconcile passes by what they did to the kernel: none (nothing to read), read (read, nothing to write), write."}, []string{"kernel"}),
		objectsRead: prometheus.NewCounter(prometheus.CounterOpts{Name: "galactic_router_kernel_objects_read_total",
			Help: "Netlink objects (routes, links, addresses, neighbours, FDB entries, rules) the passes read."}),
		kernelWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "galactic_router_kernel_writes_total",
			Help: "Netlink writes the passes made (and packet filter syncs)."}),
		lockHeld: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "galactic_router_node_lock_held_seconds",
			Help: "How long a pass held the node lock; passes with nothing to write do not take it.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
		lastCost: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "galactic_router_last_pass",
			Help: "The last pass: objects read, writes, VPCs synced, lock-held and total seconds."}, []string{"what"}),
	}
	m.reg.MustRegister(m.peers, m.announced, m.installed, m.received, m.updates, m.kernelChanges, m.statusWrites, m.leaseEvents, m.passDuration,
		m.deviceErrors, m.duplicates, m.passes, m.objectsRead, m.kernelWrites, m.lockHeld, m.lastCost)
	// The process's memory and CPU, and the Go heap's (go_gc_heap_live_bytes
	// is what the last collection kept, the rest is garbage and headroom).
	m.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC)))
	return m
}

func (m *Metrics) observePass(d time.Duration) {
	m.passDuration.Observe(d.Seconds())
	m.lastCost.WithLabelValues("seconds").Set(d.Seconds())
	m.lastPass.Store(m.clock.Now().UnixNano())
}

func (m *Metrics) observeCost(c passCost) {
	kind := "none"
	switch {
	case c.writes > 0:
		kind = "write"
		m.lockHeld.Observe(c.locked.Seconds())
	case c.read > 0:
		kind = "read"
	}
	m.passes.WithLabelValues(kind).Inc()
	m.objectsRead.Add(float64(c.read))
	m.kernelWrites.Add(float64(c.writes))
	m.lastCost.WithLabelValues("objects_read").Set(float64(c.read))
	m.lastCost.WithLabelValues("writes").Set(float64(c.writes))
	m.lastCost.WithLabelValues("vpcs_synced").Set(float64(c.vpcs))
	m.lastCost.WithLabelValues("lock_held_seconds").Set(c.locked.Seconds())
}

func (m *Metrics) set(announced, installed int, established map[string]bool) {
	m.announced.Set(float64(announced))
	m.installed.Set(float64(installed))
	up, down := 0, 0
	for _, e := range established {
		if e {
			up++
		} else {
			down++
		}
	}
	m.established.Store(int64(up))
	m.peers.WithLabelValues("established").Set(float64(up))
	m.peers.WithLabelValues("other").Set(float64(down))
}

func (m *Metrics) setDuplicates(prev, cur []netip.Addr) {
	for _, v := range prev {
		m.duplicates.DeleteLabelValues(v.String())
	}
	for _, v := range cur {
		m.duplicates.WithLabelValues(v.String()).Set(1)
	}
}

// Handler serves /metrics, /healthz and /readyz. /healthz is liveness:
// 200 while reconcile passes run, whatever the API server and the peers
// do, so neither outage restarts the router. /readyz adds that a session
// is established: a node whose router does not peer is not ready, which
// holds a rolling update until the replaced router peers again.
func (m *Metrics) Handler(stale time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	alive := func(w http.ResponseWriter) bool {
		last := time.Unix(0, m.lastPass.Load())
		if m.clock.Since(last) > stale {
			http.Error(w, "no reconcile pass since "+last.Format(time.RFC3339), http.StatusServiceUnavailable)
			return false
		}
		return true
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if alive(w) {
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !alive(w) {
			return
		}
		if m.established.Load() == 0 {
			http.Error(w, "no BGP session established", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
