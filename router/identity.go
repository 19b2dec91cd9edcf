package router

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"time"

	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/router/speaker"
)

// identityCheck reports other nodes whose paths carry this node's router
// ID: their RDs and this node's collide at the reflectors. Export marks
// the advertisements while any is found.
type identityCheck struct {
	routerID, underlay netip.Addr
	log                *slog.Logger
	clock              clock.Clock
	metrics            *Metrics
	// dups are the other nodes' VTEPs found at the last check.
	dups []netip.Addr
	// rejected is what the speaker last said it refused; it is asked
	// again from rejectedNext.
	rejected     []speaker.Received
	rejectedNext time.Time
}

// rejectedEvery is how often check asks the speaker what it refused,
// unless asking takes long: a misconfigured router ID is reported within
// it.
const rejectedEvery = 5 * time.Second

// askAgain is when a question to GoBGP that walks its tables, asked at
// started, is asked again: after every at least, and after fifty times
// what it took, so that a node of many paths spends at most a fiftieth of
// its time on it.
func askAgain(clk clock.PassiveClock, started time.Time, every time.Duration) time.Time {
	return started.Add(max(every, 50*clk.Since(started)))
}

// check updates dups from the VTEPs the RIB view shows with this router
// ID (inRIB, sorted) and those of the paths spk refused.
func (c *identityCheck) check(ctx context.Context, spk speaker.Speaker, inRIB []netip.Addr) {
	// Over a reflector the other node's paths carry this router ID as
	// ORIGINATOR_ID, so the speaker refuses them as a loop: read those too,
	// every rejectedEvery (asking costs a count of every received path).
	if now := c.clock.Now(); !now.Before(c.rejectedNext) {
		rejected, err := spk.Rejected(ctx)
		if err != nil {
			c.log.Warn("reading refused paths", "error", err)
		}
		c.rejected, c.rejectedNext = rejected, askAgain(c.clock, now, rejectedEvery)
	}
	dups := inRIB
	if len(c.rejected) > 0 {
		seen := RIB{}
		for _, r := range c.rejected {
			seen[speaker.Key{RD: r.RD, Prefix: r.Prefix}] = r
		}
		for _, v := range Duplicates(seen, c.routerID, c.underlay) {
			if !slices.Contains(dups, v) {
				dups = append(dups, v)
			}
		}
		slices.SortFunc(dups, netip.Addr.Compare)
	}
	if slices.Equal(dups, c.dups) {
		return
	}
	for _, v := range dups {
		if !slices.Contains(c.dups, v) {
			c.log.Error("another node uses this node's router ID: give every node its own routerID in router.json",
				"routerID", c.routerID, "otherVTEP", v)
		}
	}
	c.metrics.setDuplicates(c.dups, dups)
	c.dups = dups
}

// carriesRouterID reports whether r is another node's path (another next
// hop) with this node's router ID in its RD.
func carriesRouterID(r speaker.Received, routerID, underlay netip.Addr) bool {
	return r.RD.Admin == routerID && r.NextHop != underlay && r.NextHop.IsValid()
}

// Duplicates are the next hops (VTEPs) of other nodes' paths that carry
// this node's router ID in their RD: another node is configured with it.
func Duplicates(rib RIB, routerID, underlay netip.Addr) []netip.Addr {
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	for _, r := range rib {
		if carriesRouterID(r, routerID, underlay) && !seen[r.NextHop] {
			seen[r.NextHop] = true
			out = append(out, r.NextHop)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}
