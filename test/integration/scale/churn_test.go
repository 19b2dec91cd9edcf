package scale

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/scale"
)

// churnADDs is how many ADDs are timed idle and again under churn.
const churnADDs = 25

// scrape reads every metric of n's router in one request, so counters
// of one pass are read together; a metric not yet seen is absent (0).
func scrape(t *testing.T, n *node) map[string]float64 {
	t.Helper()
	body, err := n.Router.Get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, l := range strings.Split(body, "\n") {
		i := strings.LastIndexByte(l, ' ')
		if l == "" || l[0] == '#' || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

// routerCosts are the router's pass and lock counters at one moment.
type routerCosts struct {
	passes, writing, locked, lockedSum, passSum, changes, read float64
}

func costsOf(t *testing.T, n *node) routerCosts {
	m := scrape(t, n)
	return routerCosts{
		passes:    m[`galactic_router_passes_total{kernel="none"}`] + m[`galactic_router_passes_total{kernel="read"}`] + m[`galactic_router_passes_total{kernel="write"}`],
		writing:   m[`galactic_router_passes_total{kernel="write"}`],
		locked:    m["galactic_router_node_lock_held_seconds_count"],
		lockedSum: m["galactic_router_node_lock_held_seconds_sum"],
		passSum:   m["galactic_router_reconcile_duration_seconds_sum"],
		changes:   m["galactic_router_kernel_route_changes_total"],
		read:      m["galactic_router_kernel_objects_read_total"],
	}
}

func (c routerCosts) since(b routerCosts) routerCosts {
	return routerCosts{c.passes - b.passes, c.writing - b.writing, c.locked - b.locked, c.lockedSum - b.lockedSum,
		c.passSum - b.passSum, c.changes - b.changes, c.read - b.read}
}

// timedADDs attaches count workloads to VPC v of n, from address from
// on, and returns how long each ADD took.
func (top *topology) timedADDs(t *testing.T, n *node, v, from, count int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range count {
		name := fmt.Sprintf("lat%d-%d", top.id, from+i)
		conf := map[string]any{"cniVersion": "1.1.0", "name": vpcName(v) + "-" + name, "plugins": []any{
			map[string]any{"type": "galactic-cni", "vpc": vpcName(v), "attachment": name, "mode": "veth", "routing": "table",
				"addresses": []string{vpcAddr(v, from+i).String() + "/24"}},
			map[string]any{"type": "galactic-bgp", "vpc": vpcName(v), "attachment": name, "vni": vni(v)},
		}}
		n.WriteConflist(t, conf)
		start := time.Now()
		if out, err := n.CNITool("add", vpcName(v)+"-"+name, harness.NewContainer(t), "net0"); err != nil {
			t.Fatalf("ADD %s in %s: %v %s", name, vpcName(v), err, out)
		}
		out = append(out, time.Since(start))
	}
	return out
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestCNIAddsDuringRouteChurnWaitOnlyForTheRoutersWrites is must-show 3's
// mechanism: while the router imports 100 route changes a second, ADDs
// on its node succeed, and the router takes the node lock only in passes
// that write, for part of those passes (reading and computing are done
// without it). The ADD latencies idle and under churn are logged; the
// bench compares them.
func TestCNIAddsDuringRouteChurnWaitOnlyForTheRoutersWrites(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	sh := shape{vpcs: 10, sims: 4, prefixes: 50, hosted: [][]int{span(0, 10)}}
	spec := sh.simSpec(f.RR)
	spec.ChurnPerSecond = 100
	for v := range sh.vpcs {
		spec.ChurnVNIs = append(spec.ChurnVNIs, vni(v))
	}
	topologies++
	top := &topology{id: topologies, env: env, f: f, spec: spec}
	top.sims = scale.Start(t, f, spec)
	top = sh.withTopology(t, top, f.RR)
	n := top.nodes[0]
	top.checkKernels(t)

	idle := top.timedADDs(t, n, 0, 120, churnADDs)
	top.sims.StartChurn(t)
	eventually(t, 60*time.Second, "the churn reaching the kernel", func() error {
		if c := metric(n, "galactic_router_kernel_route_changes_total"); c < float64(top.wantRIB(n)+200) {
			return fmt.Errorf("%v kernel route changes", c)
		}
		return nil
	})
	before := costsOf(t, n)
	churned := top.timedADDs(t, n, 1, 120, churnADDs)
	d := costsOf(t, n).since(before)

	t.Logf("ADD idle p50 %s p99 %s; under 100 route changes/s p50 %s p99 %s (p99 ratio %.2f)",
		quantile(idle, 0.5), quantile(idle, 0.99), quantile(churned, 0.5), quantile(churned, 0.99),
		float64(quantile(churned, 0.99))/float64(quantile(idle, 0.99)))
	t.Logf("during the churned ADDs: %v passes, %v of them writing, %v kernel route changes, %.0f objects read a pass, lock held %.1f ms of %.1f ms of passes",
		d.passes, d.writing, d.changes, d.read/max(d.passes, 1), 1000*d.lockedSum, 1000*d.passSum)
	if path := os.Getenv(scale.EnvChurnResult); path != "" {
		data, _ := json.Marshal(scale.ChurnResult{ChurnPerSecond: spec.ChurnPerSecond, ADDs: churnADDs,
			IdleP50: quantile(idle, 0.5), IdleP99: quantile(idle, 0.99), ChurnP50: quantile(churned, 0.5), ChurnP99: quantile(churned, 0.99),
			LockHeld: time.Duration(d.lockedSum * float64(time.Second)), PassTime: time.Duration(d.passSum * float64(time.Second))})
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if d.changes == 0 || d.writing == 0 {
		t.Fatalf("no churn while the ADDs ran: %+v", d)
	}
	// A scrape may fall between a pass's two counters, at either end.
	if d.locked > d.writing+1 || d.locked < d.writing-1 {
		t.Errorf("the lock was taken %v times by %v writing passes of %v: only passes that write may take it", d.locked, d.writing, d.passes)
	}
	if d.lockedSum >= d.passSum {
		t.Errorf("the lock was held %.1f ms of %.1f ms of passes: reading and computing must be done without it", 1000*d.lockedSum, 1000*d.passSum)
	}
}
