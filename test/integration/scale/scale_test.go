package scale

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

// appearBound is how soon a VPC appearing on a node must have its routes
// installed: the 1 s, with room for a loaded CI machine.
const appearBound = 3 * time.Second

// appear attaches a first workload of VPC v to n and returns how long its
// remote routes took to be installed, from the start of the ADD (the
// advertisement the router reacts to is written at its end).
func (top *topology) appear(t *testing.T, n *node, v int) time.Duration {
	t.Helper()
	start := time.Now()
	top.add(t, n, v)
	added := time.Since(start)
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s's routes of the new %s", n.Name, vpcName(v)), func() error {
		got, err := remoteRoutes(n, v)
		if err != nil {
			return err
		}
		if want := top.want(n, v); !slices.Equal(got, want) {
			return fmt.Errorf("installed %v, want %v", got, want)
		}
		return nil
	})
	took := time.Since(start)
	t.Logf("%s: a first workload of %s; ADD took %s, its %d remote routes were installed %s after the ADD began",
		n.Name, vpcName(v), added, len(top.want(n, v)), took)
	return took
}

func TestThroughTheGalacticReflectorEveryNodeReceivesOnlyItsVPCsRoutes(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	rr := f.StartReflector(t, env, f.FabricReflectorConfig())
	top := newTopology(t, env, f, rr.Addr)
	// With rtc the reflector sends each node its VPCs' routes and nothing
	// else: adj-RIB-in and RIB are equal, nothing is filtered.
	top.waitRIBs(t, top.wantRIB)
	for _, n := range top.nodes {
		if got := metric(n, "galactic_router_import_filtered_paths"); got != 0 {
			t.Errorf("%s filtered %v paths; with rtc the reflector sends none to filter", n.Name, got)
		}
		if got := metric(n, "galactic_router_route_target_memberships"); int(got) != len(n.vpcs) {
			t.Errorf("%s advertises %v memberships, want %d", n.Name, got, len(n.vpcs))
		}
	}
	top.checkKernels(t)
	if got, err := rr.Metric("galactic_router_reflector_paths"); err != nil || int(got) != top.spec.Routes()+30 {
		t.Errorf("the reflector holds %v paths (%v), want %d", got, err, top.spec.Routes()+30)
	}

	if took := top.appear(t, top.nodes[0], 50); took > appearBound {
		t.Errorf("a new VPC's routes took %s, want at most %s", took, appearBound)
	}
	top.waitRIBs(t, top.wantRIB)

	// A restarted router still negotiates rtc and still receives only its
	// VPCs' routes.
	restartRouter(t, top.nodes[1])
	top.waitRIBs(t, top.wantRIB)
	if got := metric(top.nodes[1], "galactic_router_import_filtered_paths"); got != 0 {
		t.Errorf("after a restart %s filtered %v paths: it did not negotiate rtc again", top.nodes[1].Name, got)
	}
}

func TestThroughFRRTheImportFilterKeepsAbsentVPCsOutOfTheRIB(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	top := newTopology(t, env, f, f.RR)
	// FRR speaks no rtc and sends every node every route; the filter
	// drops those of absent VPCs before the RIB and counts them.
	top.waitRIBs(t, top.everyRoute)
	for _, n := range top.nodes {
		want := top.everyRoute(n) - top.wantRIB(n)
		harness.Eventually(t, 10*time.Second, n.Name+"'s filtered paths", func() error {
			if got := metric(n, "galactic_router_import_filtered_paths"); int(got) != want {
				return fmt.Errorf("filtered %v, want %d", got, want)
			}
			return nil
		})
	}
	top.checkKernels(t)
	// The daemon's RIB holds its VPCs' paths and nothing else.
	for _, n := range top.nodes {
		if got := metric(n, "galactic_router_rib_paths"); int(got) != top.wantRIB(n) {
			t.Errorf("%s holds %v paths in its RIB, want %d: only its VPCs'", n.Name, got, top.wantRIB(n))
		}
	}

	if took := top.appear(t, top.nodes[0], 50); took > appearBound {
		t.Errorf("a new VPC's routes took %s, want at most %s", took, appearBound)
	}

	// A restart keeps its one session with FRR: the restarting router
	// offers rtc only to peers known to speak it, so FRR is never sent
	// what it cannot parse.
	n := top.nodes[1]
	from := f.LogOffset()
	restartRouter(t, n)
	top.waitRIBs(t, top.everyRoute)
	if lost := frrSessionsLost(t, f, from, n.Underlay); lost != 1 {
		t.Errorf("FRR lost %d sessions with %s across one restart, want the one the kill took", lost, n.Name)
	}
}

func TestARestartOfTheGalacticReflectorChangesNoKernelRoute(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	rr := f.StartReflector(t, env, f.FabricReflectorConfig())
	top := newTopology(t, env, f, rr.Addr)
	top.waitRIBs(t, top.wantRIB)
	top.checkKernels(t)
	var mons []*routeMonitor
	for _, n := range top.nodes {
		mons = append(mons, monitorRoutes(t, n))
	}
	eors := map[*node]int{}
	for _, n := range top.nodes {
		eors[n] = n.Router.LogCount(`"msg":"End-of-RIB"`)
	}
	rr.Kill()
	// The outage: every node's session drops.
	for _, n := range top.nodes {
		harness.Eventually(t, 30*time.Second, n.Name+" notices the reflector is gone", func() error {
			if v := metric(n, `galactic_router_peers{state="established"}`); v != 0 {
				return fmt.Errorf("%v established", v)
			}
			return nil
		})
	}
	if err := rr.Start(); err != nil {
		t.Fatal(err)
	}
	for _, n := range top.nodes {
		harness.Eventually(t, 30*time.Second, n.Name+"'s session back", func() error {
			if v := metric(n, `galactic_router_peers{state="established"}`); v != 1 {
				return fmt.Errorf("%v established", v)
			}
			return nil
		})
	}
	harness.Eventually(t, 30*time.Second, "the reflector holds every route again", func() error {
		if got, err := rr.Metric("galactic_router_reflector_paths"); err != nil || int(got) != top.spec.Routes()+30 {
			return fmt.Errorf("%v paths (%v), want %d", got, err, top.spec.Routes()+30)
		}
		return nil
	})
	// Each node's End-of-RIB from the returned reflector, and a pass after
	// it, sweep what it did not send again into the withdrawal hold; once
	// every RIB holds every path again, nothing is held: no route can go
	// later.
	for _, n := range top.nodes {
		harness.Eventually(t, 30*time.Second, n.Name+"'s End-of-RIB from the returned reflector", func() error {
			if got := n.Router.LogCount(`"msg":"End-of-RIB"`); got <= eors[n] {
				return fmt.Errorf("%d End-of-RIBs, had %d", got, eors[n])
			}
			return nil
		})
		harness.WaitPasses(t, 1, n.Router)
	}
	top.waitRIBs(t, top.wantRIB)
	top.checkKernels(t)
	for i, m := range mons {
		if l := m.lines(); len(l) != 0 {
			t.Errorf("%s's kernel routes changed while the reflector restarted:\n%s", top.nodes[i].Name, strings.Join(l, "\n"))
		}
	}
}
