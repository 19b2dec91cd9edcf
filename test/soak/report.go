package soak

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Resource is one sample of a daemon's resource use.
type Resource struct {
	At                   time.Duration
	Process              string // "node-a galactic-router"
	RSSKiB, Threads, FDs int
}

// Report is what a soak run saw.
type Report struct {
	Seed     uint64
	Planned  time.Duration
	Ran      time.Duration
	Steps    []Step
	Executed int
	// StepErrors are the steps that failed, by sequence number.
	StepErrors map[int]string
	Violations []Violation
	// Blackouts are the measured outages by step kind.
	Blackouts map[string][]time.Duration
	// Longest are the measured outages of a second or more, longest
	// first: which step, which attachment, and when the outage began.
	Longest   []Outage
	Resources []Resource
	// Canary counts: Own probes a canary received from its own VPC,
	// Strangers from another.
	Own, Strangers map[string]int
	PingsSent      int
	PingsLost      int
	Samples        int
	// Routes and Routed count the receivers' routes checked, and those
	// present; Claims the address claims checked.
	Routes, Routed, Claims int
	Aborted                string
}

// Outage is one measured blackout.
type Outage struct {
	Step    Step
	Key     string
	Length  time.Duration
	Bound   time.Duration
	StartAt time.Duration
}

// Counts are the executed starts by kind.
func (r *Report) Counts() map[string]int {
	out := map[string]int{}
	for _, s := range r.Steps[:r.Executed] {
		if !s.End {
			out[s.Kind]++
		}
	}
	return out
}

// FaultsSurvived counts faults that started and ended without a failed step.
func (r *Report) FaultsSurvived() (survived, total int) {
	for _, s := range r.Steps[:r.Executed] {
		if k, _ := KindOf(s.Kind); !k.Fault || s.End {
			continue
		}
		total++
		ended := false
		for _, e := range r.Steps[:r.Executed] {
			if e.End && e.Start == s.Seq {
				_, failed := r.StepErrors[e.Seq]
				ended = !failed
			}
		}
		if _, failed := r.StepErrors[s.Seq]; ended && !failed {
			survived++
		}
	}
	return survived, total
}

// Reproduce is the command that replays the schedule up to step n.
func (r *Report) Reproduce(n int) string {
	return fmt.Sprintf("SOAK_SEED=%d SOAK_DURATION=%s SOAK_STEPS=%d make soak", r.Seed, r.Planned, n+1)
}

// Summary is the stdout summary.
func (r *Report) Summary(w io.Writer) {
	survived, total := r.FaultsSurvived()
	fmt.Fprintf(w, "soak: seed %d, %s planned, %s ran, %d of %d steps executed, %d samples checked\n",
		r.Seed, r.Planned, r.Ran.Round(time.Second), r.Executed, len(r.Steps), r.Samples)
	fmt.Fprintf(w, "soak: steps: %s\n", counts(r.Counts()))
	fmt.Fprintf(w, "soak: %d receiver routes checked (%d present), %d address claims\n", r.Routes, r.Routed, r.Claims)
	fmt.Fprintf(w, "soak: faults survived %d of %d; pings %d sent, %d lost; canaries: own %s, strangers %s\n",
		survived, total, r.PingsSent, r.PingsLost, counts(r.Own), counts(r.Strangers))
	if r.Aborted != "" {
		fmt.Fprintf(w, "soak: aborted: %s\n", r.Aborted)
	}
	fmt.Fprintf(w, "soak: %d violations\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  %s\n    reproduce: %s\n", v, r.Reproduce(v.Step))
	}
}

// Markdown writes the report (SOAK_REPORT; docs/contributing/soak.md says what
// it holds).
func (r *Report) Markdown(w io.Writer) {
	survived, total := r.FaultsSurvived()
	fmt.Fprintf(w, "| | |\n|---|---|\n")
	fmt.Fprintf(w, "| seed | %d |\n| planned | %s |\n| ran | %s |\n| steps executed | %d of %d |\n", r.Seed, r.Planned, r.Ran.Round(time.Second), r.Executed, len(r.Steps))
	fmt.Fprintf(w, "| snapshots checked (every 100 ms) | %d |\n| receivers' routes checked (present) | %d (%d) |\n| address claims checked | %d |\n| faults survived | %d of %d |\n", r.Samples, r.Routes, r.Routed, r.Claims, survived, total)
	fmt.Fprintf(w, "| pings sent / lost | %d / %d |\n| canary probes from own VPC | %s |\n| canary strangers (other VPC) | %s |\n", r.PingsSent, r.PingsLost, counts(r.Own), counts(r.Strangers))
	fmt.Fprintf(w, "| violations | %d |\n", len(r.Violations))
	if r.Aborted != "" {
		fmt.Fprintf(w, "| aborted | %s |\n", r.Aborted)
	}
	fmt.Fprintf(w, "\n### Steps by kind\n\n| kind | executed |\n|---|---|\n")
	byKind := r.Counts()
	for _, k := range sortedKeys(byKind) {
		fmt.Fprintf(w, "| %s | %d |\n", k, byKind[k])
	}
	fmt.Fprintf(w, "\n### Blackouts by step kind\n\nThe longest run of unanswered pings of each reachable attachment, per step, from the step's start to %s after its end.\n\n", SettleTime)
	fmt.Fprintf(w, "| kind | measured | median | p90 | max |\n|---|---|---|---|---|\n")
	for _, k := range sortedKeys(r.Blackouts) {
		n, p50, p90, mx := Distribution(r.Blackouts[k])
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s |\n", k, n, ms(p50), ms(p90), ms(mx))
	}
	if len(r.Longest) > 0 {
		fmt.Fprintf(w, "\n### The longest blackouts\n\n| step | attachment | blackout | from | bound |\n|---|---|---|---|---|\n")
		for _, o := range r.Longest[:min(len(r.Longest), 12)] {
			fmt.Fprintf(w, "| %s | %s | %s | +%.1fs | %s |\n", o.Step, o.Key, ms(o.Length), o.StartAt.Seconds(), ms(o.Bound))
		}
	}
	fmt.Fprintf(w, "\n### Violations\n\n")
	if len(r.Violations) == 0 {
		fmt.Fprintf(w, "None.\n")
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "- %s — reproduce: `%s`\n", v, r.Reproduce(v.Step))
	}
	if len(r.StepErrors) > 0 {
		fmt.Fprintf(w, "\n### Failed steps\n\n")
		for _, seq := range sortedInts(r.StepErrors) {
			fmt.Fprintf(w, "- %s: %s\n", r.Steps[seq], r.StepErrors[seq])
		}
	}
	fmt.Fprintf(w, "\n### Resource use over time\n\n| process | first RSS KiB | last RSS KiB | max RSS KiB | threads first/last | fds first/last/max |\n|---|---|---|---|---|---|\n")
	byProc := map[string][]Resource{}
	for _, s := range r.Resources {
		byProc[s.Process] = append(byProc[s.Process], s)
	}
	for _, p := range sortedKeys(byProc) {
		ss := byProc[p]
		first, last := ss[0], ss[len(ss)-1]
		maxRSS, maxFD := 0, 0
		for _, s := range ss {
			maxRSS, maxFD = max(maxRSS, s.RSSKiB), max(maxFD, s.FDs)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d/%d | %d/%d/%d |\n", p, first.RSSKiB, last.RSSKiB, maxRSS, first.Threads, last.Threads, first.FDs, last.FDs, maxFD)
	}
	fmt.Fprintf(w, "\n<details><summary>The schedule</summary>\n\n```\n")
	for _, s := range r.Steps[:r.Executed] {
		fmt.Fprintln(w, s)
	}
	fmt.Fprintf(w, "```\n</details>\n")
}

// counts prints counts by name, "none" when there are none.
func counts(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

func sortedInts[V any](m map[int]V) []int { return slices.Sorted(maps.Keys(m)) }
