package router

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/speaker"
)

var epochAdj = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func up(peer string) speaker.Event {
	return speaker.Event{Kind: speaker.EventPeer, Peer: peer, State: speaker.PeerState{Address: peer, Established: true, State: "ESTABLISHED"}}
}

func down(peer, state string) speaker.Event {
	return speaker.Event{Kind: speaker.EventPeer, Peer: peer, State: speaker.PeerState{Address: peer, State: state}}
}

func paths(peer string, rs ...speaker.Received) speaker.Event {
	for i := range rs {
		rs[i].Peer = peer
	}
	return speaker.Event{Kind: speaker.EventPaths, Peer: peer, Paths: rs}
}

func eor(peer string) speaker.Event { return speaker.Event{Kind: speaker.EventEndOfRIB, Peer: peer} }

func withdrawn(r speaker.Received) speaker.Received {
	r.Withdrawn = true
	return r
}

// ribPrefixes is the prefixes of the RIB, sorted.
func ribPrefixes(r RIB) []string {
	var out []string
	for k := range r {
		out = append(out, k.Prefix.String())
	}
	slices.Sort(out)
	return out
}

type adjStep struct {
	at      time.Duration
	ev      *speaker.Event
	changed bool
	want    []string
}

func runAdj(t *testing.T, a *Adj, steps []adjStep) {
	t.Helper()
	for i, s := range steps {
		now := epochAdj.Add(s.at)
		if s.ev != nil {
			if got := a.Apply(now, *s.ev); got != s.changed {
				t.Errorf("step %d: changed %v, want %v", i, got, s.changed)
			}
		}
		a.Expire(now)
		if got := ribPrefixes(a.RIB()); !slices.Equal(got, s.want) {
			t.Errorf("step %d at %v: RIB %v, want %v", i, s.at, got, s.want)
		}
	}
}

func ev(e speaker.Event) *speaker.Event { return &e }

func TestALostSessionKeepsItsPathsStaleUntilItsEndOfRIB(t *testing.T) {
	const s = time.Second
	rr := "192.0.2.1"
	p5 := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	p6 := received("192.0.2.12", "10.20.0.6/32", 10100, 0, false)
	both := []string{"10.20.0.5/32", "10.20.0.6/32"}
	runAdj(t, &Adj{Stale: time.Hour, Sync: 30 * s}, []adjStep{
		{at: 0, ev: ev(up(rr)), changed: true, want: nil},
		{at: 0, ev: ev(paths(rr, p5, p6)), changed: true, want: both},
		{at: 1 * s, ev: ev(eor(rr)), changed: true, want: both},
		// The reflector stops: nothing goes.
		{at: 2 * s, ev: ev(down(rr, "IDLE")), changed: true, want: both},
		// Connect, active, idle again: not a change of the result.
		{at: 3 * s, ev: ev(down(rr, "ACTIVE")), changed: false, want: both},
		{at: 60 * s, want: both},
		// Back: until its End-of-RIB the old paths stay.
		{at: 61 * s, ev: ev(up(rr)), changed: true, want: both},
		{at: 61 * s, ev: ev(paths(rr, p5)), changed: true, want: both},
		// What it did not send again goes at its End-of-RIB.
		{at: 62 * s, ev: ev(eor(rr)), changed: true, want: []string{"10.20.0.5/32"}},
	})
}

func TestAWithdrawalOnALiveSessionRemovesAtOnceEvenAStaleCopy(t *testing.T) {
	const s = time.Second
	r1, r2 := "192.0.2.1", "192.0.2.2"
	p5 := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	runAdj(t, &Adj{Stale: time.Hour, Sync: 30 * s}, []adjStep{
		{at: 0, ev: ev(up(r1)), changed: true},
		{at: 0, ev: ev(up(r2)), changed: true},
		{at: 0, ev: ev(paths(r1, p5)), changed: true, want: []string{"10.20.0.5/32"}},
		{at: 0, ev: ev(paths(r2, p5)), changed: true, want: []string{"10.20.0.5/32"}},
		// One reflector down: invisible.
		{at: 1 * s, ev: ev(down(r1, "IDLE")), changed: true, want: []string{"10.20.0.5/32"}},
		// The other withdraws: the path is gone, the stale copy too.
		{at: 2 * s, ev: ev(paths(r2, withdrawn(p5))), changed: true, want: nil},
	})
}

func TestStalePathsGoAfterTheStaleBound(t *testing.T) {
	const s = time.Second
	rr := "192.0.2.1"
	p5 := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	a := &Adj{Stale: 100 * s, Sync: 30 * s}
	runAdj(t, a, []adjStep{
		{at: 0, ev: ev(up(rr)), changed: true},
		{at: 0, ev: ev(paths(rr, p5)), changed: true, want: []string{"10.20.0.5/32"}},
		{at: 10 * s, ev: ev(down(rr, "IDLE")), changed: true, want: []string{"10.20.0.5/32"}},
		{at: 109 * s, want: []string{"10.20.0.5/32"}},
	})
	if next := a.Expire(epochAdj.Add(109 * s)); !next.Equal(epochAdj.Add(110 * s)) {
		t.Errorf("next %v, want the stale bound's end", next)
	}
	runAdj(t, a, []adjStep{{at: 110 * s, want: nil}})
}

func TestAStaleBoundOfZeroDropsALostSessionsPaths(t *testing.T) {
	rr := "192.0.2.1"
	p5 := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	runAdj(t, &Adj{Sync: 30 * time.Second}, []adjStep{
		{at: 0, ev: ev(up(rr)), changed: true},
		{at: 0, ev: ev(paths(rr, p5)), changed: true, want: []string{"10.20.0.5/32"}},
		{at: time.Second, ev: ev(down(rr, "IDLE")), changed: true, want: nil},
	})
}

func TestASessionWithoutEndOfRIBCountsAsSyncedAfterTheWait(t *testing.T) {
	const s = time.Second
	rr := "192.0.2.1"
	p5 := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	p6 := received("192.0.2.12", "10.20.0.6/32", 10100, 0, false)
	a := &Adj{Stale: time.Hour, Sync: 30 * s}
	runAdj(t, a, []adjStep{
		{at: 0, ev: ev(up(rr)), changed: true},
		{at: 0, ev: ev(paths(rr, p5, p6)), changed: true, want: []string{"10.20.0.5/32", "10.20.0.6/32"}},
		{at: 1 * s, ev: ev(down(rr, "IDLE")), changed: true, want: []string{"10.20.0.5/32", "10.20.0.6/32"}},
		{at: 2 * s, ev: ev(up(rr)), changed: true, want: []string{"10.20.0.5/32", "10.20.0.6/32"}},
		{at: 2 * s, ev: ev(paths(rr, p5)), changed: true, want: []string{"10.20.0.5/32", "10.20.0.6/32"}},
		{at: 31 * s, want: []string{"10.20.0.5/32", "10.20.0.6/32"}},
		{at: 32 * s, want: []string{"10.20.0.5/32"}},
	})
	if _, any, all := a.Sessions([]string{rr}); !any || !all {
		t.Errorf("synced %v/%v after the wait", any, all)
	}
}

func TestACurrentCopyIsPreferredOverAStaleOne(t *testing.T) {
	r1, r2 := "192.0.2.1", "192.0.2.2"
	old := received("192.0.2.12", "10.20.0.5/32", 10100, 1, false)
	cur := old
	cur.Generation = 2
	a := &Adj{Stale: time.Hour, Sync: 30 * time.Second}
	a.Apply(epochAdj, up(r1))
	a.Apply(epochAdj, up(r2))
	a.Apply(epochAdj, paths(r1, old))
	a.Apply(epochAdj, paths(r2, old))
	a.Apply(epochAdj, down(r1, "IDLE"))
	a.Apply(epochAdj, paths(r2, cur))
	if got := a.RIB()[old.Key()]; got.Generation != 2 || got.Peer != r2 {
		t.Fatalf("RIB has %+v, want the live session's generation 2", got)
	}
}

func TestTheStartJudgesKernelRoutesAfterEndOfRIBOrTheStaleBound(t *testing.T) {
	const s = time.Second
	cases := []struct {
		name           string
		since          time.Duration
		anyEOR, allEOR bool
		want           bool
	}{
		{"every peer's End-of-RIB", 1 * s, true, true, true},
		{"one End-of-RIB, before the wait", 10 * s, true, false, false},
		{"one End-of-RIB, after the wait", 30 * s, true, false, true},
		{"no End-of-RIB after the wait", 31 * s, false, false, false},
		{"no End-of-RIB until the stale bound", 3599 * s, false, false, false},
		{"no End-of-RIB at the stale bound", 3600 * s, false, false, true},
	}
	for _, tc := range cases {
		if got := StartSynced(tc.since, tc.anyEOR, tc.allEOR, 30*s, time.Hour); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if !StartSynced(30*s, false, false, 30*s, 0) {
		t.Error("with no stale bound the wait still ends the start")
	}
}

func TestAnotherNodesPathWithThisNodesRouterIDIsADuplicate(t *testing.T) {
	me := netip.MustParseAddr("192.0.2.11")
	dup := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	dup.RD.Admin = me
	other := received("192.0.2.13", "10.20.0.6/32", 10100, 0, false)
	got := Duplicates(rib(dup, other), me, me)
	if len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.12") {
		t.Fatalf("duplicates %v, want 192.0.2.12", got)
	}
	if got := Duplicates(rib(other), me, me); len(got) != 0 {
		t.Fatalf("duplicates %v without one", got)
	}
}

func TestCurrentCountsTheLiveSessionsPathsNotTheStaleOnes(t *testing.T) {
	r1, r2 := "192.0.2.1", "192.0.2.2"
	p5 := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	p6 := received("192.0.2.12", "10.20.0.6/32", 10100, 0, false)
	a := &Adj{Stale: time.Hour, Sync: time.Minute}
	for _, e := range []speaker.Event{up(r1), up(r2), paths(r1, p5, p6), paths(r2, p5)} {
		a.Apply(epochAdj, e)
	}
	if got := a.Current(); got != 3 {
		t.Fatalf("current %d, want the 3 paths both sessions sent", got)
	}
	// r1's paths turn stale: its Adj-RIB-In is gone with the session.
	a.Apply(epochAdj, down(r1, "IDLE"))
	if got := a.Current(); got != 1 {
		t.Fatalf("current %d after r1 went down, want r2's 1", got)
	}
	a.Apply(epochAdj, up(r1))
	a.Apply(epochAdj, paths(r1, p5))
	if got := a.Current(); got != 2 {
		t.Fatalf("current %d after r1 sent one path again, want 2", got)
	}
}

func TestAPackedKeyGivesBackTheKey(t *testing.T) {
	for _, k := range []speaker.Key{
		{RD: speaker.RD{Admin: netip.MustParseAddr("192.0.2.1"), Assigned: 7}, Prefix: netip.MustParsePrefix("10.0.0.1/32")},
		{RD: speaker.RD{Admin: netip.MustParseAddr("192.0.2.1"), Assigned: 65535}, Prefix: netip.MustParsePrefix("fd20::/64")},
		{RD: speaker.RD{Admin: netip.MustParseAddr("192.0.2.1"), Assigned: 2}, Prefix: netip.MustParsePrefix("fd20::5/128")},
		{RD: speaker.RD{Admin: netip.MustParseAddr("192.0.2.1"), Assigned: 2}, Prefix: netip.PrefixFrom(netip.MustParseAddr("fd20::5"), 129)},
		{RD: speaker.RD{Admin: netip.MustParseAddr("2001:db8::1"), Assigned: 1}, Prefix: netip.MustParsePrefix("0.0.0.0/0")},
		{RD: speaker.RD{Admin: netip.MustParseAddr("::ffff:192.0.2.1")}, Prefix: netip.MustParsePrefix("::ffff:10.0.0.0/120")},
		{RD: speaker.RD{Assigned: 3}},
		{},
	} {
		if got := packKey(k).key(); got != k {
			t.Errorf("packed and back, %v is %v", k, got)
		}
	}
	a := speaker.Key{RD: speaker.RD{Admin: netip.MustParseAddr("192.0.2.1")}, Prefix: netip.MustParsePrefix("10.0.0.0/24")}
	b := a
	b.Prefix = netip.MustParsePrefix("10.0.0.0/25")
	if packKey(a) == packKey(b) {
		t.Error("two prefix lengths pack to one key")
	}
}
