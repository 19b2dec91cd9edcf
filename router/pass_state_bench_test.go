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
	imp    Importer
	holder Holder
	synced map[string]map[netip.Prefix]dataplane.Remote
	vteps  []netip.Addr
}

func newPassState(br *benchRIB) *passState {
	return &passState{br: br, adj: Adj{Stale: time.Hour, Sync: 30 * time.Second}, holder: Holder{Hold: 10 * time.Second},
		imp:    Importer{RTASN: 65000, RouterID: netip.MustParseAddr("198.51.100.1"), Underlay: benchUnderlay},
		synced: map[string]map[netip.Prefix]dataplane.Remote{}}
}

func (s *passState) apply(ev speaker.Event) { s.adj.Apply(epochAdj, ev) }

func (s *passState) pass(now time.Time, full bool) {
	s.adj.Expire(now)
	s.imp.Apply(s.adj.TakeChanges())
	s.imp.Duplicates()
	s.imp.SetVNIs(s.br.vnis)
	if full {
		s.imp.Resync()
	}
	keys, all := s.imp.Select()
	s.holder.Update(now, s.imp.Selected(), s.imp.Fences(), s.br.managed, false, keys, all)
	changed := full
	for vpc := range s.br.vnis {
		if !full && !s.holder.Changed(vpc) {
			continue
		}
		rs := s.holder.Routes(vpc)
		if full || !sameRemotes(s.synced[vpc], rs) {
			changed = true
			m := make(map[netip.Prefix]dataplane.Remote, len(rs))
			for _, r := range rs {
				m[r.Prefix] = r
			}
			s.synced[vpc] = m
		}
	}
	if changed {
		s.vteps = s.holder.VTEPs()
	}
	s.holder.Synced()
}
