package controller

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	Registry *prometheus.Registry

	allocations *prometheus.CounterVec
	conflicts   *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	errors      *prometheus.CounterVec
}

const metricsNamespace = "galactic_controller"

// NewMetrics registers the metrics in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.allocations = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Name: "allocations_total",
		Help: "Values allocated, by kind (address, vni): VPCAddress and VNI objects created, reservations bound."}, []string{"kind"})
	m.conflicts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Name: "conflicts_total",
		Help: "Claims the API server refused because the value was held already (another controller's claim, or a stale cache), by kind."}, []string{"kind"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metricsNamespace, Name: "reconcile_duration_seconds",
		Help: "Duration of one object's reconcile, by kind.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"kind"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Name: "reconcile_errors_total",
		Help: "Reconciles that failed and were retried, by kind."}, []string{"kind"})
	m.Registry.MustRegister(m.allocations, m.conflicts, m.duration, m.errors)
	return m
}

func (m *Metrics) allocated(kind string) { m.allocations.WithLabelValues(kind).Inc() }
func (m *Metrics) conflict(kind string)  { m.conflicts.WithLabelValues(kind).Inc() }

func (m *Metrics) reconciled(kind string, took time.Duration, err error) {
	m.duration.WithLabelValues(kind).Observe(took.Seconds())
	if err != nil {
		m.errors.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) queues(qs map[string]workqueue.TypedRateLimitingInterface[string]) {
	for kind, q := range qs {
		m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metricsNamespace, Name: "queue_depth",
			Help: "Keys waiting in the work queue, by kind.", ConstLabels: prometheus.Labels{"kind": kind}},
			func() float64 { return float64(q.Len()) }))
	}
}

func (m *Metrics) leader(leading *atomic.Bool) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metricsNamespace, Name: "leader",
		Help: "1 while this process leads (reconciles), 0 while it stands by."},
		func() float64 {
			if leading.Load() {
				return 1
			}
			return 0
		}))
}

// readiness is a collector of the objects in the caches by kind and
// Ready reason, counted when scraped.
type readiness struct {
	desc  *prometheus.Desc
	count func() map[[2]string]int
}

func (r readiness) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r readiness) Collect(ch chan<- prometheus.Metric) {
	for k, n := range r.count() {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// countReady counts the cached VPCs and VPCAttachments by their Ready
// condition's reason ("" before the controller wrote one).
func (c *Controller) countReady() map[[2]string]int {
	out := map[[2]string]int{}
	reason := func(conds []metav1.Condition) string {
		if r := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); r != nil {
			return r.Reason
		}
		return ""
	}
	for _, o := range c.vpcInf.GetStore().List() {
		out[[2]string{"VPC", reason(o.(*v1alpha1.VPC).Status.Conditions)}]++
	}
	for _, o := range c.attInf.GetStore().List() {
		out[[2]string{"VPCAttachment", reason(o.(*v1alpha1.VPCAttachment).Status.Conditions)}]++
	}
	return out
}

// Handler serves /metrics, /healthz and /readyz. /healthz fails when
// health does (the leader election's check: a leader that stopped
// renewing); /readyz answers once the caches are filled, leader or not.
func (c *Controller) Handler(health func(*http.Request) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(c.m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if health != nil {
			if err := health(r); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !c.Synced() {
			http.Error(w, "caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
