package scale

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/scale"
)

// rss is a process's resident set in MiB.
func rss(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, "VmRSS:"), "kB")), &kb)
			return kb / 1024
		}
	}
	return -1
}

// TestAtTheIssuesScale is by default the issue's fabric: 200 simulated
// nodes, 1,000 VPCs of 100 routes (two nodes of 50 each: 100,000 routes),
// one real node hosting 20 VPCs, through the galactic reflector. It takes
// minutes and a lot of memory, so it runs only when GALACTIC_SCALE_LARGE
// is set: to 1 for that size, or to "<nodes>,<vpcs>,<prefixes per node
// and VPC>"; it reports what it saw.
func TestAtTheIssuesScale(t *testing.T) {
	size := os.Getenv("GALACTIC_SCALE_LARGE")
	if size == "" {
		t.Skip("the large fabric: set GALACTIC_SCALE_LARGE=1 (or <nodes>,<vpcs>,<prefixes>)")
	}
	sh := shape{vpcs: 1000, sims: 200, prefixes: 50, hosted: [][]int{span(0, 20)}, simNet: true}
	if size != "1" {
		if _, err := fmt.Sscanf(size, "%d,%d,%d", &sh.sims, &sh.vpcs, &sh.prefixes); err != nil || sh.vpcs < 20 || sh.sims < 4 || sh.prefixes > 99 {
			t.Fatalf("GALACTIC_SCALE_LARGE=%q: want 1 or <nodes>,<vpcs>,<prefixes> (vpcs at least 20, nodes at least 4, prefixes below 100)", size)
		}
	}
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	cfg := f.FabricReflectorConfig()
	cfg.ClientRanges = append(cfg.ClientRanges, "198.18.0.0/16")
	rr := f.StartReflector(t, env, cfg)
	if out, err := rr.Netns.Run("ip", "route", "add", "198.18.0.0/16", "dev", "ul0"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	start := time.Now()
	spec := sh.simSpec(rr.Addr)
	top := &topology{id: 1000, env: env, f: f, spec: spec}
	top.sims = scale.Start(t, f, spec)
	eventually(t, 15*time.Minute, "the reflector holds every route", func() error {
		if got, err := rr.Metric("galactic_router_reflector_paths"); err != nil || int(got) != spec.Routes() {
			return fmt.Errorf("%v of %d (%v)", got, spec.Routes(), err)
		}
		return nil
	})
	t.Logf("%d simulated nodes, %d routes: all at the reflector %s after start; reflector RSS %.0f MiB, simulated nodes' process RSS %.0f MiB",
		len(spec.Nodes), spec.Routes(), time.Since(start).Round(time.Millisecond), rss(rr.Pid()), rss(top.sims.Pid()))

	begin := time.Now()
	full := sh.withTopology(t, top, rr.Addr)
	n := full.nodes[0]
	full.waitRIBs(t, full.wantRIB)
	full.checkKernels(t)
	t.Logf("one real node in %d VPCs: %d routes installed %s after its router started (with its %d ADDs); adj-RIB-in %v, filtered %v; router RSS %.0f MiB",
		len(n.vpcs), full.wantRIB(n), time.Since(begin).Round(time.Millisecond), len(n.vpcs),
		metric(n, "galactic_router_adj_rib_in_paths"), metric(n, "galactic_router_import_filtered_paths"), rss(n.Router.Pid()))
	t.Logf("after: reflector RSS %.0f MiB", rss(rr.Pid()))
}
