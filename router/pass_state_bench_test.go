package router

import (
	"net/netip"
	"time"

	"github.com/galactic-cni/galactic/router/speaker"
)

// passState is the in-memory side of Daemon.pass without the daemon.
type passState struct {
	br     *benchRIB
	adj    Adj
	imp    Importer
	holder Holder
	synced map[string]remotesSum
	vteps  []netip.Addr
	// planned counts the routes handed to the kernel side.
	planned int
}

func newPassState(br *benchRIB) *passState {
	s := &passState{br: br, adj: Adj{Stale: time.Hour, Sync: 30 * time.Second}, holder: Holder{Hold: 10 * time.Second},
		imp:    Importer{RTASN: 65000, RouterID: netip.MustParseAddr("198.51.100.1"), Underlay: benchUnderlay},
		synced: map[string]remotesSum{}}
	s.imp.Adj = &s.adj
	return s
}

func (s *passState) apply(ev speaker.Event) { s.adj.Apply(epochAdj, ev) }

// pass is one pass: full as a resync (the kernel side compares every
// VPC), recompute as the first pass (the selection from scratch).
func (s *passState) pass(now time.Time, full, recompute bool) {
	s.adj.Expire(now)
	s.imp.Apply(s.adj.TakeChanges())
	s.imp.Duplicates()
	s.imp.SetVNIs(s.br.vnis)
	if recompute {
		s.imp.Resync()
	}
	changes := s.imp.Select()
	s.holder.Update(now, &s.imp, s.imp.Fences(), s.br.managed, false, changes)
	changed := full
	for vpc := range s.br.vnis {
		if !full && !s.holder.Changed(vpc) {
			continue
		}
		// As routesStage: the sum first, the routes for what is planned.
		if sum := s.holder.Sum(vpc); full || sum != s.synced[vpc] {
			changed = true
			s.synced[vpc] = sum
			s.planned += len(s.holder.Routes(vpc))
		}
	}
	if changed {
		s.vteps = s.holder.VTEPs()
	}
	s.holder.Synced()
}
