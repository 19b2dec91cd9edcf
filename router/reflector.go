package router

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/speaker"
)

// Reflector is galactic-router in role reflector: a route reflector of
// l2vpn-evpn with route-target constraint. It programs nothing in the
// kernel and needs no API server.
type Reflector struct {
	cfg *config.Config
	log *slog.Logger
	spk *speaker.Reflector
}

// NewReflector prepares a reflector; Run starts it.
func NewReflector(cfg *config.Config, log *slog.Logger) *Reflector {
	return &Reflector{cfg: cfg, log: log}
}

// Run serves until ctx ends and returns without a Cease, so the clients,
// helping the graceful restart, keep the reflected routes while a
// restarted reflector comes back.
func (r *Reflector) Run(ctx context.Context) error {
	spk, err := speaker.StartReflector(ctx, speaker.ReflectorOptions{Config: r.cfg, Log: r.log,
		OnPeer: func(p speaker.PeerState) { r.log.Info("client", "address", p.Address, "state", p.State) }})
	if err != nil {
		return err
	}
	r.spk = spk
	r.log.Info("reflector started", "asn", r.cfg.ASN, "routerID", r.cfg.RouterID, "clusterID", r.cfg.ClusterID,
		"clientRanges", fmt.Sprint(r.cfg.ClientRanges), "peers", len(r.cfg.Peers))
	<-ctx.Done()
	return nil
}

// MetricsHandler serves /metrics and /healthz (200 while GoBGP answers).
func (r *Reflector) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(reflectorCollector{r})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, req *http.Request) {
		if r.spk == nil {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		if _, err := r.spk.Stats(ctx); err != nil {
			http.Error(w, "BGP does not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

var (
	reflClients = prometheus.NewDesc("galactic_router_reflector_clients",
		"Client sessions of the reflector by state (established or not).", []string{"state"}, nil)
	reflPaths = prometheus.NewDesc("galactic_router_reflector_paths",
		"l2vpn-evpn paths the reflector holds from its clients.", nil, nil)
	reflMemberships = prometheus.NewDesc("galactic_router_reflector_memberships",
		"Route-target membership (RTC) paths the reflector holds from its clients.", nil, nil)
)

// reflectorCollector reads GoBGP's tables at scrape time, so the counts
// cost nothing between scrapes.
type reflectorCollector struct{ r *Reflector }

func (c reflectorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{reflClients, reflPaths, reflMemberships} {
		ch <- d
	}
}

func (c reflectorCollector) Collect(ch chan<- prometheus.Metric) {
	if c.r.spk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.r.spk.Stats(ctx)
	if err != nil {
		c.r.log.Warn("reading the reflector's tables", "error", err)
		return
	}
	up := 0
	for _, cl := range st.Clients {
		if cl.Established {
			up++
		}
	}
	ch <- prometheus.MustNewConstMetric(reflClients, prometheus.GaugeValue, float64(up), "established")
	ch <- prometheus.MustNewConstMetric(reflClients, prometheus.GaugeValue, float64(len(st.Clients)-up), "other")
	ch <- prometheus.MustNewConstMetric(reflPaths, prometheus.GaugeValue, float64(st.Paths))
	ch <- prometheus.MustNewConstMetric(reflMemberships, prometheus.GaugeValue, float64(st.Memberships))
}
