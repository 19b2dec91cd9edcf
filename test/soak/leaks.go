package soak

import (
	"fmt"
	"slices"
	"time"
)

// RecordView is one galactic-cni record in a node's state dir.
type RecordView struct {
	ContainerID, HostInterface string
	Live                       bool
}

// QuietView is the world after the schedule and a quiet period, with the
// surviving workloads still running.
type QuietView struct {
	Snapshot
	// Advertisements counts each advertisement's entries, by name.
	Advertisements map[string]int
	// HolderLive tells, for each lease with a holder, whether the holder's
	// container still exists.
	HolderLive map[string]bool
	// Records and Devices (galactic taps and veths) are by node.
	Records map[string][]RecordView
	Devices map[string][]string
}

// QuietProblems lists what leaked: dead entries, empty advertisements,
// leases held by dead holders, records of dead containers, host
// interfaces no live record owns, and receivers' routes not at the
// holder (no window is open once the world is quiet).
func (c *Checker) QuietProblems(v QuietView) []string {
	var out []string
	for _, e := range v.Entries {
		if !e.Live {
			out = append(out, fmt.Sprintf("entry of dead container %s of %s in %s's advertisement", e.ContainerID, e.Key, e.Node))
		}
	}
	for _, name := range sortedKeys(v.Advertisements) {
		if v.Advertisements[name] == 0 {
			out = append(out, "advertisement "+name+" without entries")
		}
	}
	for _, key := range sortedKeys(v.HolderLive) {
		if !v.HolderLive[key] {
			out = append(out, fmt.Sprintf("lease of %s held by dead holder %s", key, v.Leases[key].Holder))
		}
	}
	for _, node := range sortedKeys(v.Records) {
		owned := map[string]bool{}
		for _, r := range v.Records[node] {
			if !r.Live {
				out = append(out, fmt.Sprintf("%s: record of dead container %s", node, r.ContainerID))
			} else {
				owned[r.HostInterface] = true
			}
		}
		for _, d := range v.Devices[node] {
			if !owned[d] {
				out = append(out, fmt.Sprintf("%s: host interface %s without a live record", node, d))
			}
		}
	}
	for _, node := range sortedKeys(v.Devices) {
		if _, ok := v.Records[node]; !ok {
			for _, d := range v.Devices[node] {
				out = append(out, fmt.Sprintf("%s: host interface %s without a live record", node, d))
			}
		}
	}
	for _, rk := range sortedRouteKeys(v.Routes) {
		exp := c.Expected(v.Snapshot, rk.Key)
		if exp != rk.Observer && v.Routes[rk] != exp {
			out = append(out, fmt.Sprintf("%s routes %s via %q, the holder is %q", rk.Observer, rk.Key, v.Routes[rk], exp))
		}
	}
	return out
}

// EmptyView is the world once every workload was deleted.
type EmptyView struct {
	Advertisements []string
	// HeldLeases are leases still naming a holder.
	HeldLeases []string
	Records    map[string][]RecordView
	// Leftovers are the galactic devices, rules, routes, neighbours and
	// FDB entries left, by node (harness.Node.Leftovers).
	Leftovers map[string][]string
}

// EmptyProblems lists what is left once every workload is gone.
func EmptyProblems(v EmptyView) []string {
	var out []string
	for _, a := range v.Advertisements {
		out = append(out, "advertisement "+a+" left")
	}
	for _, l := range v.HeldLeases {
		out = append(out, "lease "+l+" still held")
	}
	for _, node := range sortedKeys(v.Records) {
		for _, r := range v.Records[node] {
			out = append(out, fmt.Sprintf("%s: record %s left", node, r.ContainerID))
		}
	}
	for _, node := range sortedKeys(v.Leftovers) {
		for _, l := range v.Leftovers[node] {
			out = append(out, node+": "+l)
		}
	}
	return out
}

// Window is when a step ran: from its start to its end (a fault: to its
// end step's end).
type Window struct{ From, To time.Time }

func (w Window) overlaps(o Window) bool { return w.From.Before(o.To) && o.From.Before(w.To) }

// BlackoutBound is how long attachment key may be unreachable because of
// step i, or false when the step's blackout for key is not bounded (a
// deletion, or an outage another step on key explains).
func BlackoutBound(topo Topology, steps []Step, windows map[int]Window, i int, key string) (time.Duration, bool) {
	s := steps[i]
	k, _ := KindOf(s.Kind)
	w, ok := windows[i]
	if !ok || s.End {
		return 0, false
	}
	takeover := time.Duration(topo.LeaseSeconds)*time.Second + TakeoverBound
	if !k.Fault {
		if s.Attachment != key || k.Blackout == 0 {
			return 0, false
		}
		// A change that a stalling fault holds up waits like a move's.
		base, faults := k.Blackout, time.Duration(0)
		for j, o := range steps {
			ko, _ := KindOf(o.Kind)
			if !ko.Fault || o.End || !windows[j].overlaps(w) {
				continue
			}
			if _, moved := o.Moves[key]; moved {
				return 0, false
			}
			if ko.Stalls {
				base = max(base, StalledBound)
			}
			faults += ko.Blackout
		}
		return base + faults, true
	}
	for j, o := range steps {
		ko, _ := KindOf(o.Kind)
		if j != i && !ko.Fault && o.Attachment == key && windows[j].overlaps(w) {
			return 0, false
		}
	}
	if _, moved := s.Moves[key]; moved {
		return takeover, true
	}
	if k.Blackout == 0 {
		return 0, false
	}
	return k.Blackout, true
}

// Distribution summarises blackouts: count, median, 90th percentile, max.
func Distribution(ds []time.Duration) (n int, p50, p90, maxd time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return len(s), at(0.5), at(0.9), s[len(s)-1]
}
