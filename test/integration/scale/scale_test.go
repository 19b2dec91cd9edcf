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
// remote routes took to be installed after the ADD returned.
func (top *topology) appear(t *testing.T, n *node, v int) time.Duration {
	t.Helper()
	top.add(t, n, v)
	return eventually(t, 30*time.Second, fmt.Sprintf("%s's routes of the new %s", n.Name, vpcName(v)), func() error {
		got, err := remoteRoutes(n, v)
		if err != nil {
			return err
		}
		if want := top.want(n, v); !slices.Equal(got, want) {
			return fmt.Errorf("installed %v, want %v", got, want)
		}
		return nil
	})
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

	took := top.appear(t, top.nodes[0], 50)
	t.Logf("a VPC appearing on %s had its %d routes installed %s after ADD", top.nodes[0].Name, len(top.want(top.nodes[0], 50)), took)
	if took > appearBound {
		t.Errorf("a new VPC's routes took %s, want at most %s", took, appearBound)
	}
	top.waitRIBs(t, top.wantRIB)
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
		eventually(t, 10*time.Second, n.Name+"'s filtered paths", func() error {
			if got := metric(n, "galactic_router_import_filtered_paths"); int(got) != want {
				return fmt.Errorf("filtered %v, want %d", got, want)
			}
			return nil
		})
	}
	top.checkKernels(t)
	// Every best-path change the daemon was handed was one of its VPCs'.
	for _, n := range top.nodes {
		if got := metric(n, "galactic_router_received_updates_total"); int(got) != top.wantRIB(n) {
			t.Errorf("%s received %v best-path changes, want %d: one per path of its VPCs", n.Name, got, top.wantRIB(n))
		}
	}

	took := top.appear(t, top.nodes[0], 50)
	t.Logf("a VPC appearing on %s had its routes installed %s after ADD (from the adj-RIB-in)", top.nodes[0].Name, took)
	if took > appearBound {
		t.Errorf("a new VPC's routes took %s, want at most %s", took, appearBound)
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
	rr.Kill()
	// The outage: every node's session drops.
	for _, n := range top.nodes {
		eventually(t, 30*time.Second, n.Name+" notices the reflector is gone", func() error {
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
		eventually(t, 30*time.Second, n.Name+"'s session back", func() error {
			if v := metric(n, `galactic_router_peers{state="established"}`); v != 1 {
				return fmt.Errorf("%v established", v)
			}
			return nil
		})
	}
	eventually(t, 30*time.Second, "the reflector holds every route again", func() error {
		if got, err := rr.Metric("galactic_router_reflector_paths"); err != nil || int(got) != top.spec.Routes()+30 {
			return fmt.Errorf("%v paths (%v), want %d", got, err, top.spec.Routes()+30)
		}
		return nil
	})
	top.waitRIBs(t, top.wantRIB)
	// Past the withdrawal hold, so a route the restart removed would have
	// gone from the kernel by now.
	time.Sleep(12 * time.Second)
	top.checkKernels(t)
	for i, m := range mons {
		if l := m.lines(); len(l) != 0 {
			t.Errorf("%s's kernel routes changed while the reflector restarted:\n%s", top.nodes[i].Name, strings.Join(l, "\n"))
		}
	}
}
