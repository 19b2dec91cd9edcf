package router

import (
	"net/netip"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// passState is the in-memory side of Daemon.pass without the daemon.
type passState struct {
	br     *benchRIB
	adj    Adj
	holder Holder
	fences Fences
	synced map[string]map[netip.Prefix]dataplane.Remote
	vteps  []netip.Addr
}

func newPassState(br *benchRIB) *passState {
	return &passState{br: br, adj: Adj{Stale: time.Hour, Sync: 30 * time.Second}, holder: Holder{Hold: 10 * time.Second},
		synced: map[string]map[netip.Prefix]dataplane.Remote{}}
}

func (s *passState) apply(ev speaker.Event) { s.adj.Apply(epochAdj, ev) }

func (s *passState) pass(now time.Time, full bool) {
	s.adj.Expire(now)
	rib := s.adj.RIB()
	seen := RIB{}
	for k, r := range rib {
		seen[k] = r
	}
	Duplicates(seen, netip.MustParseAddr("198.51.100.1"), benchUnderlay)
	sel, f := Select(rib, 65000, s.br.vnis, s.fences)
	s.fences = f
	remotes, _ := s.holder.Desired(now, sel, f, s.br.managed, false)
	changed := full
	for vpc := range s.br.vnis {
		if full || !sameRemotes(s.synced[vpc], remotes[vpc]) {
			changed = true
			m := make(map[netip.Prefix]dataplane.Remote, len(remotes[vpc]))
			for _, r := range remotes[vpc] {
				m[r.Prefix] = r
			}
			s.synced[vpc] = m
		}
	}
	if changed {
		s.vteps = vtepsOf(remotes)
	}
}
