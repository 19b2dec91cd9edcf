package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/test/scale"
)

// RouteScaleResult is the route scale section: the router's per-pass
// cost, CNI ADD under route churn, and the large fabric.
type RouteScaleResult struct {
	Passes []PassRow
	// Churn is the ADD latency idle and under 100 route changes a second,
	// from test/integration/scale's churn test.
	Churn *scale.ChurnResult
	Large *scale.LargeResult
	// Large200 is the galactic reflector's row with 200 simulated nodes.
	Large200 *scale.LargeResult
	// LargeSize is the GALACTIC_SCALE_LARGE the large fabric ran with.
	LargeSize string
	// Timelines are each large row's router start, keyed by the row's
	// Via (with the node count for the 200-node run).
	Timelines map[string]Timeline
	// Failed names the large fabric's subtests that failed; their rows
	// are missing.
	Failed []string
}

// Timeline is when a router logged the steps of its start, from the start:
// its route-target membership sent, its session up, the End-of-RIB, its
// RIB counted synced, the first and the last routes installed.
type Timeline struct {
	Membership, SessionUp, EndOfRIB, RIBSynced, FirstRoutes, LastRoutes time.Duration
}

// PassRow is one case of router's BenchmarkKernelPass.
type PassRow struct {
	VPCs                int
	Kind                string
	Time                time.Duration
	Read, Writes        float64
	Locked              time.Duration
	Allocs, AllocsBytes float64
}

// routeScale runs the router's pass benchmark, the churn test and the
// large fabric test as go test subprocesses: they need the scale harness,
// which runs inside tests.
func (b *bench) routeScale() error {
	res := &RouteScaleResult{}
	b.res.RouteScale = res
	sizes := "1|100|1000"
	large := "1"
	if b.opts.Quick {
		sizes, large = "1|100", "20,100,50"
	}
	b.say("router passes at %s VPCs", sizes)
	out, err := exec.CommandContext(b.ctx, "go", "test", "-count=1", "-run", "^$", "-bench", "BenchmarkKernelPass/vpcs=("+sizes+")$/",
		"-benchtime", "10x", "-timeout", "60m", "./router/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("the pass benchmark: %w: %s", err, out)
	}
	res.Passes = parsePassBench(string(out))

	dir, err := os.MkdirTemp(b.dir, "scale-")
	if err != nil {
		return err
	}
	churn, largePath := filepath.Join(dir, "churn.json"), filepath.Join(dir, "large.json")
	b.say("CNI ADD idle and under route churn")
	cmd := exec.CommandContext(b.ctx, "go", "test", "-count=1", "-timeout", "30m", "-run", "TestCNIAddsDuringRouteChurn", "./test/integration/scale/")
	cmd.Env = append(os.Environ(), scale.EnvChurnResult+"="+churn)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the churn test: %w: %s", err, out)
	}
	res.Churn = &scale.ChurnResult{}
	if err := readJSON(churn, res.Churn); err != nil {
		return err
	}
	res.LargeSize = large
	if res.Large, err = b.largeFabric(res, large, "TestAtTheIssuesScale", largePath); err != nil {
		return err
	}
	if b.opts.Quick {
		return nil
	}
	// 200 simulated nodes, through the galactic reflector only: through
	// FRR every simulated node would hold the whole fabric (20 million
	// paths in one process).
	res.Large200, err = b.largeFabric(res, large200, `TestAtTheIssuesScale/^galactic_\(rtc\)$`, filepath.Join(dir, "large200.json"))
	return err
}

// large200 is the fabric of 200 simulated nodes, 1,000 VPCs and 50
// prefixes each.
const large200 = "200,1000,50"

// largeFabric runs the large fabric test's rows that run selects at size,
// keeping their routers' start timelines and the subtests that failed.
func (b *bench) largeFabric(res *RouteScaleResult, size, run, path string) (*scale.LargeResult, error) {
	b.say("the large fabric (%s=%s, %s)", scale.EnvLarge, size, run)
	cmd := exec.CommandContext(b.ctx, "go", "test", "-count=1", "-timeout", "180m", "-run", run, "-v", "./test/integration/scale/")
	cmd.Env = append(os.Environ(), scale.EnvLarge+"="+size, scale.EnvResult+"="+path)
	out, err := cmd.CombinedOutput()
	l := &scale.LargeResult{}
	if jerr := readJSON(path, l); jerr != nil {
		return nil, fmt.Errorf("the large fabric: %v: %s", cmp.Or(err, jerr), out)
	}
	// The rows that passed are kept when another failed; each row's
	// timeline says where its start's time went.
	suffix := ""
	if size == large200 {
		suffix = fmt.Sprintf(", %d nodes", l.Nodes)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if via, tl, ok := parseTimeline(line); ok {
			if res.Timelines == nil {
				res.Timelines = map[string]Timeline{}
			}
			res.Timelines[via+suffix] = tl
		}
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "--- FAIL: "); ok {
			name, _, _ = strings.Cut(name, " ")
			res.Failed = append(res.Failed, fmt.Sprintf("%s (%s=%s)", name, scale.EnvLarge, size))
		}
	}
	return l, nil
}

// parseTimeline reads the large fabric test's line "<via>: router start →
// route-target membership 78ms, session up 2.004s, End-of-RIB 2.143s, RIB
// synced 2.167s, first routes installed 2.085s, last 2.177s".
func parseTimeline(line string) (via string, tl Timeline, ok bool) {
	_, rest, found := strings.Cut(line, ".go:")
	if !found {
		return "", tl, false
	}
	_, rest, _ = strings.Cut(rest, ": ")
	via, steps, found := strings.Cut(rest, ": router start → ")
	if !found {
		return "", tl, false
	}
	fields := map[string]*time.Duration{"route-target membership": &tl.Membership, "session up": &tl.SessionUp, "End-of-RIB": &tl.EndOfRIB,
		"RIB synced": &tl.RIBSynced, "first routes installed": &tl.FirstRoutes, "last": &tl.LastRoutes}
	for _, step := range strings.Split(steps, ", ") {
		i := strings.LastIndexByte(step, ' ')
		if i < 0 {
			continue
		}
		d, err := time.ParseDuration(step[i+1:])
		if f, known := fields[step[:i]]; known && err == nil {
			*f = d
		}
	}
	return via, tl, true
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// parsePassBench reads `go test -bench` lines such as
// "BenchmarkKernelPass/vpcs=100/move-2  10  2711836 ns/op  471503 lock-ns/op ...".
func parsePassBench(out string) []PassRow {
	var rows []PassRow
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || !strings.HasPrefix(f[0], "BenchmarkKernelPass/") {
			continue
		}
		parts := strings.Split(f[0], "/")
		if len(parts) != 3 {
			continue
		}
		var row PassRow
		fmt.Sscanf(parts[1], "vpcs=%d", &row.VPCs)
		row.Kind = parts[2]
		if i := strings.LastIndexByte(parts[2], '-'); i > 0 {
			row.Kind = parts[2][:i]
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				row.Time = time.Duration(v)
			case "lock-ns/op":
				row.Locked = time.Duration(v)
			case "objects-read/op":
				row.Read = v
			case "writes/op":
				row.Writes = v
			case "allocs/op":
				row.Allocs = v
			case "B/op":
				row.AllocsBytes = v
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func renderRouteScale(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	rs := r.RouteScale
	if rs == nil {
		return
	}
	sectionHead(w, r, "route-scale")
	p("")
	p("The kernel part of one galactic-router pass (router's `BenchmarkKernelPass`, in a network namespace of its own), with the VPCs' domains made by galactic-cni's code and 100 remote routes each: `steady` is a pass after nothing changed, `move` one after one route's next hop moved, `full` the resync pass that reads everything.")
	p("")
	p("| VPCs | pass | time | netlink objects read | writes | lock held | allocations (bytes) |")
	p("|---|---|---|---|---|---|---|")
	for _, row := range rs.Passes {
		p("| %s | %s | %s | %.0f | %.0f | %s | %.0f (%s) |", thousands(row.VPCs), row.Kind, ms(row.Time), row.Read, row.Writes, ms(row.Locked),
			row.Allocs, mib(int64(row.AllocsBytes)))
	}
	p("")
	if c := rs.Churn; c != nil {
		p("CNI ADD on a node whose router imports %d route changes a second (test/integration/scale's churn test, same run: %d ADDs each, in alternating blocks of %d idle and %d under churn, so a drift of the machine or of the node, which holds more workloads with every ADD, falls on both): idle p50 %s p99 %s; under churn p50 %s p99 %s; p99 ratio **%.2f** (target ≤ 1.10). The router held the node lock %s of %s of passes while the churned ADDs ran.",
			c.ChurnPerSecond, c.ADDs, c.Block, c.Block, ms(c.IdleP50), ms(c.IdleP99), ms(c.ChurnP50), ms(c.ChurnP99), float64(c.ChurnP99)/float64(max(c.IdleP99, 1)),
			ms(c.LockHeld), ms(c.PassTime))
		p("")
	}
	if l := rs.Large; l != nil {
		p("The large fabric (`%s=%s`): %d simulated nodes (GoBGP speakers of galactic's speaker code in one process), %s VPCs, %s routes; one real node.", scale.EnvLarge, rs.LargeSize,
			l.Nodes, thousands(l.VPCs), thousands(l.Routes))
		p("")
		p("| via | node's VPCs | received | installed | router start → all installed | ADDs before the start | router CPU | router RSS after the churn, peak (per route) | live heap | reflector RSS | announce → kernel p50 / p99 under churn |")
		p("|---|---|---|---|---|---|---|---|---|---|---|")
		for _, row := range rs.largeRows() {
			p("| %s | %s | %s | %s | %s | %s | %s | %.0f MiB, %.0f MiB (%.1f KiB) | %.0f MiB | %.0f MiB | %s / %s (%d announces, %d updates/s) |", row.Via, thousands(row.VPCs), thousands(row.Received),
				thousands(row.Installed), ms(row.Took), ms(row.ADDs), ms(row.CPU), row.RSS, row.PeakRSS, 1024*max(row.RSS, row.PeakRSS)/float64(max(row.Installed, 1)),
				row.LiveHeap, row.ReflectorRSS, ms(row.AnnounceP50), ms(row.AnnounceP99), row.Announces, row.ChurnPerSecond)
		}
		p("")
		p("The galactic reflector in the same runs (%s sessions from the simulated nodes, plus the real node's, and %s in the run marked so):", thousands(l.Nodes), large200Nodes(rs))
		p("")
		p("| with | routes in (from the simulated nodes' start) | its CPU for them | RSS | CPU per churned update | propagation p50 / p99 under churn | sessions that came up again |")
		p("|---|---|---|---|---|---|---|")
		for _, row := range rs.largeRows() {
			if row.ReflectorRSS == 0 {
				continue
			}
			p("| %s | %s | %s | %.0f MiB | %s | %s / %s (%d) | %d |", row.Via, ms(row.Load), ms(row.LoadCPU), row.ReflectorRSS, ms(row.CPUPerUpdate),
				ms(row.PropagationP50), ms(row.PropagationP99), row.Propagated, row.Reestablished)
		}
		p("")
		if len(rs.Timelines) > 0 {
			p("Each real node's router start, from its start (its log):")
			p("")
			p("| via | route-target membership | session up | first routes installed | End-of-RIB | RIB synced | last route installed |")
			p("|---|---|---|---|---|---|---|")
			for _, row := range rs.largeRows() {
				if tl, ok := rs.Timelines[row.Via]; ok {
					p("| %s | %s | %s | %s | %s | %s | %s |", row.Via, ms(tl.Membership), ms(tl.SessionUp), ms(tl.FirstRoutes), ms(tl.EndOfRIB), ms(tl.RIBSynced), ms(tl.LastRoutes))
				}
			}
			p("")
		}
		if len(rs.Failed) > 0 {
			p("**Failed in this run**, so their rows are missing: %s.", strings.Join(rs.Failed, ", "))
			p("")
		}
		p("The node's VPCs and advertisements exist (its ADDs, %d at a time, done) before its router starts; start → installed is from the router's start to every route in the kernel. The reflector RSS is galactic's (0 with FRR).", l.ADDParallel)
		p("")
	}
}

// The large fabric's targets: a node behind an rtc reflector receives
// only its routes and has them within 2 s of its router's start; the node
// in every VPC has all within 10 s and within 300 MiB; each announce
// reaches the kernel within 20 ms p50 under churn; an ADD under churn
// keeps its p99 within 10% of idle.
const (
	routeScaleStart      = 2 * time.Second
	routeScaleEveryStart = 10 * time.Second
	routeScaleRSS        = 300 // MiB
	routeScaleAnnounce   = 20 * time.Millisecond
	routeScaleChurnRatio = 1.10
)

// routeScaleTargets judges the route scale section.
func (r *Results) routeScaleTargets() []Target {
	rs := r.RouteScale
	if rs == nil {
		return nil
	}
	var ts []Target
	judge := func(key, what, measured, ref string, met bool, miss string) {
		t := Target{Key: key, Section: "route-scale", What: what, Measured: measured, Ref: ref, Met: met}
		if !met {
			t.Miss = miss
		}
		ts = append(ts, t)
	}
	if c := rs.Churn; c != nil {
		q := float64(c.ChurnP99) / float64(max(c.IdleP99, 1))
		judge("scale-churn", "CNI ADD p99 under 100 route changes a second within 10% of idle", fmt.Sprintf("%.2f (%s)", q, ms(c.ChurnP99)),
			fmt.Sprintf("idle: %s", ms(c.IdleP99)), q <= routeScaleChurnRatio, fmt.Sprintf("%.0f%% over", 100*(q-routeScaleChurnRatio)))
	}
	for _, row := range rs.largeRows() {
		every := strings.Contains(row.Via, "every")
		switch {
		case every:
			judge("scale-every/"+row.Via, fmt.Sprintf("%s: %s routes installed within %s of the router's start", row.Via, thousands(row.Installed), routeScaleEveryStart),
				ms(row.Took), "≤ "+routeScaleEveryStart.String(), row.Took <= routeScaleEveryStart, ms(row.Took-routeScaleEveryStart)+" over")
			peak := max(row.RSS, row.PeakRSS)
			judge("scale-rss/"+row.Via, fmt.Sprintf("%s: router RSS at most %d MiB", row.Via, routeScaleRSS), fmt.Sprintf("peak %.0f MiB (%.1f KiB a route)", peak, 1024*peak/float64(max(row.Installed, 1))),
				fmt.Sprintf("≤ %d MiB", routeScaleRSS), peak <= routeScaleRSS, fmt.Sprintf("%.0f MiB over", peak-routeScaleRSS))
		case !strings.Contains(row.Via, "FRR"):
			judge("scale-received/"+row.Via, fmt.Sprintf("%s: the node receives only its %s routes", row.Via, thousands(row.Installed)), fmt.Sprintf("%s received", thousands(row.Received)),
				"its VPCs' routes", row.Received == row.Installed, fmt.Sprintf("%s more", thousands(row.Received-row.Installed)))
			judge("scale-start/"+row.Via, fmt.Sprintf("%s: all installed within %s of the router's start", row.Via, routeScaleStart), ms(row.Took),
				"≤ "+routeScaleStart.String(), row.Took <= routeScaleStart, ms(row.Took-routeScaleStart)+" over")
		}
		if !strings.Contains(row.Via, "FRR") {
			judge("scale-announce/"+row.Via, fmt.Sprintf("%s: one announce → kernel p50 under churn", row.Via), ms(row.AnnounceP50),
				"≤ "+ms(routeScaleAnnounce), row.AnnounceP50 <= routeScaleAnnounce, ms(row.AnnounceP50-routeScaleAnnounce)+" over")
		}
	}
	return ts
}

// routeScaleReason says where a missed route scale target's time or
// memory goes, from the row's own figures.
func (r *Results) routeScaleReason(t Target) string {
	rs := r.RouteScale
	family, via, _ := strings.Cut(t.Key, "/")
	if family == "scale-churn" {
		c := rs.Churn
		return fmt.Sprintf("A p99 of %d ADDs is their two slowest; the p50 under churn was %s against %s idle, and the router held the node lock %s of %s of passes while the churned ADDs ran.",
			c.ADDs, ms(c.ChurnP50), ms(c.IdleP50), ms(c.LockHeld), ms(c.PassTime))
	}
	var row *scale.LargeRow
	for _, x := range rs.largeRows() {
		if x.Via == via {
			row = &x
		}
	}
	tl, known := rs.Timelines[via]
	switch family {
	case "scale-start":
		if !known {
			return "GoBGP makes a new peer's first connection attempt a random 1.5 to 2 s after the peer is added (three quarters to all of its minimum connect-retry interval of 2 s, which no setting changes), so the row is met or missed by that draw."
		}
		return fmt.Sprintf("The session came up %s after the router's start: GoBGP makes a new peer's first connection attempt a random 1.5 to 2 s after the peer is added (three quarters to all of its minimum connect-retry interval of 2 s, which no setting changes). The remaining %s are the reflector's End-of-RIB and the install, so the row is met or missed by that draw.",
			ms(tl.SessionUp), ms(row.Took-tl.SessionUp))
	case "scale-every":
		if !known {
			return fmt.Sprintf("The router used %s of CPU for %s routes and 1,000 VXLAN devices on cores shared with the reflector and the simulated nodes.", ms(row.CPU), thousands(row.Installed))
		}
		return fmt.Sprintf("The session came up at %s and the reflector's End-of-RIB at %s; the routes were installed as they arrived (first at %s, last at %s). Over it the router used %s of CPU for %s routes and 1,000 VXLAN devices on cores it shares with the reflector and the simulated nodes, so the row moves with the CPU the machine gives it.",
			ms(tl.SessionUp), ms(tl.EndOfRIB), ms(tl.FirstRoutes), ms(tl.LastRoutes), ms(row.CPU), thousands(row.Installed))
	case "scale-rss":
		return fmt.Sprintf("The peak comes while the routes arrive: GoBGP's copy of what the peers sent and the router's own, with the collector's headroom (`GOGC=30`); after the load the live heap was %.0f MiB.", row.LiveHeap)
	case "scale-received":
		return "The reflector sent routes of route targets the node did not advertise: route-target constraint did not take effect for this session."
	case "scale-announce":
		return fmt.Sprintf("An announce goes from the simulated node through the reflector (p50 %s) to the node's router, whose %d passes under the churn took %s on average, and into the kernel.",
			ms(row.PropagationP50), row.ChurnPasses, ms(row.ChurnPassMean))
	}
	panic("no reason for route scale target " + t.Key)
}

// largeRows are the large fabric's rows, the 200-node run's marked so.
func (rs *RouteScaleResult) largeRows() []scale.LargeRow {
	var rows []scale.LargeRow
	if rs.Large != nil {
		rows = append(rows, rs.Large.Rows...)
	}
	if rs.Large200 != nil {
		for _, row := range rs.Large200.Rows {
			row.Via += fmt.Sprintf(", %d nodes", rs.Large200.Nodes)
			rows = append(rows, row)
		}
	}
	return rows
}

func large200Nodes(rs *RouteScaleResult) string {
	if rs.Large200 == nil {
		return "none"
	}
	return thousands(rs.Large200.Nodes)
}
