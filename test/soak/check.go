package soak

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// LeaseView is what the API says of an attachment's handoff lease.
type LeaseView struct {
	Holder string
	Token  int64
	// Available: the holder reported available under the current token.
	Available bool
}

// EntryView is one container entry of a node's advertisement.
type EntryView struct {
	Key, Node, ContainerID string
	Generation             int64
	// Live: the entry's netns exists.
	Live bool
	// Standby: a live-migration target's entry, which holds nothing and
	// is never announced.
	Standby bool
}

// RouteKey names a receiver's route for an attachment's prefix.
type RouteKey struct{ Observer, Key string }

// Snapshot is one sample of the world.
type Snapshot struct {
	At      time.Time
	Leases  map[string]LeaseView
	Entries []EntryView
	// Records are the nodes' galactic-cni records of the attachments,
	// as entries: the holder and generation each ADD acquired.
	Records []EntryView
	// Routes are the receivers' remote routes for each attachment's
	// prefix, as the node the next hop belongs to ("" without a route),
	// for every node with a routing domain of the attachment's VPC.
	Routes map[RouteKey]string
	// Claims are the signs that object-backed attachments hold addresses.
	Claims []AddressClaim
}

// AddressClaim is one sign that an attachment identity holds an address of
// a VPC: a Bound VPCAddress, an attachment's status, an advertisement's
// entry.
type AddressClaim struct {
	// VPC is the VPC's UID, UID the attachment's.
	VPC, Address, UID string
	// Source names what says so, for the violation's detail.
	Source string
}

// Bounds are the documented windows the checkers allow.
type Bounds struct {
	// WithdrawHold is the routers' withdrawHoldSeconds.
	WithdrawHold time.Duration
	// Converge is how long a change may take to reach every receiver's
	// kernel (API watch, reconcile, two BGP hops, install) on a loaded
	// machine.
	Converge time.Duration
	// RoutingGrace extends the tolerance after a routing fault ends: a
	// restarted router keeps stale routes until End-of-RIB or 30 s.
	RoutingGrace time.Duration
	// Lag is how long the checker's own view (informers, 100 ms samples)
	// may trail a receiver's kernel: a next hop whose holding the samples
	// have not shown yet is judged only once it outlasts Lag.
	Lag time.Duration
}

// Violation is one invariant broken.
type Violation struct {
	At time.Duration
	// Step is the last step started when it was seen: the schedule's
	// prefix up to it reproduces it.
	Step          int
	Check, Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("+%.1fs after step #%d: %s: %s", v.At.Seconds(), v.Step, v.Check, v.Detail)
}

type change struct {
	at  time.Time
	val string
}

type routeState struct {
	via     string
	changes []time.Time
	// since is when via last changed.
	since time.Time
	// unheld is when the checker first saw via at a node it had no sign
	// of holding the attachment lately (zero while it has one).
	unheld time.Time
}

type moveWindow struct {
	step     int
	key      string
	from, to time.Time
	nodes    []string
	done     bool
	// spoiled: another step touched the attachment within the window.
	spoiled, checked bool
	// migrate: a live migration, whose lease goes from the source's
	// token to free to the target's next token and to no one else;
	// token is the lease's token when it began.
	migrate bool
	token   int64
}

// Checker checks the invariants over a stream of snapshots and step
// boundaries. It is pure: time comes from the snapshots and the calls.
type Checker struct {
	Topo   Topology
	Bounds Bounds
	start  time.Time
	last   int
	// open are the faults running, by start step; routingUntil is when
	// the last routing fault's grace ends.
	open         map[int]bool
	routingOpen  int
	routingUntil time.Time
	// routingSpans are the routing faults' [start, end+grace] spans.
	routingSpans [][2]time.Time
	expected     map[string][]change
	// hosted is when each node last had a live entry of each attachment:
	// a holder the 100 ms samples missed (available for a moment) is
	// still one a receiver may route to.
	hosted  map[string]map[string]time.Time
	routes  map[RouteKey]*routeState
	holders map[string]map[int64]string
	tokens  map[string]int64
	moves   []*moveWindow
	// conflicts are when each address conflict (two identities of one
	// address) was first seen, while it lasts.
	conflicts  map[string]time.Time
	reported   map[string]bool
	Violations []Violation
	// Samples counts the snapshots checked; Routes the receivers' routes
	// checked in them, Routed those that had a route; Claims the address
	// claims.
	Samples, Routes, Routed, Claims int
}

// NewChecker starts checking at start.
func NewChecker(topo Topology, b Bounds, start time.Time) *Checker {
	return &Checker{Topo: topo, Bounds: b, start: start, open: map[int]bool{}, expected: map[string][]change{},
		routes: map[RouteKey]*routeState{}, hosted: map[string]map[string]time.Time{}, holders: map[string]map[int64]string{}, tokens: map[string]int64{},
		reported: map[string]bool{}, conflicts: map[string]time.Time{}}
}

func (c *Checker) violate(at time.Time, dedup, check, format string, args ...any) {
	if dedup != "" {
		if c.reported[dedup] {
			return
		}
		c.reported[dedup] = true
	}
	c.Violations = append(c.Violations, Violation{At: at.Sub(c.start), Step: c.last, Check: check, Detail: fmt.Sprintf(format, args...)})
}

// Fail records a violation found outside the snapshots (a step that
// failed, a blackout, a leak).
func (c *Checker) Fail(at time.Time, check, format string, args ...any) {
	c.violate(at, "", check, format, args...)
}

// Begin notes that step s started at t.
func (c *Checker) Begin(s Step, t time.Time) {
	c.last = max(c.last, s.Seq)
	for _, m := range c.moves {
		_, moved := s.Moves[m.key]
		if m.step != s.Seq && (s.Attachment == m.key || moved) && (!m.done || t.Before(m.to)) {
			m.spoiled = true
		}
	}
	k, _ := KindOf(s.Kind)
	switch {
	case k.Fault && !s.End:
		c.open[s.Seq] = true
		if k.Routing {
			c.routingOpen++
			c.routingSpans = append(c.routingSpans, [2]time.Time{t, t.Add(100 * 365 * 24 * time.Hour)})
		}
	case s.End:
		if c.open[s.Start] && k.Routing {
			c.routingOpen--
			for i := len(c.routingSpans) - 1; i >= 0; i-- {
				if c.routingSpans[i][1].After(t.Add(time.Hour)) {
					c.routingSpans[i][1] = t.Add(c.Bounds.RoutingGrace + c.Bounds.WithdrawHold + c.Bounds.Converge)
					break
				}
			}
			c.routingUntil = t.Add(c.Bounds.RoutingGrace + c.Bounds.WithdrawHold + c.Bounds.Converge)
		}
		delete(c.open, s.Start)
	case s.Kind == "move" || s.Kind == "migrate":
		c.moves = append(c.moves, &moveWindow{step: s.Seq, key: s.Attachment, from: t, nodes: []string{s.Node, s.To},
			migrate: s.Kind == "migrate", token: c.tokens[s.Attachment]})
	}
}

// Done notes that step s finished at t.
func (c *Checker) Done(s Step, t time.Time) {
	for _, m := range c.moves {
		if m.step == s.Seq && !m.done {
			m.to, m.done = t.Add(c.Bounds.WithdrawHold+c.Bounds.Converge), true
		}
	}
}

func (c *Checker) routingFault(t time.Time) bool {
	return c.routingOpen > 0 || t.Before(c.routingUntil)
}

// Expected is the node an attachment's traffic should go to: the node of
// its live entry with the highest holderGeneration, when that entry may
// be routed (announce always, or the lease's holder reports available
// under that generation); "" when none.
func (c *Checker) Expected(s Snapshot, key string) string {
	var best *EntryView
	for i, e := range s.Entries {
		if e.Key == key && e.Live && (best == nil || e.Generation > best.Generation) {
			best = &s.Entries[i]
		}
	}
	if best == nil {
		return ""
	}
	if c.Topo.attachment(key).Announce == "whenAvailable" {
		l := s.Leases[key]
		if !l.Available || l.Token != best.Generation || l.Holder != best.Node+"/"+best.ContainerID {
			return ""
		}
	}
	return best.Node
}

// Observe checks one snapshot.
func (c *Checker) Observe(s Snapshot) {
	c.Samples++
	now := s.At
	// A node held an attachment while it had a live entry, a live
	// galactic-cni record or the lease: a holder that lived for less than
	// a sample (a takeover upgraded in place at once) may show in one of
	// them only, and its announcement is then held at receivers like any
	// other withdrawal.
	for _, es := range [][]EntryView{s.Entries, s.Records} {
		for _, e := range es {
			if e.Live && !e.Standby {
				c.held(e.Key, e.Node, now)
			}
		}
	}
	for key, l := range s.Leases {
		if node, _, ok := strings.Cut(l.Holder, "/"); ok {
			c.held(key, node, now)
		}
	}
	for _, a := range c.Topo.Attachments {
		key := a.Key()
		c.checkLease(now, key, s.Leases[key])
		c.checkGenerations(now, key, s.Entries, "entries")
		c.checkGenerations(now, key, s.Records, "records")
		exp := c.Expected(s, key)
		h := c.expected[key]
		if len(h) == 0 || h[len(h)-1].val != exp {
			c.expected[key] = append(h, change{now, exp})
		}
	}
	for _, rk := range sortedRouteKeys(s.Routes) {
		via := s.Routes[rk]
		c.Routes++
		if via != "" {
			c.Routed++
		}
		st := c.routes[rk]
		if st == nil {
			st = &routeState{via: via, since: now}
			c.routes[rk] = st
		} else if st.via != via {
			st.via, st.since = via, now
			st.changes = append(st.changes, now)
		}
		c.checkRoute(now, rk, via, st)
	}
	c.checkMigrations(now, s.Leases)
	c.checkMoves(now)
	c.checkAddresses(now, s.Claims)
}

// checkAddresses: within one VPC no address is held by two attachment
// identities at once, whatever says so (two statuses, a status and a
// VPCAddress, an advertisement entry of a predecessor). A conflict is
// judged once it outlasts Lag: the API's kinds are sampled through
// separate informers, which may trail each other for a moment.
func (c *Checker) checkAddresses(now time.Time, claims []AddressClaim) {
	c.Claims += len(claims)
	type where struct{ vpc, addr string }
	by := map[where]map[string][]string{}
	for _, cl := range claims {
		w := where{cl.VPC, cl.Address}
		if by[w] == nil {
			by[w] = map[string][]string{}
		}
		by[w][cl.UID] = append(by[w][cl.UID], cl.Source)
	}
	seen := map[string]bool{}
	for w, uids := range by {
		if len(uids) < 2 {
			continue
		}
		ids := sortedKeys(uids)
		k := w.vpc + " " + w.addr + " " + strings.Join(ids, " ")
		seen[k] = true
		first, ok := c.conflicts[k]
		if !ok {
			first = now
			c.conflicts[k] = now
		}
		if now.Sub(first) < c.Bounds.Lag {
			continue
		}
		var who []string
		for _, id := range ids {
			who = append(who, fmt.Sprintf("%s (%s)", id, strings.Join(uids[id], ", ")))
		}
		c.violate(now, "address "+k, "one identity per address", "address %s of VPC %s is held by %d attachment identities: %s",
			w.addr, w.vpc, len(ids), strings.Join(who, "; "))
	}
	for k := range c.conflicts {
		if !seen[k] {
			delete(c.conflicts, k)
		}
	}
}

// checkMigrations: while a live migration runs, its lease is held by the
// source under the token it began with, by no one, or by the target under
// the next token; never by a third node, never further on.
func (c *Checker) checkMigrations(now time.Time, leases map[string]LeaseView) {
	for _, m := range c.moves {
		if !m.migrate || m.spoiled || m.done {
			continue
		}
		l := leases[m.key]
		node, _, _ := strings.Cut(l.Holder, "/")
		dedup := fmt.Sprintf("migration %d", m.step)
		switch {
		case l.Token > m.token+1:
			c.violate(now, dedup, "one holder", "step #%d migrating %s: the lease went from token %d to %d", m.step, m.key, m.token, l.Token)
		case node == m.nodes[0] && l.Token != m.token, node == m.nodes[1] && l.Token != m.token+1,
			node != "" && !slices.Contains(m.nodes, node):
			c.violate(now, dedup, "one holder", "step #%d migrating %s from %s to %s (token %d): the lease is held by %s under token %d",
				m.step, m.key, m.nodes[0], m.nodes[1], m.token, l.Holder, l.Token)
		}
	}
}

func (c *Checker) held(key, node string, now time.Time) {
	if c.hosted[key] == nil {
		c.hosted[key] = map[string]time.Time{}
	}
	c.hosted[key][node] = now
}

func sortedRouteKeys(m map[RouteKey]string) []RouteKey {
	var out []RouteKey
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b RouteKey) int {
		if a.Key != b.Key {
			return compare(a.Key, b.Key)
		}
		return compare(a.Observer, b.Observer)
	})
	return out
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkLease: the token never goes back, and one token has one holder.
func (c *Checker) checkLease(now time.Time, key string, l LeaseView) {
	if l.Token < c.tokens[key] {
		c.violate(now, fmt.Sprintf("token %s %d", key, l.Token), "one holder", "lease of %s went back from token %d to %d", key, c.tokens[key], l.Token)
	}
	c.tokens[key] = max(c.tokens[key], l.Token)
	if l.Holder == "" {
		return
	}
	byToken := c.holders[key]
	if byToken == nil {
		byToken = map[int64]string{}
		c.holders[key] = byToken
	}
	if prev, ok := byToken[l.Token]; ok && prev != l.Holder {
		c.violate(now, fmt.Sprintf("holders %s %d", key, l.Token), "one holder", "lease of %s held by %s and by %s under one token %d", key, prev, l.Holder, l.Token)
	}
	byToken[l.Token] = l.Holder
}

// checkGenerations: no two live entries (or records) share a
// holderGeneration: two runtimes never hold one token.
func (c *Checker) checkGenerations(now time.Time, key string, entries []EntryView, what string) {
	seen := map[int64]string{}
	for _, e := range entries {
		if e.Key != key || !e.Live || e.Standby {
			continue
		}
		who := e.Node + "/" + e.ContainerID
		if prev, ok := seen[e.Generation]; ok && prev != who {
			c.violate(now, fmt.Sprintf("gen %s %s %d", what, key, e.Generation), "unique generation",
				"%s has two live %s with holderGeneration %d: %s and %s", key, what, e.Generation, prev, who)
		}
		seen[e.Generation] = who
	}
}

// recent reports whether node was the expected one for key, or had a
// live entry of it, since t.
func (c *Checker) recent(key, node string, since time.Time) bool {
	if t, ok := c.hosted[key][node]; ok && !t.Before(since) {
		return true
	}
	h := c.expected[key]
	for i, ch := range h {
		if ch.val != node {
			continue
		}
		if i+1 >= len(h) || !h[i+1].at.Before(since) {
			return true
		}
	}
	return false
}

func (c *Checker) checkRoute(now time.Time, rk RouteKey, via string, st *routeState) {
	routeSince := st.since
	h := c.expected[rk.Key]
	exp, since := h[len(h)-1].val, h[len(h)-1].at
	// The window runs from the later of the holder's change and the
	// route's: a receiver that just followed a holder the samples missed
	// is converging, not wrong.
	if routeSince.After(since) {
		since = routeSince
	}
	dedup := fmt.Sprintf("route %s %s %s %s", rk.Observer, rk.Key, via, since)
	if exp == rk.Observer || via == exp {
		return
	}
	// A replacement takes over at once; only a withdrawal without one is
	// held (withdrawHold).
	window := c.Bounds.Converge
	if exp == "" {
		window += c.Bounds.WithdrawHold
	}
	// A next hop that did not hold the attachment lately is never right,
	// whatever fault runs.
	lately := now.Add(-c.Bounds.WithdrawHold - c.Bounds.RoutingGrace - 2*c.Bounds.Converge)
	if via != "" && !c.recent(rk.Key, via, lately) {
		if st.unheld.IsZero() {
			st.unheld = now
		}
		if now.Sub(st.unheld) >= c.Bounds.Lag {
			c.violate(now, dedup, "route at holder", "%s routes %s via %s, which has not held it lately (holder: %q)", rk.Observer, rk.Key, via, exp)
		}
		return
	}
	st.unheld = time.Time{}
	if c.routingFault(now) || now.Sub(since) <= window {
		return
	}
	c.violate(now, dedup, "route at holder", "%s routes %s via %q for %.1fs after the holder became %q (window %s)",
		rk.Observer, rk.Key, via, now.Sub(since).Seconds(), exp, window)
}

// checkMoves: a move changes each receiver's route at most once, unless a
// routing fault or another step on the attachment overlapped it.
func (c *Checker) checkMoves(now time.Time) {
	for _, m := range c.moves {
		if !m.done || m.checked || now.Before(m.to) {
			continue
		}
		m.checked = true
		if m.spoiled || c.RoutingFaultBetween(m.from, m.to) {
			continue
		}
		for _, rk := range sortedRouteKeys(c.routeKeysOf(m.key)) {
			if slices.Contains(m.nodes, rk.Observer) {
				continue
			}
			n := 0
			for _, t := range c.routes[rk].changes {
				if !t.Before(m.from) && !t.After(m.to) {
					n++
				}
			}
			if n > 1 {
				c.violate(now, "", "one change per move", "step #%d moved %s and %s's route changed %d times", m.step, m.key, rk.Observer, n)
			}
		}
	}
	c.moves = slices.DeleteFunc(c.moves, func(m *moveWindow) bool { return m.checked })
}

func (c *Checker) routeKeysOf(key string) map[RouteKey]string {
	out := map[RouteKey]string{}
	for rk, st := range c.routes {
		if rk.Key == key {
			out[rk] = st.via
		}
	}
	return out
}

// RoutingFaultBetween reports whether a routing fault (or its grace)
// overlapped [from, to].
func (c *Checker) RoutingFaultBetween(from, to time.Time) bool {
	for _, sp := range c.routingSpans {
		if sp[0].Before(to) && sp[1].After(from) {
			return true
		}
	}
	return false
}

// FailStep records a violation that step caused (a blackout over its
// bound, measured afterwards).
func (c *Checker) FailStep(step int, at time.Time, check, format string, args ...any) {
	c.Violations = append(c.Violations, Violation{At: at.Sub(c.start), Step: step, Check: check, Detail: fmt.Sprintf(format, args...)})
}
