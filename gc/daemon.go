package gc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/liveness"
	"github.com/galactic-cni/galactic/pkg/settings"
)

// Options configure the daemon.
type Options struct {
	Interval time.Duration
	// PassTimeout bounds one pass, so a hung API call cannot stop the loop.
	PassTimeout time.Duration
	// MetricsAddress serves /metrics and /healthz; empty disables it.
	MetricsAddress string
	Once           bool
	Log            *slog.Logger
}

// NewCollector builds the collector of a node from its settings.
func NewCollector(node settings.Node, log *slog.Logger) (*Collector, error) {
	if err := node.RequireNodeName(); err != nil {
		return nil, err
	}
	cfg, err := client.LoadConfig(node.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cs, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	clk := clock.RealClock{}
	kernel := NodeKernel{Host: hostif.Host{StateDir: node.StateDir, Live: liveness.Netns, Now: clk.Now}}
	return &Collector{
		Clock:    clk,
		StateDir: node.StateDir,
		Kernel:   kernel,
		Filter:   kernel.SyncFilter,
		Adverts:  NodeAdverts{Node: node.NodeName, Adv: advert.New(cs.BGPAdvertisements(node.Namespace))},
		Leases:   HandoffLeases{Leases: cs.Leases(node.Namespace), Namespace: node.Namespace},
		Live:     liveness.Netns,
		Log:      log,
	}, nil
}

// Run runs passes until ctx ends (or one pass with Once). With Once the
// pass's error is returned; otherwise errors are logged and counted and the
// loop goes on.
func Run(ctx context.Context, c *Collector, opts Options) error {
	clk := c.passClock()
	metrics := NewMetrics(3*opts.Interval+opts.PassTimeout, clk.Now())
	if opts.MetricsAddress != "" {
		ln, err := net.Listen("tcp", opts.MetricsAddress)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: metrics.Handler(clk.Now), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		opts.Log.Info("serving metrics and health", "address", ln.Addr().String())
	}
	for {
		start := clk.Now()
		passCtx, cancel := context.WithTimeout(ctx, opts.PassTimeout)
		r, err := c.Pass(passCtx)
		cancel()
		took := clk.Since(start)
		metrics.Observe(r, err, took, clk.Now())
		attrs := []any{"duration", took.String(), "entriesPruned", r.EntriesPruned, "advertisementsDeleted", r.AdvertisementsDeleted,
			"recordsRemoved", r.RecordsRemoved, "tapsDetached", r.TapsDetached, "tapsReclaimed", r.TapsReclaimed,
			"tapsKept", r.TapsKept, "leasesRenewed", r.LeasesRenewed, "leasesReleased", r.LeasesReleased,
			"filterRebuilt", r.FilterRebuilt, "filterElementsAdded", r.FilterElementsAdded, "filterElementsRemoved", r.FilterElementsRemoved, "filterClassifiersAttached", r.FilterClassifiersAttached, "errors", r.Errors}
		if err != nil {
			opts.Log.Error("gc pass finished with errors", append(attrs, "error", err.Error())...)
		} else {
			opts.Log.Info("gc pass finished", attrs...)
		}
		if opts.Once {
			return err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		case <-clk.After(opts.Interval):
		}
	}
}
