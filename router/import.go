package router

import (
	"net/netip"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// RIB is the paths other nodes announce, by RIB key: the view selection
// works on (Adj.RIB builds it from every peer's paths).
type RIB map[speaker.Key]speaker.Received

// Apply records received changes.
func (r RIB) Apply(rs []speaker.Received) {
	for _, x := range rs {
		if x.Withdrawn {
			delete(r, x.Key())
		} else {
			r[x.Key()] = x
		}
	}
}

// better reports whether a beats b for the same prefix: the higher
// holderGeneration, then the lower router ID (the RD's administrator).
func better(a, b speaker.Received) bool {
	if a.Generation != b.Generation {
		return a.Generation > b.Generation
	}
	if a.RD.Admin != b.RD.Admin {
		return a.RD.Admin.Less(b.RD.Admin)
	}
	if a.RD.Assigned != b.RD.Assigned {
		return a.RD.Assigned < b.RD.Assigned
	}
	return a.NextHop.Less(b.NextHop)
}

// Fence is the highest holderGeneration of a drained path of a prefix,
// and that path's key.
type Fence struct {
	Gen uint32
	By  speaker.Key
}

// Fences are, per VPC and prefix, the drain that fences it: that prefix's
// routes of the drain's generation or lower are not installed.
type Fences map[string]map[netip.Prefix]Fence

// Fenced reports whether a route of generation gen for vpc's prefix p is
// suppressed by a drained path.
func (f Fences) Fenced(vpc string, p netip.Prefix, gen uint32) bool {
	d, ok := f[vpc][p]
	return ok && gen <= d.Gen
}

func (f Fences) raise(vpc string, p netip.Prefix, d Fence) {
	if f[vpc] == nil {
		f[vpc] = map[netip.Prefix]Fence{}
	}
	if cur, ok := f[vpc][p]; !ok || d.Gen > cur.Gen {
		f[vpc][p] = d
	}
}

// Select picks, for every prefix of each VPC's route target, the path to
// install: fencing first. A drained path is never selected and suppresses
// every path of its prefix of its generation or lower, so the drain of the
// current holder never hands the traffic to a predecessor; fences reports
// those drains for Desired and the next pass. A fence of the previous pass
// (prev) stays while any path of its prefix remains and the drained path
// has not come back undrained, so a drain followed by a withdrawal still
// keeps the predecessor out; a prefix with no path left forgets it, so an
// address reused later is routed. A path carrying
// several route targets is read for each of them.
func Select(rib RIB, rtASN uint16, vnis map[string]uint32, prev Fences) (selected map[string]map[netip.Prefix]speaker.Received, fences Fences) {
	byVNI := map[uint32]string{}
	for vpc, v := range vnis {
		byVNI[v] = vpc
	}
	selected = map[string]map[netip.Prefix]speaker.Received{}
	fences = Fences{}
	type cand struct {
		vpc string
		r   speaker.Received
	}
	live := make([]cand, 0, len(rib))
	for _, r := range rib {
		if !r.NextHop.IsValid() || len(r.RouterMAC) != 6 {
			continue
		}
		for _, vni := range r.TargetVNIs(rtASN) {
			vpc, ok := byVNI[vni]
			if !ok {
				continue
			}
			if r.Drained {
				fences.raise(vpc, r.Prefix, Fence{Gen: r.Generation, By: r.Key()})
				continue
			}
			live = append(live, cand{vpc, r})
		}
	}
	present := map[vpcPrefix]bool{}
	if len(prev) > 0 {
		for _, c := range live {
			present[vpcPrefix{c.vpc, c.r.Prefix}] = true
		}
	}
	for vpc, ps := range prev {
		for p, d := range ps {
			if back, ok := rib[d.By]; ok && !back.Drained {
				continue
			}
			if present[vpcPrefix{vpc, p}] {
				fences.raise(vpc, p, d)
			}
		}
	}
	for _, c := range live {
		if fences.Fenced(c.vpc, c.r.Prefix, c.r.Generation) {
			continue
		}
		if selected[c.vpc] == nil {
			selected[c.vpc] = map[netip.Prefix]speaker.Received{}
		}
		if cur, ok := selected[c.vpc][c.r.Prefix]; !ok || better(c.r, cur) {
			selected[c.vpc][c.r.Prefix] = c.r
		}
	}
	return selected, fences
}

type vpcPrefix struct {
	vpc    string
	prefix netip.Prefix
}

// installed is a route as installed, with the generation it was selected
// at (0 for one found in the kernel).
type installed struct {
	dataplane.Remote
	gen uint32
}

// Holder keeps remote routes that were withdrawn without a replacement of
// at least their generation for the withdrawal hold, so a peer that
// restarts without a graceful-restart helper (FRR's EVPN) changes nothing
// in the kernel, and a stale lower generation never takes over while the
// current holder's router restarts.
type Holder struct {
	Hold time.Duration
	// last is what was installed last, and held when each hold started.
	last map[vpcPrefix]installed
	held map[vpcPrefix]time.Time
}

// Seed starts from routes found in the kernel (a restart): they are kept
// like withdrawn ones until the RIB has them again or the hold passes.
func (h *Holder) Seed(vpc string, rs []dataplane.Remote) {
	if h.last == nil {
		h.last = map[vpcPrefix]installed{}
	}
	for _, r := range rs {
		h.last[vpcPrefix{vpc, r.Prefix}] = installed{Remote: r}
	}
}

// Desired turns the selection into the routes to install per VPC. A route
// whose path went away is held unless a path of at least its generation
// replaces it or a drain fences it; frozen (the RIB is not synced yet)
// holds without starting the clock. next is when a hold ends, zero when
// none is running.
func (h *Holder) Desired(now time.Time, selected map[string]map[netip.Prefix]speaker.Received, fences Fences, managed map[string]bool, frozen bool) (out map[string][]dataplane.Remote, next time.Time) {
	if h.held == nil {
		h.held = map[vpcPrefix]time.Time{}
	}
	keys := make(map[vpcPrefix]bool, len(h.last))
	for vpc, ps := range selected {
		for p := range ps {
			keys[vpcPrefix{vpc, p}] = true
		}
	}
	for k := range h.last {
		keys[k] = true
	}
	cur := make(map[vpcPrefix]installed, len(keys))
	for k := range keys {
		if !managed[k.vpc] {
			delete(h.held, k)
			continue
		}
		sel, hasSel := selected[k.vpc][k.prefix]
		old, hasOld := h.last[k]
		if hasOld && fences.Fenced(k.vpc, k.prefix, old.gen) {
			hasOld = false
		}
		if hasSel && (!hasOld || sel.Generation >= old.gen) {
			cur[k] = installed{Remote: dataplane.Remote{Prefix: k.prefix, NextHop: sel.NextHop, RouterMAC: sel.RouterMAC}, gen: sel.Generation}
			delete(h.held, k)
			continue
		}
		if !hasOld {
			delete(h.held, k)
			continue
		}
		// old's path is gone and nothing of its generation replaces it.
		if frozen {
			cur[k] = old
			continue
		}
		since, ok := h.held[k]
		if !ok {
			since = now
			h.held[k] = now
		}
		if end := since.Add(h.Hold); now.Before(end) {
			cur[k] = old
			if next.IsZero() || end.Before(next) {
				next = end
			}
			continue
		}
		delete(h.held, k)
		if hasSel {
			cur[k] = installed{Remote: dataplane.Remote{Prefix: k.prefix, NextHop: sel.NextHop, RouterMAC: sel.RouterMAC}, gen: sel.Generation}
		}
	}
	h.last = cur
	out = map[string][]dataplane.Remote{}
	for k, r := range cur {
		out[k.vpc] = append(out[k.vpc], r.Remote)
	}
	return out, next
}
