package bench

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/galactic-cni/galactic/pkg/advert"
)

// Results is everything one run measured.
type Results struct {
	Options  Options
	Machine  Machine
	Versions Versions
	Took     time.Duration
	Date     time.Time
	Chains   []*ChainResult
	Ops      []OpCount
	Binaries []BinarySize
	Procs    []*ProcResult
	Inits    []InitCost
	Kernel   *KernelFloor
	GC       []GCRow
	Churn    *ChurnResult
	VMs      []*VMBootResult
	CRI      []*CRIResult
	Routing  *RoutingResult
	// Migration is the live-migration section, one run per reflector.
	Migration []*MigrationResult
	// Cluster is pod start through the harness cluster.
	Cluster *ClusterBench
	// Isolation is the packet filter's share of ADD and DEL.
	Isolation *IsolationResult
	// RouteScale is the route scale section.
	RouteScale *RouteScaleResult
	// Controller is the control plane section.
	Controller *ControllerResult
	// Unattributed counts, by user agent, the proxied requests that named
	// no galactic program; the per-program counts cannot include them.
	Unattributed map[string]int
}

// The plugins' targets: a chain at most three times the reference tap's
// latency, API requests per plugin on the common path (galactic-bgp's
// ADD and DEL, galactic-cni's lease each way with handoff on), and a GC
// pass over 5,000 taps.
const (
	targetLatencyRatio  = 3.0
	targetAddRequests   = 3
	targetDelRequests   = 2
	targetLeaseRequests = 2
	targetGCTaps        = 5000
	targetGCPass        = 2 * time.Second
)

func (r *Results) chain(name string) *ChainResult {
	for _, c := range r.Chains {
		if c.Name == name && c.Skipped == "" && len(c.Add) > 0 {
			return c
		}
	}
	return nil
}

func (r *Results) op(common string) *OpCount {
	for i := range r.Ops {
		if r.Ops[i].Common == common && r.Ops[i].Skipped == "" {
			return &r.Ops[i]
		}
	}
	return nil
}

func (r *Results) proc(name string) *ProcResult {
	for _, p := range r.Procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func (r *Results) gcRow(taps int) *GCRow {
	for i := range r.GC {
		if r.GC[i].Taps == taps {
			return &r.GC[i]
		}
	}
	return nil
}

// Target is one target of the run: what is judged, against what, and the
// outcome.
type Target struct {
	// Key names the target for the reason given when it is missed; it does
	// not change with the figures.
	Key string
	// Section is the key of the section whose figures judge it.
	Section  string
	What     string
	Measured string
	// Ref is what the figure is compared with: a reference measured in the
	// same run, or the target's bound.
	Ref string
	Met bool
	// Miss says by how much, when not met.
	Miss string
}

// Targets judges the run against every target of its sections.
func (r *Results) Targets() []Target {
	var ts []Target
	ref := r.chain(ChainReference)
	for _, ch := range []struct{ name, label, key string }{{ChainGalactic, "handoff off", "off"}, {ChainHandoff, "handoff on", "on"}} {
		gal := r.chain(ch.name)
		if ref == nil || gal == nil {
			continue
		}
		for _, v := range []struct {
			verb     string
			gal, ref Sample
		}{{"ADD", gal.Add, ref.Add}, {"DEL", gal.Del, ref.Del}} {
			q := Ratio(v.gal.P50(), v.ref.P50())
			t := Target{Key: "chain-ratio/" + v.verb + "/" + ch.key, Section: "chain-latency",
				What:     fmt.Sprintf("galactic chain %s p50 (%s) at most %.0fx the reference", v.verb, ch.label, targetLatencyRatio),
				Measured: fmt.Sprintf("%s (%s)", ratio(q), ms(v.gal.P50())), Ref: fmt.Sprintf("reference `tap` %s p50 %s", v.verb, ms(v.ref.P50())), Met: q <= targetLatencyRatio}
			if !t.Met {
				over := v.gal.P50() - time.Duration(targetLatencyRatio*float64(v.ref.P50()))
				t.Miss = fmt.Sprintf("%s over (%.0f%%)", ms(over), 100*(q/targetLatencyRatio-1))
			}
			ts = append(ts, t)
		}
	}
	ts = append(ts, r.objectTargets()...)
	if len(r.Unattributed) > 0 {
		ts = append(ts, Target{Key: "api-unattributed", Section: "api-requests", What: "API requests counted per program (needed for the request targets)", Measured: r.unattributed(),
			Ref: "every request names its program", Miss: "the API request targets are not judged in this run"})
	}
	// The budgets are per plugin: galactic-bgp's and, with handoff on,
	// galactic-cni's lease; with handoff off galactic-cni makes none.
	for _, v := range []struct {
		common, verb, label string
		bgp, cni            int
	}{
		{"ADD", "ADD", "handoff off", targetAddRequests, 0}, {"DEL", "DEL", "handoff off", targetDelRequests, 0},
		{"ADD+handoff", "ADD", "handoff on", targetAddRequests, targetLeaseRequests}, {"DEL+handoff", "DEL", "handoff on", targetDelRequests, targetLeaseRequests},
	} {
		o := r.op(v.common)
		if o == nil || len(r.Unattributed) > 0 {
			continue
		}
		bgp, cni := o.Count(AgentBGP), o.Count(AgentCNI)
		rest := o.Count("") - bgp - cni
		lease := "none"
		if v.cni > 0 {
			lease = fmt.Sprintf("at most %d", v.cni)
		}
		t := Target{Key: "api-budget/" + v.common, Section: "api-requests",
			What:     fmt.Sprintf("%s (%s) on the common path: galactic-bgp at most %d API requests, galactic-cni %s", v.verb, v.label, v.bgp, lease),
			Measured: fmt.Sprintf("%d + %d", bgp, cni), Ref: fmt.Sprintf("budget %d + %d", v.bgp, v.cni), Met: bgp <= v.bgp && cni <= v.cni && rest == 0}
		if !t.Met {
			var over []string
			if bgp > v.bgp {
				over = append(over, fmt.Sprintf("galactic-bgp %d over", bgp-v.bgp))
			}
			if cni > v.cni {
				over = append(over, fmt.Sprintf("galactic-cni %d over", cni-v.cni))
			}
			if rest > 0 {
				over = append(over, fmt.Sprintf("%d by another program", rest))
			}
			t.Miss = strings.Join(over, ", ")
		}
		ts = append(ts, t)
	}
	if row := r.gcRow(targetGCTaps); row != nil {
		p := row.Pass.P50()
		t := Target{Key: "gc-pass", Section: "gc-pass-scaling", What: fmt.Sprintf("%s-tap GC pass", thousands(targetGCTaps)), Measured: ms(p),
			Ref: fmt.Sprintf("under %s", targetGCPass), Met: p < targetGCPass}
		if !t.Met {
			t.Miss = fmt.Sprintf("%s over (%.1fx the target)", ms(p-targetGCPass), float64(p)/float64(targetGCPass))
		}
		ts = append(ts, t)
	}
	if len(r.GC) > 0 && len(r.Unattributed) == 0 {
		var lists []string
		constant := true
		for _, row := range r.GC {
			lists = append(lists, fmt.Sprintf("%d at %s", row.Lists(), thousands(row.Taps)))
			constant = constant && row.Lists() == r.GC[0].Lists()
		}
		t := Target{Key: "gc-lists", Section: "gc-pass-scaling", What: "list requests per GC pass", Measured: strings.Join(lists, ", "), Ref: "the same at every size", Met: constant}
		if !constant {
			t.Miss = "the number of lists grows with the taps"
		}
		ts = append(ts, t)
	}
	ts = append(ts, r.routingTargets()...)
	ts = append(ts, r.migrationTargets()...)
	ts = append(ts, r.isolationTargets()...)
	ts = append(ts, r.routeScaleTargets()...)
	ts = append(ts, r.clusterTargets()...)
	return append(ts, r.controllerTargets()...)
}

// unattributed describes the requests that named no galactic program.
func (r *Results) unattributed() string {
	var parts []string
	for _, a := range sortedKeys(r.Unattributed) {
		parts = append(parts, fmt.Sprintf("%d with user agent `%s`", r.Unattributed[a], a))
	}
	return strings.Join(parts, ", ")
}

func (o OpCount) describeAll() string {
	var parts []string
	for _, a := range []string{AgentCNI, AgentBGP, AgentGC} {
		if o.Count(a) > 0 {
			parts = append(parts, a+": "+o.Describe(a))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	if len(s) <= 3 {
		return s
	}
	return thousands(n/1000) + "," + s[len(s)-3:]
}

// section is one numbered section of the report. Its key is also the
// HTML anchor before its heading, which stays when the numbers change.
type section struct {
	key, title string
	present    func(*Results) bool
	render     func(*strings.Builder, *Results)
}

// sections are the report's numbered sections, in order.
func sections() []section {
	return []section{
		{"chain-latency", "Chain ADD and DEL latency through cnitool", func(r *Results) bool { return len(r.Chains) > 0 }, renderChains},
		{"api-requests", "API requests per operation", func(r *Results) bool { return len(r.Ops) > 0 }, renderOps},
		{"process-cost", "Plugin process cost", func(r *Results) bool { return len(r.Procs) > 0 || len(r.Binaries) > 0 }, renderProcs},
		{"gc-pass-scaling", "GC pass scaling", func(r *Results) bool { return len(r.GC) > 0 }, renderGC},
		{"churn", "Churn", func(r *Results) bool { return r.Churn != nil }, renderChurn},
		{"vm-boot", "A VM's start next to the chain's ADD", func(r *Results) bool { return len(r.VMs) > 0 }, renderVMs},
		{"pod-sandbox-start", "Pod sandbox start under containerd", func(r *Results) bool { return len(r.CRI) > 0 }, renderCRI},
		{"routing", "Routing", func(r *Results) bool { return r.Routing != nil }, renderRouting},
		{"live-migration", "Live migration", func(r *Results) bool { return len(r.Migration) > 0 }, renderMigration},
		{"cluster-pod-start", "Pod start through the whole cluster", func(r *Results) bool { return r.Cluster != nil }, renderCluster},
		{"tenant-isolation", "Tenant isolation: the filter's share of ADD, DEL and forwarding", func(r *Results) bool { return r.Isolation != nil }, renderIsolation},
		{"route-scale", "Route scale", func(r *Results) bool { return r.RouteScale != nil }, renderRouteScale},
		{"controller", "The control plane: galactic-controller", func(r *Results) bool { return r.Controller != nil }, renderController},
	}
}

// heading is the numbered heading of section key: sections are numbered
// in order among those the run measured.
func (r *Results) heading(key string) string {
	n := 0
	for _, s := range sections() {
		if s.present(r) {
			n++
		}
		if s.key == key {
			return fmt.Sprintf("%d. %s", n, s.title)
		}
	}
	panic("no section " + key)
}

// sec names section key in the text: "section 4", or its title when the
// run did not measure it.
func (r *Results) sec(key string) string {
	for _, s := range sections() {
		if s.key == key {
			if !s.present(r) {
				return fmt.Sprintf("the section %q (not in this run)", s.title)
			}
			n, _, _ := strings.Cut(r.heading(key), ".")
			return "section " + n
		}
	}
	panic("no section " + key)
}

// secLink is sec as a link to the section.
func (r *Results) secLink(key string) string {
	for _, s := range sections() {
		if s.key == key && s.present(r) {
			return fmt.Sprintf("[%s](#%s)", r.sec(key), key)
		}
	}
	return r.sec(key)
}

// sectionHead writes section key's anchor and numbered heading.
func sectionHead(w *strings.Builder, r *Results, key string) {
	fmt.Fprintf(w, "<a id=\"%s\"></a>\n\n## %s\n", key, r.heading(key))
}

// anchor is the fragment GitHub gives a heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(heading) {
		switch {
		case c == ' ':
			b.WriteRune('-')
		case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c):
			b.WriteRune(c)
		}
	}
	return b.String()
}

// Render writes the report as Markdown.
func Render(r *Results) string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format+"\n", args...) }

	p("# Benchmarks")
	p("")
	p("<!-- Generated by `make bench` (test/cmd/bench, test/bench). Edit the generator, not this file. -->")
	p("")
	if len(r.Versions.Dirty) > 0 {
		p("> **Not the report of a commit.** The tree differed from its commit (%s) when this run began, in `%s`. Its figures belong to no commit; `make bench` writes docs/benchmarks.md only from a clean tree.", r.Versions.Galactic, strings.Join(r.Versions.Dirty, "`, `"))
		p("")
	}
	p("What galactic's ADD, DEL, GC pass, routing, live migration and packet filter cost, each figure measured on the machine below in one run, next to a reference measured in the same run or a target's bound. Latency is wall time of real processes against a real kube-apiserver and etcd on the same two cores, so absolute figures move with the machine's load; the ratios are what to compare across runs.")
	if r.Options.Quick {
		p("")
		p("> **Quick run** (`-quick`): fewer iterations and smaller sizes than `make bench`; for development only.")
	}
	if r.Options.Only != "" {
		p("")
		p("> **One section only** (`-only %q`); the others were not run.", r.Options.Only)
	}
	p("")
	renderSummary(&w, r)
	renderRerun(&w, r)
	renderMachine(&w, r)
	for _, s := range sections() {
		if s.present(r) {
			s.render(&w, r)
		}
	}
	renderWhere(&w, r)
	renderMissed(&w, r)
	p("---")
	p("[← Running the bench](contributing/bench.md) · [Documentation map](README.md)")
	return w.String()
}

func renderRerun(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## How to rerun")
	p("")
	p("```sh")
	p("sudo make bench                                    # builds bin/, runs everything, rewrites docs/benchmarks.md (from a clean tree only)")
	p("sudo make bench BENCH_FLAGS=-quick                  # development: fewer iterations and smaller sizes")
	p("sudo go run ./test/cmd/bench -quick -out /tmp/b.md  # the same, writing elsewhere")
	p("sudo go run ./test/cmd/bench -quick -only \"VM boot\" -out /tmp/vm.md # one section only, for development")
	p("```")
	p("")
	p("`-only` takes %s. `-iterations N` changes the chain latency loop (default %d after %d warm-up rounds); `-gc-profile FILE` writes a CPU profile of one GC pass at the largest size. See [running the bench](contributing/bench.md).",
		SectionNames(), DefaultOptions(false).Iterations, DefaultOptions(false).Warmup)
	p("")
	p("It needs root (network namespaces, taps, policy routing), FRR and gobgpd for the routing sections and qemu for the VMs (`hack/install-deps.sh` installs them). This run took %s. Other load on the machine shows up in the absolute figures; the load average is recorded below. Each section waits, up to %s, until the CPUs are at most %.0f%% busy, so what the section before it left running (namespaces the kernel is still tearing down, processes exiting) does not fall on its figures.", r.Took.Round(time.Second), settleMax, 100*quiet)
	p("")
}

func renderMachine(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	m, v := r.Machine, r.Versions
	p("## Machine and versions")
	p("")
	p("| | |")
	p("|---|---|")
	p("| run | %s, took %s |", r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Took.Round(time.Second))
	p("| CPUs (nproc) | %d |", m.CPUs)
	p("| CPU model | %s |", m.Model)
	p("| kernel | %s |", m.Kernel)
	p("| Go | %s |", m.Go)
	p("| processes at start | %d |", m.Processes)
	p("| load average (1, 5, 15 min) at start / end | %s / %s |", m.LoadStart, m.LoadEnd)
	if len(m.Sections) > 0 {
		var parts []string
		for _, s := range m.Sections {
			parts = append(parts, fmt.Sprintf("%s %.0f%% (waited %s)", s.Name, 100*s.Busy, s.Waited.Round(time.Second)))
		}
		p("| CPUs busy as each section began (each waits up to %s for at most %.0f%%) | %s |", settleMax, 100*quiet, strings.Join(parts, ", "))
	}
	p("| galactic | %s |", v.Galactic)
	p("| reference plugins (`tap`, `static`, `loopback`) | github.com/containernetworking/plugins %s |", v.Plugins)
	p("| cnitool, libcni | github.com/containernetworking/cni %s |", v.CNI)
	p("| client-go | %s |", v.ClientGo)
	p("| kube-apiserver | %s |", v.APIServer)
	p("| etcd | %s |", v.Etcd)
	p("| container runtime (pod sandbox section) | %s |", v.CRI)
	p("")
}

// renderSummary is the table at the top: every target, its figure, what
// it is compared with and whether it is met.
func renderSummary(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	ts := r.Targets()
	p("## Summary")
	p("")
	if len(ts) == 0 {
		p("No target was measured in this run.")
		p("")
		return
	}
	met := 0
	for _, t := range ts {
		if t.Met {
			met++
		}
	}
	p("%d of %d targets met. Each row's figures are in the section it names; every missed target's reason is under [missed targets](#missed-targets).", met, len(ts))
	p("")
	p("| target | measured | compared with | | section |")
	p("|---|---|---|---|---|")
	for _, t := range ts {
		verdict := "met"
		if !t.Met {
			verdict = "**missed**: " + t.Miss
		}
		p("| %s | %s | %s | %s | %s |", t.What, t.Measured, t.Ref, verdict, r.secLink(t.Section))
	}
	p("")
}

func renderChains(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "chain-latency")
	p("")
	p("The real `cnitool` runs each network config list inside a node network namespace against a container namespace, one workload at a time: ADD, then DEL, %d times per chain after %d warm-up rounds. The chains take turns in a rotating order, so load from elsewhere falls on all of them alike. cnitool is started in the node namespace directly (not through `ip netns exec`, which would add a constant to every row and flatter the ratios). Each galactic VPC keeps one resident attachment on the node, so the loop measures attaching to a VPC whose routing table already exists, the common case on a node that runs workloads.", r.Options.Iterations, r.Options.Warmup)
	p("")
	p("- **reference**: upstream `tap` (%s) creating a tap in the container namespace, with the `static` IPAM plugin: the same two addresses, an IPv4 gateway and a default route, nothing remote.", r.Versions.Plugins)
	p("- **galactic chain**: `galactic-cni` (tap mode, `routing: table`, the same addresses, MTU %d) and `galactic-bgp`, against the embedded API server; handoff off, and handoff on (`waitSeconds` 5, `leaseSeconds` 15), where every ADD finds the lease free because the DEL before released it.", benchMTU)
	p("- **galactic chain, VPCAttachment**: the same chain, handoff off and on, with a stanza that names a VPCAttachment (`namespace` + `attachment`) instead of an inline attachment: its VPC (own subnets, a resident attachment of its own) and the attachments (the same kind of addresses, requested) were made once before the loop and made Ready by a `galactic-controller` running beside the API server (its defaults, so it writes a lease's or advertisement's change into the attachment's status a second later, `--status-batch-period`); each ADD reads the attachment, each DEL works from the node record. Its ADD target compares the handoff-on pair (both galactic-cni's make an API client for the lease), its DEL target the handoff-off pair, with the inline chains of the same run.")
	p("- **galactic-cni alone** and the **floor** (cnitool with the trivial `loopback` plugin) split the chain's time into parts; they are not targets.")
	p("")
	ref := r.chain(ChainReference)
	p("| chain | plugins | ADD p50 | ADD p90 | ADD p99 | ADD p50 / ref | DEL p50 | DEL p90 | DEL p99 | DEL p50 / ref |")
	p("|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range r.Chains {
		if c.Skipped != "" {
			p("| %s | %s | not measured: %s | | | | | | | |", c.Name, c.Plugins, c.Skipped)
			continue
		}
		ra, rd := math.NaN(), math.NaN()
		if ref != nil {
			ra, rd = Ratio(c.Add.P50(), ref.Add.P50()), Ratio(c.Del.P50(), ref.Del.P50())
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", c.Name, c.Plugins,
			ms(c.Add.P50()), ms(c.Add.P90()), ms(c.Add.P99()), ratio(ra),
			ms(c.Del.P50()), ms(c.Del.P90()), ms(c.Del.P99()), ratio(rd))
	}
	p("")
}

func renderOps(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "api-requests")
	p("")
	p("Counted, not timed. The nodes' kubeconfig points at a TLS-terminating reverse proxy in the bench process (its own CA, `127.0.0.1`, forwarded into each node namespace); it relays every request to the API server and records method, path, status and the client's user agent, which client-go sets to the program's name. The counts below are exactly the requests the plugins and `galactic-gc --once` sent, by program; the bench's own setup and checks do not pass through the proxy, and its in-process GC passes (%s), which do, carry the bench's own user agent and are not counted. The reference chain makes none by construction.", r.sec("gc-pass-scaling"))
	p("")
	if len(r.Unattributed) > 0 {
		p("> **The counts below are incomplete**: the proxy relayed %s, which name no program, so they are in no row. A galactic client must send its program's name as its user agent on the HTTP client that carries its requests (client-go's `rest.DefaultKubernetesUserAgent`).", r.unattributed())
		p("")
	}
	p("| operation | galactic-cni | galactic-bgp | galactic-gc | total | requests |")
	p("|---|---|---|---|---|---|")
	for _, o := range r.Ops {
		if o.Skipped != "" {
			p("| %s | | | | | not measured: %s |", o.Op, o.Skipped)
			continue
		}
		desc := o.describeAll()
		if o.Note != "" {
			desc += " — pass: " + o.Note
		}
		p("| %s | %d | %d | %d | **%d** | %s |", o.Op, o.Count(AgentCNI), o.Count(AgentBGP), o.Count(AgentGC), o.Count(""), desc)
	}
	p("")
}

func renderProcs(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "process-cost")
	p("")
	p("| binary | size |")
	p("|---|---|")
	for _, b := range r.Binaries {
		p("| %s | %s |", b.Name, mib(b.Bytes))
	}
	p("")
	p("Each binary run directly in the node namespace as a runtime runs it (stdin config, CNI_* environment), %d times. `VERSION` is the cost of starting the program at all. Wall time is fork to reaped; CPU is user+system from the process's rusage. Peak RSS comes from separate runs under `/usr/bin/time` (Go's own exec makes the child with vfork, so its `ru_maxrss` would report the parent's high-water mark); for `tap`, which runs `static` and waits for it, it is the larger of the two. For the programs that call the API, the proxy's timestamps give the time from exec to the first accepted connection (program start, config, client setup), to the first request's headers (plus the TLS handshake) and to the last response.", r.Options.ProcessRuns)
	p("")
	p("| invocation | wall p50 | wall p90 | CPU p50 | peak RSS | first connection | first request | last response | requests |")
	p("|---|---|---|---|---|---|---|---|---|")
	for _, pr := range r.Procs {
		fc, fr, lr, reqs := "", "", "", ""
		if len(pr.FirstRequest) > 0 {
			fc, fr, lr, reqs = ms(pr.FirstConn.P50()), ms(pr.FirstRequest.P50()), ms(pr.LastResponse.P50()), fmt.Sprint(pr.Requests)
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |", pr.Name, ms(pr.Wall().P50()), ms(pr.Wall().P90()), ms(pr.CPU().P50()), mib(pr.MaxRSS()), fc, fr, lr, reqs)
	}
	if len(r.Inits) > 0 {
		p("")
		p("Package initialisation before `main`, from `GODEBUG=inittrace=1` on `VERSION`, %d runs each: the p50 of each run's summed init clock time, and the costliest packages by their mean:", r.Options.ProcessRuns)
		p("")
		p("| binary | packages initialised | init time p50 | costliest packages (mean) |")
		p("|---|---|---|---|")
		for _, ic := range r.Inits {
			var top []string
			for _, t := range ic.Top {
				top = append(top, fmt.Sprintf("`%s` %s", t.Name, ms(t.Mean)))
			}
			p("| %s | %d | %s | %s |", ic.Binary, ic.Packages, ms(ic.Total.P50()), strings.Join(top, ", "))
		}
	}
	if len(r.GC) > 0 {
		last := r.GC[len(r.GC)-1]
		p("")
		p("`galactic-gc --once` over %s taps peaked at %s RSS (%s).", thousands(last.Taps), mib(last.RSS), r.sec("gc-pass-scaling"))
	}
	p("")
}

func renderGC(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	if len(r.GC) == 0 {
		return
	}
	sectionHead(w, r, "gc-pass-scaling")
	p("")
	p("One node grown to each size: that many galactic taps (created with netlink, galactic's name and ifalias, up, no VMM attached), as many node records (pkg/state) and as many advertisements with one live entry each (created with the typed client), all entries pointing at one live container namespace. That is a node of idle attachments: a steady pass keeps everything and changes nothing, and the bench fails if it collects anything. Each pass is a run of the real `galactic-gc --once` in the node (under /usr/bin/time for its peak RSS); `pass` is the duration it logs for the pass itself, `wall` includes its start-up and client set-up. %d steady passes per size, after two that make every tap a known sighting. Then, in the bench process inside the node, the same `gc.Collector.Pass` (`in-process`) and its parts on their own: `gc.NodeKernel.Taps` (list the links, scan /proc once for the processes holding tun fds, then take each tap's status from that scan), reading the records, and the one advertisement list.", r.Options.GCPasses)
	p("")
	p("| taps | pass p50 | per tap | wall p50 | peak RSS | requests (lists) | in-process pass | tap scan | records | advert list |")
	p("|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range r.GC {
		p("| %s | %s | %.0f µs | %s | %s | %d (%d) | %s | %s | %s | %s |", thousands(row.Taps), ms(row.Pass.P50()),
			float64(row.Pass.P50())/float64(time.Microsecond)/float64(row.Taps), ms(row.Wall.P50()), mib(row.RSS),
			len(row.Requests), row.Lists(), ms(row.InProcess.P50()), ms(row.TapScan), ms(row.RecordRead), ms(row.AdvertList))
	}
	p("")
	p("%s", gcGrowth(r))
	p("")
}

// gcGrowth says whether the pass grows linearly, from the per-tap cost
// of the smallest and largest size.
func gcGrowth(r *Results) string {
	if len(r.GC) < 2 {
		return ""
	}
	first, last := r.GC[0], r.GC[len(r.GC)-1]
	a := float64(first.Pass.P50()) / float64(first.Taps)
	b := float64(last.Pass.P50()) / float64(last.Taps)
	sizeX := float64(last.Taps) / float64(first.Taps)
	timeX := float64(last.Pass.P50()) / float64(first.Pass.P50())
	verdict := "linear or better"
	if b > 1.5*a {
		verdict = "worse than linear"
	}
	requests := "The number of requests does not depend on the size."
	if len(r.Unattributed) > 0 {
		requests = fmt.Sprintf("The requests were not counted in this run (see %s).", r.sec("api-requests"))
	}
	for _, row := range r.GC {
		if len(row.Requests) != len(first.Requests) {
			requests = "**The number of requests grows with the size.**"
		}
	}
	return fmt.Sprintf("From %s to %s taps (%.0fx) the pass grew %.1fx: per-tap cost %.0f µs → %.0f µs, **%s**. %s",
		thousands(first.Taps), thousands(last.Taps), sizeX, timeX, a/1e3, b/1e3, verdict, requests)
}

func renderChurn(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	c := r.Churn
	if c == nil {
		return
	}
	sectionHead(w, r, "churn")
	p("")
	p("%d ADD/DEL pairs of distinct containers (each its own network namespace, made beforehand) of **one attachment on one node**, %d at a time through cnitool, handoff off. Every container's entry lands in the same advertisement, so the writers race for one object: each write carries the resourceVersion it read and a loser re-reads and retries. The node's kubeconfig points at the counting proxy.", c.Pairs, c.Parallelism)
	p("")
	p("| | |")
	p("|---|---|")
	p("| wall time | %s |", c.Wall.Round(time.Millisecond))
	p("| throughput | %.1f pairs/s (%.1f operations/s) |", float64(c.Pairs)/c.Wall.Seconds(), 2*float64(c.Pairs)/c.Wall.Seconds())
	p("| ADD p50 / p99 under churn | %s / %s |", ms(c.Add.P50()), ms(c.Add.P99()))
	p("| DEL p50 / p99 under churn | %s / %s |", ms(c.Del.P50()), ms(c.Del.P99()))
	p("| of which galactic-bgp ADD p50 / p99 (its log) | %s / %s |", ms(c.BGPAdd.P50()), ms(c.BGPAdd.P99()))
	p("| of which galactic-bgp DEL p50 / p99 (its log) | %s / %s |", ms(c.BGPDel.P50()), ms(c.BGPDel.P99()))
	p("| failed operations | %d |", len(c.Failures))
	for i, f := range c.Failures {
		if i == 3 {
			p("| | and %d more |", len(c.Failures)-3)
			break
		}
		p("| | `%s` |", strings.NewReplacer("|", "\\|", "\n", " ").Replace(f))
	}
	p("| galactic-bgp requests | %d (%.1f per pair) |", c.Requests, float64(c.Requests)/float64(c.Pairs))
	p("| conflicts retried (409 from the API server) | %d, %.2f per operation, at most %d in one verb (galactic-bgp's own log counts %d: the 409s and the 404s below) |", c.Conflicts, float64(c.Conflicts)/float64(2*c.Pairs), c.MaxConflicts, c.LoggedConflicts)
	p("| writes that found the object deleted (404, retried) | %d |", c.Raced)
	p("| galactic-bgp verbs that gave up (succeeded, leaving their API work to the node GC) | %d |", len(c.GaveUp))
	for i, k := range sortedKeys(c.GaveUp) {
		if i == 3 {
			p("| | and %d more |", len(c.GaveUp)-3)
			break
		}
		p("| | %s: `%s` |", k, strings.NewReplacer("|", "\\|", "\n", " ").Replace(c.GaveUp[k]))
	}
	p("| left afterwards: advertisements / entries of the node | %d / %d %s |", c.Adverts, c.Entries, codeList(c.LeftEntries))
	if c.AfterGC != nil {
		p("| entries left after one `galactic-gc --once`, the containers' namespaces deleted | %d (the pass: %s) |", *c.AfterGC, c.GCSummary)
	}
	p("| left afterwards: node records | %d |", c.Records)
	p("| left afterwards: galactic taps | %d |", c.Taps)
	p("| policy rules and routes changed from before (baseline after one pair: a node's first ADD moves the kernel's `local` rule for good) | %d |", len(c.RulesRoutesChanged))
	for _, l := range c.RulesRoutesChanged {
		p("| | `%s` |", l)
	}
	p("")
	if len(c.BGPAdd) > 0 && len(c.Add) > 0 {
		p("Under churn galactic-bgp's own part (from its log) is %s of the chain's %s ADD p50 and %s of its %s DEL p50. Eight writers of one object lose races; each loser re-reads and retries after a jittered backoff (%s doubling to %s, `advert.DefaultBackoff`), so the tail grows with the number of writers, not with the work. The rest is cnitool and galactic-cni sharing two cores eight ways (galactic-cni also serialises its kernel changes on the node lock).",
			ms(c.BGPAdd.P50()), ms(c.Add.P50()), ms(c.BGPDel.P50()), ms(c.Del.P50()), ms(advert.DefaultBackoff.Initial), ms(advert.DefaultBackoff.Max))
		p("")
	}
	switch {
	case c.Adverts+c.Entries+c.Records+c.Taps+len(c.RulesRoutesChanged) == 0:
		p("Nothing leaked: no advertisement, entry, record, tap, rule or route of the churn is left.")
	case c.Records+c.Taps+len(c.RulesRoutesChanged) == 0 && c.AfterGC != nil && *c.AfterGC == 0 && c.gaveUpAll():
		p("Nothing leaked for good. No record, tap, rule or route is left. %d of the %d DELs gave up retrying under contention (the reasons above) and left their %d entries for the node GC, as galactic-bgp's DEL does so that galactic-cni's DEL still runs; one `galactic-gc --once`, run once the containers' namespaces were gone, removed them. Until such a pass a stale entry stays advertised for a container that no longer exists.",
			c.gaveUp("DEL"), c.Pairs, c.Entries)
	default:
		p("**Something leaked** (see the table).")
	}
	p("")
}

// gaveUpAll reports whether every entry left belongs to a DEL that gave up.
func (c *ChurnResult) gaveUpAll() bool {
	for _, id := range c.LeftEntries {
		if _, ok := c.GaveUp["DEL "+id]; !ok {
			return false
		}
	}
	return true
}

// gaveUp counts the verbs of one kind that gave up.
func (c *ChurnResult) gaveUp(verb string) int {
	n := 0
	for k := range c.GaveUp {
		if strings.HasPrefix(k, verb+" ") {
			n++
		}
	}
	return n
}

func codeList(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	var q []string
	for _, x := range xs[:min(3, len(xs))] {
		q = append(q, "`"+x+"`")
	}
	if len(xs) > 3 {
		q = append(q, fmt.Sprintf("and %d more", len(xs)-3))
	}
	return "(" + strings.Join(q, ", ") + ")"
}

func (r *Results) initOf(bin string) *InitCost {
	for i := range r.Inits {
		if r.Inits[i].Binary == bin {
			return &r.Inits[i]
		}
	}
	return nil
}

func (r *Results) size(bin string) int64 {
	for _, b := range r.Binaries {
		if b.Name == bin {
			return b.Bytes
		}
	}
	return 0
}

func renderWhere(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Where the time goes")
	p("")
	floor, gal, ref, cniOnly := r.chain(ChainFloor), r.chain(ChainGalactic), r.chain(ChainReference), r.chain(ChainCNIOnly)
	cniV, bgpV, tapV, staticV := r.proc("galactic-cni VERSION"), r.proc("galactic-bgp VERSION"), r.proc("tap VERSION"), r.proc("static VERSION")
	cniAdd, cniDel := r.proc("galactic-cni ADD"), r.proc("galactic-cni DEL")
	bgpAdd, bgpDel := r.proc("galactic-bgp ADD"), r.proc("galactic-bgp DEL")
	tapAdd, tapDel := r.proc("tap ADD (runs static)"), r.proc("tap DEL (runs static)")
	cniInit, bgpInit := r.initOf(AgentCNI), r.initOf(AgentBGP)
	if floor == nil || gal == nil || ref == nil || cniOnly == nil || cniV == nil || bgpV == nil || tapV == nil || staticV == nil ||
		cniAdd == nil || cniDel == nil || bgpAdd == nil || bgpDel == nil || tapAdd == nil || tapDel == nil || cniInit == nil || bgpInit == nil || r.Kernel == nil {
		p("(not all parts were measured in this run)")
		p("")
		return
	}
	p("A chain ADD is cnitool plus one cold process per plugin; nothing survives from one call to the next. The parts, p50 from this run:")
	p("")
	tapInit := r.initOf("tap")
	tapPkgs := 0
	if tapInit != nil {
		tapPkgs = tapInit.Packages
	}
	p("- **Exec and Go start-up.** cnitool with the trivial `loopback` plugin takes %s per ADD: cnitool's own start, reading the config, and one plugin process. Starting a plugin only to answer `VERSION` costs %s for galactic-cni and %s for galactic-bgp, against %s for `tap` and %s for `static`. The galactic binaries are %s and %s on disk (`tap` %s) and initialise %d and %d packages before `main`, in %s and %s (`tap`: %d packages).%s",
		ms(floor.Add.P50()), ms(cniV.Wall().P50()), ms(bgpV.Wall().P50()), ms(tapV.Wall().P50()), ms(staticV.Wall().P50()),
		mib(r.size(AgentCNI)), mib(r.size(AgentBGP)), mib(r.size("tap")), cniInit.Packages, bgpInit.Packages, ms(cniInit.Total.P50()), ms(bgpInit.Total.P50()), tapPkgs, schemeNote(cniInit, bgpInit))
	kernelVerdict := "galactic's kernel work is not where the gap is"
	if Ratio(cniOnly.Add.P50(), ref.Add.P50()) > 1.3 || Ratio(cniOnly.Del.P50(), ref.Del.P50()) > 1.3 {
		kernelVerdict = "galactic-cni's own work is part of the gap"
	}
	p("- **Netlink and node state.** The kernel alone (netlink from the bench, no process) creates a tap with its alias and brings it up in %s and deletes it in %s; deleting a network device waits for the kernel to unregister it, which is why every DEL here, the reference's included, is slower than its ADD. Run directly, galactic-cni ADD takes %s and DEL %s (%s and %s beyond its start-up): the node lock, the tap, alias, MTU, proxy ARP, the gateway addresses, host routes and `iif` rules in the VPC's table, the tap holder check and the fsynced node record. The reference `tap` takes %s for ADD and %s for DEL, each including a `static` process. Through cnitool galactic-cni alone costs %s per ADD and %s per DEL, %s and %s of the reference chain: %s.",
		ms(r.Kernel.Create.P50()), ms(r.Kernel.Delete.P50()),
		ms(cniAdd.Wall().P50()), ms(cniDel.Wall().P50()), ms(cniAdd.Wall().P50()-cniV.Wall().P50()), ms(cniDel.Wall().P50()-cniV.Wall().P50()),
		ms(tapAdd.Wall().P50()), ms(tapDel.Wall().P50()), ms(cniOnly.Add.P50()), ms(cniOnly.Del.P50()),
		ratio(Ratio(cniOnly.Add.P50(), ref.Add.P50())), ratio(Ratio(cniOnly.Del.P50(), ref.Del.P50())), kernelVerdict)
	if bgpAdd.Requests == 0 {
		p("- **Client set-up and API round trips.** Not measured in this run: no request was attributed to galactic-bgp (see %s). galactic-bgp ADD takes %s run directly and DEL %s.", r.sec("api-requests"), ms(bgpAdd.Wall().P50()), ms(bgpDel.Wall().P50()))
		p("")
		if len(r.GC) > 0 {
			p("%s", gcWhere(r))
			p("")
		}
		return
	}
	handshake := bgpAdd.FirstRequest.P50() - bgpAdd.FirstConn.P50()
	trips := bgpAdd.LastResponse.P50() - bgpAdd.FirstRequest.P50()
	tail := ""
	if len(bgpAdd.Logged) > 0 {
		tail = fmt.Sprintf(" It writes its log line %s after the last response and is reaped %s after that.",
			ms(bgpAdd.Logged.P50()-bgpAdd.LastResponse.P50()), ms(bgpAdd.Wall().P50()-bgpAdd.Logged.P50()))
	}
	p("- **Client set-up and API round trips.** galactic-bgp ADD takes %s run directly. Its first connection reaches the API server %s after exec (process start, package initialisation, node settings, kubeconfig, client set-up); the first request arrives %s later (TLS handshake with a client certificate); its %d requests finish %s after that, %s each, every one a read or write of etcd behind the API server.%s Its DEL takes %s with %d requests.",
		ms(bgpAdd.Wall().P50()), ms(bgpAdd.FirstConn.P50()), ms(handshake), bgpAdd.Requests, ms(trips), ms(trips/time.Duration(max(1, bgpAdd.Requests))),
		tail, ms(bgpDel.Wall().P50()), bgpDel.Requests)
	p("- Through cnitool the chain ADD costs %s against the reference's %s, and DEL %s against %s: the floor, galactic-cni's kernel work, and galactic-bgp's start-up, handshake and round trips, which the reference does not have.",
		ms(gal.Add.P50()), ms(ref.Add.P50()), ms(gal.Del.P50()), ms(ref.Del.P50()))
	p("")
	p("**The floor.** Any chain run by cnitool pays cnitool plus a cold start per plugin: about %s for galactic's two (the loopback floor plus galactic-bgp's `VERSION`). A plugin that talks to the API server adds at least one TLS handshake and one round trip per request, %s and %s for galactic-bgp's ADD here, because a CNI plugin is a new process every time and cannot keep a connection. What is left above that is galactic-cni's kernel and node-state work.",
		ms(floor.Add.P50()+bgpV.Wall().P50()), ms(handshake), ms(trips))
	if len(r.GC) > 0 {
		p("")
		p("%s", gcWhere(r))
	}
	p("")
}

// schemePkg is client-go's registry of every built-in API type; a binary
// that links it pays its init on every run.
const schemePkg = "k8s.io/client-go/kubernetes/scheme"

// linking names the binaries whose init trace shows pkg.
func linking(pkg string, ics ...*InitCost) []string {
	var bins []string
	for _, ic := range ics {
		if _, ok := ic.Means[pkg]; ok {
			bins = append(bins, ic.Binary)
		}
	}
	return bins
}

// schemeNote says whether the galactic plugins initialise client-go's
// registry of built-in types, from their init traces, and what their
// costliest init is.
func schemeNote(cni, bgp *InitCost) string {
	if bins := linking(schemePkg, cni, bgp); len(bins) > 0 {
		return fmt.Sprintf(" %s %s `%s`, which registers every built-in Kubernetes API type (%s mean in %s).",
			strings.Join(bins, " and "), initialise(bins), schemePkg, ms(firstInit(schemePkg, cni, bgp)), bins[0])
	}
	top := ""
	if len(bgp.Top) > 0 {
		top = fmt.Sprintf(" Their costliest single init is `%s` (%s in galactic-bgp).", bgp.Top[0].Name, ms(bgp.Top[0].Mean))
	}
	return fmt.Sprintf(" Neither initialises `%s`, client-go's registry of every built-in Kubernetes API type: pkg/client's scheme holds only network.galactic.dev and coordination.k8s.io/v1, and its Lease client is a gentype client over it.%s", schemePkg, top)
}

func initialise(bins []string) string {
	if len(bins) == 1 {
		return "initialises"
	}
	return "initialise"
}

// firstInit is pkg's mean init time in the first binary whose trace shows it.
func firstInit(pkg string, ics ...*InitCost) time.Duration {
	for _, ic := range ics {
		if d, ok := ic.Means[pkg]; ok {
			return d
		}
	}
	return 0
}

// gcWhere splits the largest GC pass into the parts timed on their own.
func gcWhere(r *Results) string {
	last := r.GC[len(r.GC)-1]
	in := last.InProcess.P50()
	var w strings.Builder
	verdict := "under"
	if last.Pass.P50() >= targetGCPass {
		verdict = "over"
	}
	fmt.Fprintf(&w, "**GC pass.** At %s taps `galactic-gc --once` logs a %s pass (%s the %s target) and `gc.Collector.Pass` in the bench takes %s (the binary writes its log, one `kept detached tap` line for each of the %s taps without a VMM, to stderr; the bench's collector logs to nowhere). Timed on their own: the tap scan %s (%.0f%% of the in-process pass), its two steps listing the links %s and the one scan of /proc for tun holders (`tap.AllHolders`) %s; reading the records %s; the one advertisement list %s (its JSON decoding included).",
		thousands(last.Taps), ms(last.Pass.P50()), verdict, targetGCPass, ms(in), thousands(last.Detached), ms(last.TapScan), 100*float64(last.TapScan)/float64(in),
		ms(last.LinkList), ms(last.HolderScan), ms(last.RecordRead), ms(last.AdvertList))
	if rest := in - last.TapScan - last.RecordRead - last.AdvertList; rest > 0 {
		fmt.Fprintf(&w, " The remaining %s is the pass's own work per attachment: a liveness check of every record's and entry's container namespace, and the GC's memory of detached taps (one sighting per tap) read and written back.", ms(rest))
	}
	fmt.Fprintf(&w, " The /proc scan reads every process's network namespace link (%d processes on the machine at the start) and, for the processes in the GC's own namespace, their fd links and the fdinfo of their tun fds; it runs once per pass whatever the number of taps, and each tap's status is then a map lookup. Here only `galactic-gc` itself shares the node namespace; on a real node the GC shares the host namespace with the VMMs, the runtime and the kubelet and reads their fd tables too, so this scan is a lower bound, but it grows with the processes, not with the taps.",
		r.Machine.Processes)
	return w.String()
}

// renderMissed gives each missed target its reason, from the figures
// of the same run.
func renderMissed(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Missed targets")
	p("")
	var missed []Target
	for _, t := range r.Targets() {
		if !t.Met {
			missed = append(missed, t)
		}
	}
	if len(missed) == 0 {
		p("None: every target measured in this run is met.")
	}
	for _, t := range missed {
		p("- **%s** — %s. %s", t.What, t.Miss, r.reason(t))
	}
	if cni, bgp := r.initOf(AgentCNI), r.initOf(AgentBGP); cni != nil && bgp != nil {
		if bins := linking(schemePkg, cni, bgp); len(bins) > 0 {
			p("")
			p("Not a target, but a cost every invocation pays: %s %s `%s`, client-go's registry of every built-in API type (%s mean), which the plugins do not need: pkg/client's own scheme holds only network.galactic.dev and coordination.k8s.io/v1. `go list -deps` on the plugin shows which import brings it in; dropping that import removes the init.",
				strings.Join(bins, " and "), initialise(bins), schemePkg, ms(firstInit(schemePkg, cni, bgp)))
		}
	}
	var skipped []string
	for _, c := range r.Chains {
		if c.Skipped != "" {
			skipped = append(skipped, fmt.Sprintf("%s (%s)", c.Name, c.Skipped))
		}
	}
	if len(skipped) > 0 {
		p("")
		p("Not measured in this run: %s.", strings.Join(skipped, "; "))
	}
	p("")
}

// reason says why target t was missed, from the figures of the same run.
// It is chosen by the target's key, so every target has one.
func (r *Results) reason(t Target) string {
	family, _, _ := strings.Cut(t.Key, "/")
	switch family {
	case "chain-ratio":
		return "The gap is the start-up of Go binaries that link client-go and the API client's handshake and round trips (see [where the time goes](#where-the-time-goes)); a plugin that is a new process each time pays them on every call."
	case "api-unattributed":
		return "The proxy tells programs apart by the user agent client-go sends, the program's name unless set otherwise; these requests carried none, so the HTTP client they went through was built without it."
	case "api-budget":
		return fmt.Sprintf("The requests each program made are listed in %s.", r.secLink("api-requests"))
	case "chain-objects", "api-objects", "cluster-ratio":
		return r.objectReason(t)
	case "gc-pass":
		row := r.gcRow(targetGCTaps)
		in := row.InProcess.P50()
		parts := []struct {
			name string
			d    time.Duration
		}{{"the tap scan", row.TapScan}, {"reading the records", row.RecordRead}, {"the advertisement list", row.AdvertList},
			{"the rest of the pass", in - row.TapScan - row.RecordRead - row.AdvertList}}
		sort.SliceStable(parts, func(i, j int) bool { return parts[i].d > parts[j].d })
		return fmt.Sprintf("Of the %s in-process pass, the largest part is %s (%s), then %s (%s); closing the gap starts with that part (%s).",
			ms(in), parts[0].name, ms(parts[0].d), parts[1].name, ms(parts[1].d), r.secLink("gc-pass-scaling"))
	case "gc-lists":
		return fmt.Sprintf("The requests of each pass are in %s.", r.secLink("gc-pass-scaling"))
	case "routing":
		return r.Routing.reason(t.Key)
	case "migration":
		return r.migrationReason(t.Key)
	case "filter-share":
		return r.isolationShareReason(t.Key)
	case "filter-forwarding":
		return r.forwardingReason(t.Key)
	case "scale-churn", "scale-received", "scale-start", "scale-every", "scale-rss", "scale-announce":
		return r.routeScaleReason(t)
	case "controller-ready", "controller-writes", "controller-rss", "controller-failover":
		return r.controllerReason(t)
	}
	panic("no reason for target " + t.Key)
}

// sortedKeys orders a map's keys, for output that does not change from run to run.
func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
