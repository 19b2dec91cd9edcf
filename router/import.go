package router

import (
	"net/netip"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// RIB is the best paths other nodes announce, by RIB key, as the speaker
// reported them.
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
	return a.RD.Assigned < b.RD.Assigned
}

// Select picks, for every prefix of each VPC's route target, the path to
// install. Drained paths are never selected; drained reports the prefixes
// that have only drained paths, whose kernel routes go at once.
func Select(rib RIB, rtASN uint16, vnis map[string]uint32) (selected map[string]map[netip.Prefix]speaker.Received, drained map[string]map[netip.Prefix]bool) {
	byVNI := map[uint32]string{}
	for vpc, v := range vnis {
		byVNI[v] = vpc
	}
	selected = map[string]map[netip.Prefix]speaker.Received{}
	drained = map[string]map[netip.Prefix]bool{}
	for _, r := range rib {
		vpc, ok := byVNI[r.VNI]
		if !ok || r.RTASN != rtASN || !r.NextHop.IsValid() || len(r.RouterMAC) != 6 {
			continue
		}
		if r.Drained {
			if drained[vpc] == nil {
				drained[vpc] = map[netip.Prefix]bool{}
			}
			drained[vpc][r.Prefix] = true
			continue
		}
		if selected[vpc] == nil {
			selected[vpc] = map[netip.Prefix]speaker.Received{}
		}
		if cur, ok := selected[vpc][r.Prefix]; !ok || better(r, cur) {
			selected[vpc][r.Prefix] = r
		}
	}
	for vpc, ps := range drained {
		for p := range ps {
			if _, ok := selected[vpc][p]; ok {
				delete(ps, p)
			}
		}
	}
	return selected, drained
}

type vpcPrefix struct {
	vpc    string
	prefix netip.Prefix
}

// Holder keeps remote routes that were withdrawn without a replacement for
// the withdrawal hold, so a peer that restarts without a graceful-restart
// helper (FRR's EVPN) changes nothing in the kernel.
type Holder struct {
	Hold time.Duration
	// last is what was installed last, and held when each started.
	last map[vpcPrefix]dataplane.Remote
	held map[vpcPrefix]time.Time
}

// Seed starts from routes found in the kernel (a restart): they are kept
// like withdrawn ones until the RIB has them again or the hold passes.
func (h *Holder) Seed(vpc string, rs []dataplane.Remote) {
	if h.last == nil {
		h.last = map[vpcPrefix]dataplane.Remote{}
	}
	for _, r := range rs {
		h.last[vpcPrefix{vpc, r.Prefix}] = r
	}
}

// Desired turns the selection into the routes to install per VPC, holding
// what went away without a replacement; frozen (the RIB is not synced yet)
// holds everything without starting the clock. next is when a hold ends,
// zero when none is running.
func (h *Holder) Desired(now time.Time, selected map[string]map[netip.Prefix]speaker.Received, drained map[string]map[netip.Prefix]bool, managed map[string]bool, frozen bool) (out map[string][]dataplane.Remote, next time.Time) {
	if h.held == nil {
		h.held = map[vpcPrefix]time.Time{}
	}
	cur := map[vpcPrefix]dataplane.Remote{}
	for vpc, ps := range selected {
		if !managed[vpc] {
			continue
		}
		for p, r := range ps {
			cur[vpcPrefix{vpc, p}] = dataplane.Remote{Prefix: p, NextHop: r.NextHop, RouterMAC: r.RouterMAC}
			delete(h.held, vpcPrefix{vpc, p})
		}
	}
	for k, r := range h.last {
		if _, ok := cur[k]; ok || !managed[k.vpc] || drained[k.vpc][k.prefix] {
			delete(h.held, k)
			continue
		}
		if frozen {
			cur[k] = r
			continue
		}
		since, ok := h.held[k]
		if !ok {
			since = now
			h.held[k] = now
		}
		end := since.Add(h.Hold)
		if now.Before(end) {
			cur[k] = r
			if next.IsZero() || end.Before(next) {
				next = end
			}
		} else {
			delete(h.held, k)
		}
	}
	h.last = cur
	out = map[string][]dataplane.Remote{}
	for k, r := range cur {
		out[k.vpc] = append(out[k.vpc], r)
	}
	return out, next
}
