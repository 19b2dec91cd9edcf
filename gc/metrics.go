package gc

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the collector's Prometheus metrics and health.
type Metrics struct {
	Registry *prometheus.Registry

	passes         *prometheus.CounterVec
	passDuration   prometheus.Histogram
	entriesPruned  prometheus.Counter
	advsDeleted    prometheus.Counter
	recordsRemoved prometheus.Counter
	tapsDetached   prometheus.Gauge
	tapsReclaimed  prometheus.Counter
	tapsKept       *prometheus.CounterVec
	leasesRenewed  prometheus.Counter
	leasesReleased prometheus.Counter
	errors         *prometheus.CounterVec
	lastSuccess    prometheus.Gauge

	mu          sync.Mutex
	started     time.Time
	lastOK      time.Time
	lastErr     error
	maxPassTime time.Duration
}

// NewMetrics registers the metrics. The health endpoint fails once no pass
// has succeeded for staleAfter (give it a few intervals).
func NewMetrics(staleAfter time.Duration, now time.Time) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(), started: now, maxPassTime: staleAfter}
	f := func(c prometheus.Collector) { m.Registry.MustRegister(c) }
	ns := "galactic_gc"
	m.passes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "passes_total", Help: "GC passes by result (success, error)."}, []string{"result"})
	m.passDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "pass_duration_seconds", Help: "Duration of GC passes.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)})
	m.entriesPruned = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "entries_pruned_total", Help: "Dead advertisement entries pruned."})
	m.advsDeleted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "advertisements_deleted_total", Help: "Advertisements deleted because no live entry was left."})
	m.recordsRemoved = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "records_removed_total", Help: "galactic-cni records removed because container and host interface were gone."})
	m.tapsDetached = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "taps_detached", Help: "Taps seen detached in the last pass."})
	m.tapsReclaimed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "taps_reclaimed_total", Help: "Detached taps reclaimed."})
	m.tapsKept = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "taps_kept_total", Help: "Detached taps kept, by reason."}, []string{"reason"})
	m.leasesRenewed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "leases_renewed_total", Help: "Handoff leases renewed for live local holders."})
	m.leasesReleased = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "leases_released_total", Help: "Handoff leases released for dead local holders."})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total", Help: "Errors by kind."}, []string{"kind"})
	m.lastSuccess = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "last_success_timestamp_seconds", Help: "Unix time of the last successful pass."})
	for _, c := range []prometheus.Collector{m.passes, m.passDuration, m.entriesPruned, m.advsDeleted, m.recordsRemoved,
		m.tapsDetached, m.tapsReclaimed, m.tapsKept, m.leasesRenewed, m.leasesReleased, m.errors, m.lastSuccess} {
		f(c)
	}
	return m
}

// Observe records one pass.
func (m *Metrics) Observe(r Report, err error, took time.Duration, end time.Time) {
	m.passDuration.Observe(took.Seconds())
	m.entriesPruned.Add(float64(r.EntriesPruned))
	m.advsDeleted.Add(float64(r.AdvertisementsDeleted))
	m.recordsRemoved.Add(float64(r.RecordsRemoved))
	m.tapsDetached.Set(float64(r.TapsDetached))
	m.tapsReclaimed.Add(float64(r.TapsReclaimed))
	for reason, n := range r.TapsKept {
		m.tapsKept.WithLabelValues(reason).Add(float64(n))
	}
	m.leasesRenewed.Add(float64(r.LeasesRenewed))
	m.leasesReleased.Add(float64(r.LeasesReleased))
	for kind, n := range r.Errors {
		m.errors.WithLabelValues(kind).Add(float64(n))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastErr = err
	if err != nil {
		m.passes.WithLabelValues("error").Inc()
		return
	}
	m.passes.WithLabelValues("success").Inc()
	m.lastOK = end
	m.lastSuccess.Set(float64(end.Unix()))
}

// Healthy reports whether a pass succeeded recently enough; before the
// first success the daemon gets the same grace.
func (m *Metrics) Healthy(now time.Time) (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	since := m.lastOK
	if since.IsZero() {
		since = m.started
	}
	if now.Sub(since) <= m.maxPassTime {
		return true, "ok"
	}
	msg := "no successful GC pass since " + since.UTC().Format(time.RFC3339)
	if m.lastErr != nil {
		msg += ": " + m.lastErr.Error()
	}
	return false, msg
}

// Handler serves /metrics and /healthz.
func (m *Metrics) Handler(now func() time.Time) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		ok, msg := m.Healthy(now())
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(msg + "\n"))
	})
	return mux
}
