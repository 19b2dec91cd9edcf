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

// churnBlocks blocks of churnBlockADDs ADDs are timed idle and as many
// under churn, alternating, so a drift of the machine (or of the node,
// which holds more workloads with every ADD) falls on both alike; a p99
// over 200 ADDs is not their maximum.
const (
	churnBlocks    = 8
	churnBlockADDs = 25
)

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

func (c routerCosts) plus(b routerCosts) routerCosts {
	return routerCosts{c.passes + b.passes, c.writing + b.writing, c.locked + b.locked, c.lockedSum + b.lockedSum,
		c.passSum + b.passSum, c.changes + b.changes, c.read + b.read}
}

func (c routerCosts) since(b routerCosts) routerCosts {
	return routerCosts{c.passes - b.passes, c.writing - b.writing, c.locked - b.locked, c.lockedSum - b.lockedSum,
		c.passSum - b.passSum, c.changes - b.changes, c.read - b.read}
}

// timedADDs attaches count workloads to n, ADD i to VPC i%vpcs at
// address from+i/vpcs of it, and returns how long each ADD took.
func (top *topology) timedADDs(t *testing.T, n *node, vpcs, from, count int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range count {
		v, host := i%vpcs, from+i/vpcs
		name := fmt.Sprintf("lat%d-%d", top.id, host)
		conf := map[string]any{"cniVersion": "1.1.0", "name": vpcName(v) + "-" + name, "plugins": []any{
			map[string]any{"type": "galactic-cni", "vpc": vpcName(v), "attachment": name, "mode": "veth", "routing": "table",
				"addresses": []string{vpcAddr(v, host).String() + "/24"}},
			map[string]any{"type": "galactic-bgp", "vpc": vpcName(v), "attachment": name, "vni": vni(v)},
		}}
		n.WriteConflist(t, conf)
		// The container's netns is made outside the timing: it is the
		// runtime's part, and the harness's slows as namespaces pile up.
		ctr := harness.NewContainer(t)
		start := time.Now()
		if out, err := n.CNITool("add", vpcName(v)+"-"+name, ctr, "net0"); err != nil {
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

	// The ADDs take addresses 120 to 199 of the VPCs: the simulated
	// nodes' prefixes are below, the real node's workloads above.
	var idle, churned []time.Duration
	var d routerCosts
	next := 120
	timed := func() []time.Duration {
		ds := top.timedADDs(t, n, sh.vpcs, next, churnBlockADDs)
		next += (churnBlockADDs + sh.vpcs - 1) / sh.vpcs
		return ds
	}
	for b := range churnBlocks {
		// Which goes first alternates too.
		for _, churning := range []bool{b%2 == 1, b%2 == 0} {
			if !churning {
				idle = append(idle, timed()...)
				continue
			}
			from := metric(n, "galactic_router_kernel_route_changes_total")
			top.sims.StartChurn(t)
			harness.Eventually(t, 60*time.Second, "the churn reaching the kernel", func() error {
				if c := metric(n, "galactic_router_kernel_route_changes_total"); c < from+20 {
					return fmt.Errorf("%v kernel route changes since the churn started", c-from)
				}
				return nil
			})
			before := costsOf(t, n)
			churned = append(churned, timed()...)
			d = d.plus(costsOf(t, n).since(before))
			top.sims.PauseChurn(t)
		}
	}
	if next > 200 {
		t.Fatalf("the ADDs took addresses up to %d: the real node's workloads are from 200", next-1)
	}

	t.Logf("ADD idle p50 %s p99 %s; under 100 route changes/s p50 %s p99 %s (p99 ratio %.2f)",
		quantile(idle, 0.5), quantile(idle, 0.99), quantile(churned, 0.5), quantile(churned, 0.99),
		float64(quantile(churned, 0.99))/float64(quantile(idle, 0.99)))
	t.Logf("during the churned ADDs: %v passes, %v of them writing, %v kernel route changes, %.0f objects read a pass, lock held %.1f ms of %.1f ms of passes",
		d.passes, d.writing, d.changes, d.read/max(d.passes, 1), 1000*d.lockedSum, 1000*d.passSum)
	if path := os.Getenv(scale.EnvChurnResult); path != "" {
		data, _ := json.Marshal(scale.ChurnResult{ChurnPerSecond: spec.ChurnPerSecond, ADDs: len(churned), Block: churnBlockADDs,
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
