// Command bench runs `make bench`: every section of test/bench in one run
// on this machine, each figure next to its reference, written to
// docs/benchmarks.md (only from a tree that is its commit).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/galactic-cni/galactic/test/bench"
	"github.com/galactic-cni/galactic/test/harness"
)

func main() {
	quick := flag.Bool("quick", false, "development run: fewer iterations, GC sizes up to 1,000, fewer churn pairs")
	out := flag.String("out", bench.DefaultOut(), "Markdown report to write; empty writes none")
	allowDirty := flag.Bool("allow-dirty", false, "write docs/benchmarks.md although the tree differs from its commit (the report says so)")
	iterations := flag.Int("iterations", 0, "chain latency iterations per chain (default 200, quick 30)")
	only := flag.String("only", "", `run only this section (`+bench.SectionNames()+`), for development`)
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
	opts.Out, opts.GCProfile, opts.Only, opts.AllowDirty = *out, *gcProfile, *only, *allowDirty
	ctx, stop, story := harness.SignalContext()
	defer stop()
	if _, err := bench.Run(ctx, story, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench failed:", err)
		os.Exit(1)
	}
}
