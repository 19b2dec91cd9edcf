package bench

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/scale"
)

func msSample(vs ...float64) Sample {
	var s Sample
	for _, v := range vs {
		s = append(s, time.Duration(v*float64(time.Millisecond)))
	}
	return s
}

func repeat(v float64, n int) Sample {
	var s Sample
	for range n {
		s = append(s, time.Duration(v*float64(time.Millisecond)))
	}
	return s
}

func requests(agent string, n int) []Request {
	var rs []Request
	for range n {
		rs = append(rs, Request{Agent: agent, Method: "GET", Path: "/apis/network.galactic.dev/v1alpha1/namespaces/galactic-system/bgpadvertisements"})
	}
	return rs
}

// missingEverything is a run in which every kind of target is missed.
func missingEverything() *Results {
	large := &scale.LargeResult{Nodes: 20, VPCs: 1000, Routes: 100000, ADDParallel: 4, Rows: []scale.LargeRow{
		{Via: "galactic (rtc)", VPCs: 20, Received: 2100, Installed: 2000, Took: 2300 * time.Millisecond, CPU: time.Second, RSS: 55, PeakRSS: 56,
			AnnounceP50: 25 * time.Millisecond, PropagationP50: time.Millisecond, ChurnPasses: 100, ChurnPassMean: time.Millisecond},
		{Via: "FRR (no rtc)", VPCs: 20, Received: 100000, Installed: 2000, Took: 9 * time.Second},
		{Via: "galactic (rtc), every VPC", VPCs: 1000, Received: 100000, Installed: 100000, Took: 12 * time.Second, CPU: 21 * time.Second,
			RSS: 280, PeakRSS: 310, LiveHeap: 150, AnnounceP50: 24 * time.Millisecond},
	}}
	return &Results{
		Options:  DefaultOptions(false),
		Versions: Versions{Galactic: "abc1234-dirty", Dirty: []string{"docs/concepts/routing.md"}},
		Chains: []*ChainResult{
			{Name: ChainReference, Plugins: "tap, static", Add: repeat(10, 5), Del: repeat(20, 5)},
			{Name: ChainGalactic, Plugins: "galactic-cni, galactic-bgp", Add: repeat(35, 5), Del: repeat(70, 5)},
			{Name: ChainHandoff, Plugins: "galactic-cni, galactic-bgp", Add: repeat(45, 5), Del: repeat(80, 5)},
			{Name: ChainObjects, Plugins: "galactic-cni, galactic-bgp", Add: repeat(40, 5), Del: repeat(75, 5)},
			{Name: ChainObjectsHandoff, Plugins: "galactic-cni, galactic-bgp", Add: repeat(55, 5), Del: repeat(80, 5)},
		},
		Ops: []OpCount{
			{Op: "ADD", Common: "ADD", Requests: requests(AgentBGP, 4)},
			{Op: "DEL", Common: "DEL", Requests: append(requests(AgentBGP, 2), requests(AgentCNI, 1)...)},
			{Op: "ADD with handoff", Common: "ADD+handoff", Requests: append(requests(AgentBGP, 3), requests(AgentCNI, 3)...)},
			{Op: "DEL with handoff", Common: "DEL+handoff", Requests: append(requests(AgentBGP, 3), requests(AgentCNI, 2)...)},
			{Op: "ADD of a VPCAttachment", Common: "ADD+object", Requests: append(requests(AgentBGP, 5), requests(AgentCNI, 2)...)},
			{Op: "DEL of a VPCAttachment", Common: "DEL+object", Requests: append(requests(AgentBGP, 3), requests(AgentCNI, 2)...)},
		},
		GC: []GCRow{
			{Taps: 100, Pass: msSample(40), Wall: msSample(50), InProcess: msSample(40), Requests: requests(AgentGC, 1)},
			{Taps: 5000, Pass: msSample(2500), Wall: msSample(2600), InProcess: msSample(2400), TapScan: 60 * time.Millisecond,
				RecordRead: 120 * time.Millisecond, AdvertList: 500 * time.Millisecond, Requests: requests(AgentGC, 2)},
		},
		Routing: &RoutingResult{Iterations: 5, RefAdd: msSample(1, 1), RefDel: msSample(1, 1), Add: msSample(60, 300), Del: msSample(70, 300),
			Install: msSample(150, 600), Available: msSample(120, 700), Unavailable: msSample(130, 800),
			AddStart: msSample(90), DelStart: msSample(90), RefAddStart: msSample(10), RefDelStart: msSample(10),
			Moves: []MoveResult{{Handoff: true, Blackout: 900 * time.Millisecond, Wait: 500 * time.Millisecond, Withdrawn: 1, Announced: 1, KernelChanges: 1}}},
		Migration: []*MigrationResult{
			{Accel: "tcg", Reflector: viaFRR, Blackout: msSample(250, 600), QEMUDowntime: msSample(3, 150), Galactic: msSample(85, 90), Release: msSample(22), Promote: msSample(31), RouteChanges: 2},
			{Accel: "tcg", Reflector: viaGalactic, Blackout: msSample(210, 520), QEMUDowntime: msSample(3, 6), Galactic: msSample(65), Release: msSample(22), Promote: msSample(34), RouteChanges: 1},
		},
		Isolation: &IsolationResult{Residents: 1000, ForwardRounds: 41, Modes: []*IsolationMode{
			{Mode: "tap", With: ChainResult{Name: "tap, filter", Add: repeat(14, 3), Del: repeat(28, 3)}, Without: ChainResult{Name: "tap, no filter", Add: repeat(12, 3), Del: repeat(26, 3)}},
		}, Forwarding: []ForwardRow{{Residents: 10, Payload: 1400, With: 90000, Without: 100000, Ratio: 0.9}}},
		RouteScale: &RouteScaleResult{
			Churn: &scale.ChurnResult{ChurnPerSecond: 100, ADDs: 200, Block: 25, IdleP50: 60 * time.Millisecond, IdleP99: 100 * time.Millisecond,
				ChurnP50: 65 * time.Millisecond, ChurnP99: 150 * time.Millisecond, LockHeld: 80 * time.Millisecond, PassTime: 3 * time.Second},
			Large: large, LargeSize: "1",
			Timelines: map[string]Timeline{
				"galactic (rtc)":            {Membership: 80 * time.Millisecond, SessionUp: 2 * time.Second, EndOfRIB: 2140 * time.Millisecond, FirstRoutes: 2080 * time.Millisecond, LastRoutes: 2300 * time.Millisecond},
				"galactic (rtc), every VPC": {SessionUp: 2 * time.Second, EndOfRIB: 11 * time.Second, FirstRoutes: 5 * time.Second, LastRoutes: 12 * time.Second},
			},
			Failed: []string{"TestAtTheIssuesScale/FRR_(no_rtc) (GALACTIC_SCALE_LARGE=1)"},
		},
		Cluster: &ClusterBench{Bringup: time.Minute, Rows: []*ClusterResult{
			{Name: ClusterReference, Ready: msSample(900, 950)},
			{Name: ClusterGalactic, Ready: msSample(1100, 1200), FirstPing: msSample(1500)},
		}},
		Controller: &ControllerResult{Burst: 1000, Parallel: 32, Creating: 3 * time.Second, ReadyAfter: 14 * time.Second,
			Writes:   map[string]int{"create vpcaddresses": 1000, "patch vpcattachments": 1500, "update vpcattachments/status": 1000},
			Requests: 4000, Scale: 10000, LeaderRSS: 120 * 1024, LeaderRSSReady: 130 * 1024, StandbyRSS: 90 * 1024, ScaleReadyAfter: time.Minute,
			Failover: 18 * time.Second, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 500 * time.Millisecond},
	}
}

func TestEveryMissedTargetHasAReasonOfItsOwn(t *testing.T) {
	r := missingEverything()
	ts := r.Targets()
	families := map[string]bool{}
	for _, tg := range ts {
		if tg.Met {
			t.Errorf("%s is met in a run built to miss it", tg.Key)
		}
		family, _, _ := strings.Cut(tg.Key, "/")
		families[family] = true
		if why := r.reason(tg); len(why) < 40 {
			t.Errorf("%s: reason %q says too little", tg.Key, why)
		}
	}
	for _, f := range []string{"chain-ratio", "api-budget", "gc-pass", "gc-lists", "routing", "migration", "filter-share", "filter-forwarding",
		"scale-churn", "scale-received", "scale-start", "scale-every", "scale-rss", "scale-announce",
		"controller-ready", "controller-writes", "controller-rss", "controller-failover",
		"chain-objects", "api-objects", "cluster-ratio"} {
		if !families[f] {
			t.Errorf("no %s target in the run built to miss every kind", f)
		}
	}
	report := Render(r)
	_, missed, _ := strings.Cut(report, "## Missed targets\n")
	for _, tg := range ts {
		if !strings.Contains(missed, "**"+tg.What+"** — "+tg.Miss+". "+r.reason(tg)) {
			t.Errorf("the missed targets do not give %s its reason", tg.Key)
		}
	}
}

func TestTheSectionsAreNumberedInOrder(t *testing.T) {
	report := Render(missingEverything())
	want := 1
	for _, line := range strings.Split(report, "\n") {
		h, ok := strings.CutPrefix(line, "## ")
		if !ok {
			continue
		}
		num, _, numbered := strings.Cut(h, ". ")
		n, err := strconv.Atoi(num)
		if !numbered || err != nil {
			continue
		}
		if n != want {
			t.Errorf("section %q is numbered %d, want %d", h, n, want)
		}
		want++
	}
	if want < 8 {
		t.Errorf("only %d numbered sections", want-1)
	}
	for _, unnumbered := range []string{"## Live migration", "## Tenant isolation", "## Pod start through"} {
		if strings.Contains(report, unnumbered) {
			t.Errorf("%q is not numbered", unnumbered)
		}
	}
}

func TestTheSummaryComesFirstWithEveryTargetAndWhatItIsComparedWith(t *testing.T) {
	r := missingEverything()
	report := Render(r)
	summary := strings.Index(report, "## Summary")
	if summary < 0 || summary > strings.Index(report, "## How to rerun") {
		t.Fatal("the summary is not the first section")
	}
	body, _, _ := strings.Cut(report[summary:], "\n## ")
	for _, tg := range r.Targets() {
		if tg.Ref == "" {
			t.Errorf("%s says nothing of what it is compared with", tg.Key)
		}
		if !strings.Contains(body, "| "+tg.What+" | "+tg.Measured+" | "+tg.Ref+" |") {
			t.Errorf("the summary lacks %s", tg.Key)
		}
	}
}

func TestADirtyTreeIsMarkedAtTheTop(t *testing.T) {
	r := missingEverything()
	head, _, _ := strings.Cut(Render(r), "## Summary")
	if !strings.Contains(head, "**Not the report of a commit.**") || !strings.Contains(head, "docs/concepts/routing.md") {
		t.Errorf("a dirty tree's report does not say so at the top:\n%s", head)
	}
	r.Versions.Dirty = nil
	if head, _, _ := strings.Cut(Render(r), "## Summary"); strings.Contains(head, "Not the report of a commit") {
		t.Error("a clean tree's report is marked dirty")
	}
}

func TestTheReportHasNoRawLogLinesAndNoTrackerWording(t *testing.T) {
	report := Render(missingEverything())
	for _, bad := range []*regexp.Regexp{regexp.MustCompile(`\w+_test\.go:\d+`), regexp.MustCompile(`(?i)\bissue\b|#1\d\b|DESIGN\.md|must-show`)} {
		if m := bad.FindString(report); m != "" {
			t.Errorf("the report contains %q", m)
		}
	}
	if !strings.Contains(report, "| galactic (rtc), every VPC | 0.00 ms | 2000 ms |") && !strings.Contains(report, "| galactic (rtc), every VPC |") {
		t.Error("the start timelines are not a table")
	}
}

func TestTheReportsLinksResolve(t *testing.T) {
	report := Render(missingEverything())
	docs := filepath.Join(harness.RepoRoot(), "docs")
	anchors := map[string]bool{}
	for _, line := range strings.Split(report, "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchors[anchor(h)] = true
		}
		if m := regexp.MustCompile(`^<a id="([^"]+)"></a>$`).FindStringSubmatch(line); m != nil {
			anchors[m[1]] = true
		}
	}
	for _, m := range regexp.MustCompile(`\]\(([^)]+)\)`).FindAllStringSubmatch(report, -1) {
		path, frag, _ := strings.Cut(m[1], "#")
		if path == "" {
			if !anchors[frag] {
				t.Errorf("link %q: no such heading in the report", m[1])
			}
			continue
		}
		if _, err := os.Stat(filepath.Join(docs, path)); err != nil {
			t.Errorf("link %q: %v", m[1], err)
		}
	}
}
