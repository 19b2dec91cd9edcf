// Command bench runs `make bench`: chain latency against the upstream tap
// plugin, API requests per operation, plugin process cost, GC pass scaling,
// churn, a VM's start on a galactic tap, a pod sandbox's start and
// galactic-router against gobgpd, all in one run on this machine, and
// writes docs/benchmarks.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/galactic-cni/galactic/test/bench"
	"github.com/galactic-cni/galactic/test/harness"
)

func main() {
	quick := flag.Bool("quick", false, "development run: fewer iterations, GC sizes up to 1,000, fewer churn pairs")
	out := flag.String("out", filepath.Join(harness.RepoRoot(), "docs", "benchmarks.md"), "Markdown report to write; empty writes none")
	iterations := flag.Int("iterations", 0, "chain latency iterations per chain (default 200, quick 30)")
	only := flag.String("only", "", `run only this section ("chain latency", "API requests per operation", "plugin process cost", "churn", "GC pass scaling", "VM boot", "pod sandbox start", "Routing", "live migration", "tenant isolation"), for development`)
	gcProfile := flag.String("gc-profile", "", "write a CPU profile of one in-process GC pass at the largest size to this file")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (network namespaces, taps, policy routing): run `sudo make bench`")
		os.Exit(1)
	}
	opts := bench.DefaultOptions(*quick)
	if *iterations > 0 {
		opts.Iterations = *iterations
	}
	opts.Out, opts.GCProfile, opts.Only = *out, *gcProfile, *only
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := bench.Run(ctx, os.Stdout, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench failed:", err)
		os.Exit(1)
	}
}
