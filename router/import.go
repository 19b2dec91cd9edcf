package router

import (
	"bytes"
	"maps"
	"net"
	"net/netip"
	"slices"
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
	if cur, ok := f[vpc][p]; !ok || d.stronger(cur) {
		f[vpc][p] = d
	}
}

// stronger reports whether fence d replaces o: the higher generation,
// then the lower key, so the drain a fence names does not depend on the
// order the paths are read in.
func (d Fence) stronger(o Fence) bool {
	if d.Gen != o.Gen {
		return d.Gen > o.Gen
	}
	return keyCompare(d.By, o.By) < 0
}

func keyCompare(a, b speaker.Key) int {
	if c := a.RD.Admin.Compare(b.RD.Admin); c != 0 {
		return c
	}
	if a.RD.Assigned != b.RD.Assigned {
		if a.RD.Assigned < b.RD.Assigned {
			return -1
		}
		return 1
	}
	return a.Prefix.Compare(b.Prefix)
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

// installed is a route as installed (its prefix is the key it is kept
// under), with the generation it was selected at (0 for one found in the
// kernel).
type installed struct {
	nextHop netip.Addr
	mac     net.HardwareAddr
	gen     uint32
}

// Holder keeps remote routes that were withdrawn without a replacement of
// at least their generation for the withdrawal hold, so a peer that
// restarts without a graceful-restart helper (FRR's EVPN) changes nothing
// in the kernel, and a stale lower generation never takes over while the
// current holder's router restarts.
type Holder struct {
	Hold time.Duration
	// last is what is installed, per VPC, and held when each hold started;
	// pending are the prefixes kept by a hold or by the freeze, judged
	// again when either ends.
	last    map[string]map[netip.Prefix]installed
	held    map[vpcPrefix]time.Time
	pending map[vpcPrefix]struct{}
	// managed and frozen are the last Update's.
	managed map[string]bool
	frozen  bool
	// dirtyVPCs are the VPCs whose routes changed since Synced, vtepRefs
	// the routes installed per next hop.
	dirtyVPCs map[string]bool
	vtepRefs  map[netip.Addr]int
}

func (h *Holder) init() {
	if h.last == nil {
		h.last = map[string]map[netip.Prefix]installed{}
		h.held = map[vpcPrefix]time.Time{}
		h.pending = map[vpcPrefix]struct{}{}
		h.dirtyVPCs = map[string]bool{}
		h.vtepRefs = map[netip.Addr]int{}
	}
}

// Seed starts from routes found in the kernel (a restart): they are kept
// like withdrawn ones until the RIB has them again or the hold passes.
func (h *Holder) Seed(vpc string, rs []dataplane.Remote) {
	h.init()
	for _, r := range rs {
		h.set(vpc, r.Prefix, installed{nextHop: r.NextHop, mac: r.RouterMAC}, true)
	}
}

// set records what is installed for vpc's prefix p (nothing, when !ok).
func (h *Holder) set(vpc string, p netip.Prefix, v installed, ok bool) {
	cur, had := h.last[vpc][p]
	if had == ok && (!ok || cur.nextHop == v.nextHop && bytes.Equal(cur.mac, v.mac)) {
		if ok && cur.gen != v.gen {
			h.last[vpc][p] = v
		}
		return
	}
	h.dirtyVPCs[vpc] = true
	if had {
		if h.vtepRefs[cur.nextHop]--; h.vtepRefs[cur.nextHop] <= 0 {
			delete(h.vtepRefs, cur.nextHop)
		}
	}
	if ok {
		h.vtepRefs[v.nextHop]++
	}
	setIn(h.last, vpc, p, v, ok)
}

// Desired turns the selection into the routes to install per VPC. A route
// whose path went away is held unless a path of at least its generation
// replaces it or a drain fences it; frozen (the RIB is not synced yet)
// holds without starting the clock. next is when a hold ends, zero when
// none is running.
func (h *Holder) Desired(now time.Time, selected map[string]map[netip.Prefix]speaker.Received, fences Fences, managed map[string]bool, frozen bool) (out map[string][]dataplane.Remote, next time.Time) {
	next = h.Update(now, selectedMap(selected), fences, managed, frozen, Changes{All: true})
	out = map[string][]dataplane.Remote{}
	for vpc := range h.last {
		out[vpc] = h.Routes(vpc)
	}
	return out, next
}

// Selection is what Select chose.
type Selection interface {
	// Best is the path selected for vpc's prefix p.
	Best(vpc string, p netip.Prefix) (speaker.Received, bool)
	// Each calls f for every prefix of vpc that may have a selection.
	Each(vpc string, f func(netip.Prefix))
	// VPCs calls f for every VPC that may have a selection.
	VPCs(f func(string))
}

// selectedMap is Select's result as a Selection.
type selectedMap map[string]map[netip.Prefix]speaker.Received

func (m selectedMap) Best(vpc string, p netip.Prefix) (speaker.Received, bool) {
	r, ok := m[vpc][p]
	return r, ok
}

func (m selectedMap) Each(vpc string, f func(netip.Prefix)) {
	for p := range m[vpc] {
		f(p)
	}
}

func (m selectedMap) VPCs(f func(string)) {
	for vpc := range m {
		f(vpc)
	}
}

// Update is Desired for what the selection's changes name, the prefixes
// of VPCs that became or stopped being managed, and those whose hold or
// freeze ended: the rest cannot have changed.
func (h *Holder) Update(now time.Time, selected Selection, fences Fences, managed map[string]bool, frozen bool, ch Changes) (next time.Time) {
	h.init()
	judge := func(k vpcPrefix) { h.judge(now, k, selected, fences, managed, frozen) }
	vpcKeys := func(vpc string) {
		selected.Each(vpc, func(p netip.Prefix) { judge(vpcPrefix{vpc, p}) })
		for p := range h.last[vpc] {
			judge(vpcPrefix{vpc, p})
		}
	}
	if ch.All {
		selected.VPCs(vpcKeys)
		var rest []vpcPrefix
		for vpc, ps := range h.last {
			for p := range ps {
				rest = append(rest, vpcPrefix{vpc, p})
			}
		}
		for _, k := range rest {
			judge(k)
		}
	} else {
		for k := range ch.Keys {
			judge(k)
		}
		for vpc := range ch.VPCs {
			vpcKeys(vpc)
		}
		for vpc := range managed {
			if !h.managed[vpc] {
				vpcKeys(vpc)
			}
		}
		for vpc := range h.managed {
			if !managed[vpc] {
				vpcKeys(vpc)
			}
		}
		var due []vpcPrefix
		for k := range h.pending {
			if frozen != h.frozen || !frozen && !now.Before(h.held[k].Add(h.Hold)) {
				due = append(due, k)
			}
		}
		for _, k := range due {
			judge(k)
		}
	}
	if !maps.Equal(managed, h.managed) {
		h.managed = maps.Clone(managed)
	}
	h.frozen = frozen
	if !frozen {
		for k := range h.pending {
			if end := h.held[k].Add(h.Hold); next.IsZero() || end.Before(next) {
				next = end
			}
		}
	}
	return next
}

// judge decides one prefix of one VPC.
func (h *Holder) judge(now time.Time, k vpcPrefix, selected Selection, fences Fences, managed map[string]bool, frozen bool) {
	settle := func(v installed, ok bool) {
		delete(h.held, k)
		delete(h.pending, k)
		h.set(k.vpc, k.prefix, v, ok)
	}
	if !managed[k.vpc] {
		settle(installed{}, false)
		return
	}
	sel, hasSel := selected.Best(k.vpc, k.prefix)
	selInst := installed{nextHop: sel.NextHop, mac: sel.RouterMAC, gen: sel.Generation}
	old, hasOld := h.last[k.vpc][k.prefix]
	if hasOld && fences.Fenced(k.vpc, k.prefix, old.gen) {
		hasOld = false
	}
	if hasSel && (!hasOld || sel.Generation >= old.gen) {
		settle(selInst, true)
		return
	}
	if !hasOld {
		settle(installed{}, false)
		return
	}
	// old's path is gone and nothing of its generation replaces it.
	h.pending[k] = struct{}{}
	if frozen {
		return
	}
	since, ok := h.held[k]
	if !ok {
		since = now
		h.held[k] = now
	}
	if now.Before(since.Add(h.Hold)) {
		return
	}
	settle(selInst, hasSel)
}

// Routes are the routes to install in vpc.
func (h *Holder) Routes(vpc string) []dataplane.Remote {
	ps := h.last[vpc]
	if len(ps) == 0 {
		return nil
	}
	out := make([]dataplane.Remote, 0, len(ps))
	for p, r := range ps {
		out = append(out, dataplane.Remote{Prefix: p, NextHop: r.nextHop, RouterMAC: r.mac})
	}
	return out
}

// Sum is the sum of Routes(vpc).
func (h *Holder) Sum(vpc string) remotesSum {
	var s remotesSum
	for p, r := range h.last[vpc] {
		s.add(p, r.nextHop, r.mac)
	}
	return s
}

// Count is how many routes vpc has to install.
func (h *Holder) Count(vpc string) int { return len(h.last[vpc]) }

// Changed reports whether vpc's routes changed since Synced.
func (h *Holder) Changed(vpc string) bool { return h.dirtyVPCs[vpc] }

// Synced records that the kernel was brought up to date with the routes.
func (h *Holder) Synced() { h.dirtyVPCs = map[string]bool{} }

// VTEPs are the next hops of every route to install, sorted.
func (h *Holder) VTEPs() []netip.Addr {
	out := slices.Collect(maps.Keys(h.vtepRefs))
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
