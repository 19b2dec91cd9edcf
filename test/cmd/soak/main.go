// Command soak runs `make soak`: the demo's topology under a seeded random
// schedule of workload operations and faults with invariant checkers.
// SOAK_DURATION (default 10m) is how long the schedule runs, SOAK_SEED
// (default: the clock) replays a run, SOAK_STEPS replays only a prefix of
// its schedule, SOAK_REPORT names the markdown report (default
// soak-report.md), SOAK_TRACE a file that gets every change the checkers
// sample, SOAK_KEEP=1 keeps the daemons' logs and state, SOAK_VM=0 leaves
// the qemu guest out. It exits 1 on any violation.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/soak"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "soak: needs root (network namespaces, veths, policy routing): run `sudo make soak`")
		os.Exit(2)
	}
	o := soak.Options{Duration: 10 * time.Minute, Seed: uint64(time.Now().UnixNano()) % 1000000, Out: os.Stdout}
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "soak: SOAK_DURATION=%q: want a positive duration such as 10m\n", v)
			os.Exit(2)
		}
		o.Duration = d
	}
	for _, e := range []struct {
		name string
		dst  *uint64
	}{{"SOAK_SEED", &o.Seed}} {
		if v := os.Getenv(e.name); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "soak: %s=%q: want a non-negative integer\n", e.name, v)
				os.Exit(2)
			}
			*e.dst = n
		}
	}
	if v := os.Getenv("SOAK_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "soak: SOAK_STEPS=%q: want a positive integer\n", v)
			os.Exit(2)
		}
		o.Steps = n
	}
	o.Keep = os.Getenv("SOAK_KEEP") != ""
	o.VM = os.Getenv("SOAK_VM") != "0"
	if p := os.Getenv("SOAK_TRACE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			os.Exit(2)
		}
		defer f.Close()
		o.Trace = f
	}
	reportPath := os.Getenv("SOAK_REPORT")
	if reportPath == "" {
		reportPath = "soak-report.md"
	}
	ctx, stop, out := harness.SignalContext()
	defer stop()
	o.Out = out
	fmt.Fprintf(out, "soak: seed %d, duration %s (replay with SOAK_SEED=%d SOAK_DURATION=%s)\n", o.Seed, o.Duration, o.Seed, o.Duration)
	rep, err := soak.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	f, err := os.Create(reportPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	fmt.Fprintf(f, "## Soak run: seed %d, %s\n\n", rep.Seed, rep.Planned)
	rep.Markdown(f)
	f.Close()
	rep.Summary(out)
	fmt.Fprintln(out, "soak: report written to", reportPath)
	if len(rep.Violations) > 0 {
		os.Exit(1)
	}
}
