// Command galactic-gc is the node GC daemon: every pass it prunes dead
// advertisement entries, reclaims detached taps, removes stale records and
// keeps handoff leases honest. Flags default to the node settings file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/galactic-cni/galactic/gc"
	"github.com/galactic-cni/galactic/pkg/settings"
)

func main() {
	if err := run(os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "galactic-gc:", err)
		os.Exit(1)
	}
}

func run(args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("galactic-gc", flag.ContinueOnError)
	config := fs.String("config", "", "node settings file (default $"+settings.EnvConfig+" or "+settings.DefaultConfig+")")
	nodeName := fs.String("node-name", "", "this node's name (default: node settings)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default: node settings)")
	namespace := fs.String("namespace", "", "namespace of the advertisements and leases (default: node settings)")
	stateDir := fs.String("state-dir", "", "galactic state dir (default: node settings)")
	interval := fs.Duration("interval", 30*time.Second, "time between passes; keep it below the handoff leaseSeconds")
	passTimeout := fs.Duration("pass-timeout", 0, "bound on one pass (default: the interval)")
	metricsAddr := fs.String("metrics-address", ":9402", "address of /metrics and /healthz; empty disables")
	once := fs.Bool("once", false, "run exactly one pass and exit non-zero if it had errors")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *config != "" {
		prev := getenv
		getenv = func(k string) string {
			if k == settings.EnvConfig {
				return *config
			}
			return prev(k)
		}
	}
	node, err := settings.Load(getenv)
	if err != nil {
		return err
	}
	for _, o := range []struct{ flag, field *string }{
		{nodeName, &node.NodeName}, {kubeconfig, &node.Kubeconfig}, {namespace, &node.Namespace}, {stateDir, &node.StateDir},
	} {
		if *o.flag != "" {
			*o.field = *o.flag
		}
	}
	if *interval <= 0 {
		return fmt.Errorf("--interval must be positive, got %s", *interval)
	}
	if *passTimeout <= 0 {
		*passTimeout = *interval
	}
	if *once {
		*metricsAddr = ""
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "galactic-gc", "node", node.NodeName)
	c, err := gc.NewCollector(node, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return gc.Run(ctx, c, gc.Options{Interval: *interval, PassTimeout: *passTimeout, MetricsAddress: *metricsAddr, Once: *once, Log: log})
}
