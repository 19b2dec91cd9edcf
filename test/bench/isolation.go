package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
)

// IsolationResult is the packet filter's share of a chain's ADD and DEL:
// galactic-cni as shipped and built without the filter (noFilterLDFlags,
// bench only), interleaved in one loop on a node whose filter already
// holds Residents attachments.
type IsolationResult struct {
	Residents int
	Modes     []*IsolationMode
	// Leftover counts the filter's elements beyond the residents' after
	// the loop: every DEL must remove exactly what its ADD added.
	Leftover int
	// Forwarding is the data path's half, medians of ForwardRounds rounds
	// of ForwardWindow each way (one second when unset).
	Forwarding    []ForwardRow
	ForwardRounds int
	ForwardWindow time.Duration
}

// IsolationMode is one interface mode's pair of rows.
type IsolationMode struct {
	Mode          string
	With, Without ChainResult
}

const (
	isolationVPC       = "iso"
	isolationResidents = 1000
	// isolationBudget is the filter's target: it adds at most this to the
	// p50 of ADD and of DEL.
	isolationBudget = time.Millisecond
	// isolationRounds multiplies the chain loop's iterations: a row's p50
	// moves by about a millisecond between runs of 200, as much as the
	// budget.
	isolationRounds = 3
	// noFilterLDFlags builds the reference galactic-cni, which constructs
	// pkg/filter's Off instead of the kernel's filter (plugins/galactic-cni
	// main.go's filterOff; nothing at run time selects it).
	noFilterLDFlags = "-ldflags=-X main.filterOff=true"
)

// isolation runs the "tenant isolation" section.
func (b *bench) isolation() error {
	r := &IsolationResult{Residents: isolationResidents}
	for _, mode := range []string{names.ModeTap, names.ModeVeth} {
		r.Modes = append(r.Modes, &IsolationMode{Mode: mode,
			With:    ChainResult{Name: mode + ", filter", Plugins: "galactic-cni"},
			Without: ChainResult{Name: mode + ", no filter (bench build)", Plugins: "galactic-cni " + noFilterLDFlags}})
	}
	b.res.Isolation = r
	noFilter := filepath.Join(b.dir, "nofilter")
	cmd := exec.Command("go", "build", noFilterLDFlags, "-o", noFilter+"/", "./plugins/galactic-cni")
	cmd.Dir = harness.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building galactic-cni without the filter: %v\n%s", err, out)
	}
	n, err := b.newNode("iso")
	if err != nil {
		return err
	}
	// A resident attachment keeps the VPC's routing domain on the node:
	// the loop measures attaching to a VPC, not creating it.
	if err := n.WriteConflistFile(galacticConf("iso-resident", isolationVPC, "resident", false, false)); err != nil {
		return err
	}
	rc, err := b.container()
	if err != nil {
		return err
	}
	if _, err := b.cnitool(n, "add", "iso-resident", rc, ifName); err != nil {
		return err
	}
	defer b.cnitool(n, "del", "iso-resident", rc, ifName)
	// Residents stand for the node's other workloads: the sets the ADD
	// and DEL change hold this many attachments' elements.
	var before int
	if err := n.Do(func() error {
		var atts []filter.Attachment
		for i := range isolationResidents {
			atts = append(atts, filter.Attachment{
				Interface: fmt.Sprintf("gt%013x", i),
				Sources: []netip.Prefix{
					netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 21, byte(i >> 8), byte(i)}), 32),
					netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x21, 14: byte(i >> 8), 15: byte(i)}), 128),
				},
				Gateways: []netip.Addr{netip.MustParseAddr("10.21.0.1"), netip.MustParseAddr("fd21::1")},
			})
		}
		// Sync, not ADD: the stand-ins have no interfaces for the
		// classifier, only set elements. The resident's record keeps its
		// own.
		recs, err := state.NewStore(n.Settings.StateDir).List()
		if err != nil {
			return err
		}
		for _, r := range recs {
			atts = append(atts, hostif.RecordFilter(r))
		}
		if _, err := filter.New().Sync(atts); err != nil {
			return err
		}
		before, err = filter.Elements()
		return err
	}); err != nil {
		return fmt.Errorf("filling the filter: %w", err)
	}
	shipped := n.CNIPath
	type row struct {
		res     *ChainResult
		network string
		mode    string
		cniPath string
		c       *harness.Netns
		// off: the reference build, which must leave the filter alone.
		off bool
	}
	var rows []*row
	for _, m := range r.Modes {
		rows = append(rows,
			&row{&m.With, "iso-filter-" + m.Mode, m.Mode, shipped, nil, false},
			&row{&m.Without, "iso-nofilter-" + m.Mode, m.Mode, noFilter + string(os.PathListSeparator) + shipped, nil, true})
	}
	for _, rw := range rows {
		conf := galacticConf(rw.network, isolationVPC, rw.network, false, false)
		conf["plugins"].([]any)[0].(map[string]any)["mode"] = rw.mode
		if err := n.WriteConflistFile(conf); err != nil {
			return err
		}
		if rw.c, err = b.container(); err != nil {
			return err
		}
	}
	defer func() { n.CNIPath = shipped }()
	total := b.opts.Warmup + isolationRounds*b.opts.Iterations
	// A new order every iteration (seeded: runs compare): what ran just
	// before (a DEL's deferred kernel work) falls on every row alike.
	rng := rand.New(rand.NewPCG(21, 21))
	for i := range total {
		for _, j := range rng.Perm(len(rows)) {
			row := rows[j]
			n.CNIPath = row.cniPath
			check := row.off && i == 0
			var prev int
			if check {
				if err := n.Do(func() (err error) { prev, err = filter.Elements(); return err }); err != nil {
					return err
				}
			}
			add, err := b.cnitool(n, "add", row.network, row.c, ifName)
			if err != nil {
				return err
			}
			if check {
				// Otherwise the rows would compare the filter with itself.
				// Counted around this ADD alone: what the filter rows' ADDs
				// and DELs did before it may have moved the count.
				var now int
				if err := n.Do(func() (err error) { now, err = filter.Elements(); return err }); err != nil {
					return err
				}
				if now > prev {
					return fmt.Errorf("the reference galactic-cni (%s) wrote %d filter elements: it was not built without the filter", noFilterLDFlags, now-prev)
				}
			}
			del, err := b.cnitool(n, "del", row.network, row.c, ifName)
			if err != nil {
				return err
			}
			if i >= b.opts.Warmup {
				row.res.Add = append(row.res.Add, add.Wall)
				row.res.Del = append(row.res.Del, del.Wall)
			}
		}
	}
	n.CNIPath = shipped
	if err := n.Do(func() error {
		after, err := filter.Elements()
		r.Leftover = after - before
		return err
	}); err != nil {
		return err
	}
	for _, m := range r.Modes {
		for _, c := range []*ChainResult{&m.With, &m.Without} {
			b.say("%-32s ADD p50 %s  DEL p50 %s", c.Name, ms(c.Add.P50()), ms(c.Del.P50()))
		}
		b.say("%s: filter's share: ADD %s, DEL %s (budget %s each); paired: ADD %s, DEL %s", m.Mode, m.addShare(), m.delShare(), ms(isolationBudget),
			signedMs(paired(m.With.Add, m.Without.Add)), signedMs(paired(m.With.Del, m.Without.Del)))
	}
	b.say("%d elements left over", r.Leftover)
	return b.forwarding()
}

// paired is the median of the differences between with and without in
// the same iteration: what the two rows share of the machine's drift
// (other work, a DEL's deferred kernel work) cancels out.
func paired(with, without Sample) time.Duration {
	n := min(len(with), len(without))
	d := make(Sample, n)
	for i := range n {
		d[i] = with[i] - without[i]
	}
	return d.P50()
}

func (m *IsolationMode) addShare() string { return signedMs(m.With.Add.P50() - m.Without.Add.P50()) }
func (m *IsolationMode) delShare() string { return signedMs(m.With.Del.P50() - m.Without.Del.P50()) }

// isolationTargets judges the filter: its share of each p50, and
// forwarding with the filter against without.
func (r *Results) isolationTargets() []Target {
	s := r.Isolation
	if s == nil {
		return nil
	}
	var ts []Target
	for _, m := range s.Modes {
		for _, v := range []struct {
			verb      string
			with, ref Sample
		}{{"ADD", m.With.Add, m.Without.Add}, {"DEL", m.With.Del, m.Without.Del}} {
			d := v.with.P50() - v.ref.P50()
			t := Target{Key: "filter-share/" + m.Mode + "/" + v.verb, Section: "tenant-isolation",
				What:     fmt.Sprintf("%s %s p50 with the filter at most %s over without", m.Mode, v.verb, ms(isolationBudget)),
				Measured: fmt.Sprintf("%s (%s)", signedMs(d), ms(v.with.P50())), Ref: fmt.Sprintf("the same build without the filter: %s", ms(v.ref.P50())), Met: d <= isolationBudget}
			if !t.Met {
				t.Miss = ms(d-isolationBudget) + " over"
			}
			ts = append(ts, t)
		}
	}
	for _, f := range s.Forwarding {
		q := f.ratio()
		t := Target{Key: fmt.Sprintf("filter-forwarding/%d/%d", f.Residents, f.Payload), Section: "tenant-isolation",
			What:     fmt.Sprintf("forwarding at %s attachments, %d-byte payloads, with the filter at least %.0f%% of without", thousands(f.Residents), f.Payload, 100*forwardGoal),
			Measured: percent(q), Ref: fmt.Sprintf("no filter: %.0f pkt/s", f.Without), Met: q >= forwardGoal}
		if !t.Met {
			t.Miss = fmt.Sprintf("%.1f points under", 100*(forwardGoal-q))
		}
		ts = append(ts, t)
	}
	return ts
}

// isolationShareReason says what a missed share of ADD or DEL is made of.
func (r *Results) isolationShareReason(key string) string {
	parts := strings.Split(key, "/")
	for _, m := range r.Isolation.Modes {
		if m.Mode != parts[1] {
			continue
		}
		with, without := m.With.Add, m.Without.Add
		work := "the classifier's map entry and its attachment, and one nftables batch of the attachment's elements, beside the interface's creation"
		if parts[2] == "DEL" {
			with, without = m.With.Del, m.Without.Del
			work = "one nftables batch that expires the attachment's elements, beside the interface's deletion (which takes the classifier with it)"
		}
		return fmt.Sprintf("The share is a difference of two p50s of about %s each, measured in one interleaved loop; the median of the differences within one iteration, which the machine's drift affects less, is %s. What the filter adds to the verb is %s.",
			ms(without.P50()), signedMs(paired(with, without)), work)
	}
	panic("no isolation mode of " + key)
}

// forwardingReason says what a missed forwarding ratio is made of.
func (r *Results) forwardingReason(key string) string {
	return fmt.Sprintf("The ratio is the median of %d rounds' ratios, each pairing the two halves back to back; with the same path in both halves the method reads within a few points of 100%%, so a figure near the goal can fall on either side of it. The two halves' rates are in %s.",
		r.Isolation.ForwardRounds, r.secLink("tenant-isolation"))
}

func signedMs(d time.Duration) string {
	if d < 0 {
		return "−" + ms(-d)
	}
	return "+" + ms(d)
}

func renderIsolation(w *strings.Builder, r *Results) {
	s := r.Isolation
	if s == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "tenant-isolation")
	p("")
	p("galactic-cni alone (table mode, dual stack) as shipped and built for the bench with `%s`, which gives it pkg/filter's no-op filter; the two interleaved in one loop on a node whose filter holds %s other attachments. See [security model](concepts/security.md).", noFilterLDFlags, thousands(s.Residents))
	p("")
	p("| | ADD p50 | ADD p90 | DEL p50 | DEL p90 |")
	p("|---|---|---|---|---|")
	for _, m := range s.Modes {
		for _, c := range []*ChainResult{&m.With, &m.Without} {
			p("| %s | %s | %s | %s | %s |", c.Name, ms(c.Add.P50()), ms(c.Add.P90()), ms(c.Del.P50()), ms(c.Del.P90()))
		}
		p("| **%s: filter's share** | %s | | %s | |", m.Mode, m.addShare(), m.delShare())
		p("| %s: median of the differences in one iteration | %s | | %s | |", m.Mode,
			signedMs(paired(m.With.Add, m.Without.Add)), signedMs(paired(m.With.Del, m.Without.Del)))
	}
	p("")
	p("%d iterations a row. Budget: at most +%s on each p50. Elements left in the filter after the loop beyond the residents': %d.", len(s.Modes[0].With.Add), ms(isolationBudget), s.Leftover)
	p("")
	if len(s.Forwarding) == 0 {
		return
	}
	window := s.ForwardWindow
	if window == 0 {
		window = time.Second
	}
	p("Forwarding: one UDP stream from a veth workload on one node to one on another (VXLAN over the fabric, through both nodes' filters), as fast as one socket sends, for %d rounds of %s with the filter on both nodes and %s with galactic's tables removed, back to back, alternating which goes first; the rates are medians over the rounds, the ratio the median of each round's ratio. The filters hold the given number of attachments on each node.", s.ForwardRounds, window, window)
	p("")
	p("| attachments | payload | with the filter | without | ratio | goal |")
	p("|---|---|---|---|---|---|")
	for _, f := range s.Forwarding {
		p("| %s | %d B | %s | %s | %s | ≥ %.0f%% |", thousands(f.Residents), f.Payload, f.describe(f.With), f.describe(f.Without), percent(f.ratio()), 100*forwardGoal)
	}
	p("")
}

// percent shows a ratio in whole percent, or to a tenth when it rounds
// to the goal, so that which side of the goal it is on shows.
func percent(q float64) string {
	if math.Round(100*q) == math.Round(100*forwardGoal) {
		return fmt.Sprintf("%.1f%%", 100*q)
	}
	return fmt.Sprintf("%.0f%%", 100*q)
}
