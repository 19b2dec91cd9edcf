package router

import (
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

var vnis = map[string]uint32{"blue": 10100, "red": 10200}

// received is a path node announces for prefix in vni with route target
// 65000, generation gen, from the node's own underlay address.
func received(node, prefix string, vni, gen uint32, drained bool) speaker.Received {
	a := netip.MustParseAddr(node)
	return speaker.Received{Route: speaker.Route{
		RD: speaker.RD{Admin: a, Assigned: 1}, Prefix: netip.MustParsePrefix(prefix), VNI: vni, RTASN: 65000,
		NextHop: a, RouterMAC: net.HardwareAddr{0x02, 0, a.As4()[0], a.As4()[1], a.As4()[2], a.As4()[3]},
		Generation: gen, Drained: drained,
	}}
}

func withTargets(r speaker.Received, ts ...speaker.RouteTarget) speaker.Received {
	r.Targets = ts
	return r
}

func rib(rs ...speaker.Received) RIB {
	r := RIB{}
	r.Apply(rs)
	return r
}

// selectedFrom renders a selection as vpc → prefix → the winner's RD admin.
func selectedFrom(sel map[string]map[netip.Prefix]speaker.Received) map[string]map[string]string {
	out := map[string]map[string]string{}
	for vpc, ps := range sel {
		if len(ps) == 0 {
			continue
		}
		out[vpc] = map[string]string{}
		for p, r := range ps {
			out[vpc][p.String()] = r.RD.Admin.String()
		}
	}
	return out
}

func drainedFrom(d Fences) map[string][]string {
	out := map[string][]string{}
	for vpc, ps := range d {
		for p := range ps {
			out[vpc] = append(out[vpc], p.String())
		}
		slices.Sort(out[vpc])
	}
	return out
}

func TestSelectInstallsTheBestUndrainedPathOfEachPrefix(t *testing.T) {
	const pfx = "10.20.0.5/32"
	otherRT := received("192.0.2.12", pfx, 10100, 9, false)
	otherRT.RTASN = 65001
	noHop := received("192.0.2.12", pfx, 10100, 9, false)
	noHop.NextHop = netip.Addr{}
	noMAC := received("192.0.2.12", pfx, 10100, 9, false)
	noMAC.RouterMAC = nil
	cases := []struct {
		name     string
		rib      RIB
		selected map[string]map[string]string
		drained  map[string][]string
	}{
		{"the higher generation wins over the lower router ID",
			rib(received("192.0.2.12", pfx, 10100, 3, false), received("192.0.2.13", pfx, 10100, 4, false)),
			map[string]map[string]string{"blue": {pfx: "192.0.2.13"}}, map[string][]string{}},
		{"of one generation the lower router ID wins",
			rib(received("192.0.2.13", pfx, 10100, 4, false), received("192.0.2.12", pfx, 10100, 4, false)),
			map[string]map[string]string{"blue": {pfx: "192.0.2.12"}}, map[string][]string{}},
		{"each VPC is its VNI's",
			rib(received("192.0.2.12", pfx, 10100, 0, false), received("192.0.2.13", pfx, 10200, 0, false)),
			map[string]map[string]string{"blue": {pfx: "192.0.2.12"}, "red": {pfx: "192.0.2.13"}}, map[string][]string{}},
		{"another route target is ignored",
			rib(received("192.0.2.13", pfx, 10100, 0, false), otherRT),
			map[string]map[string]string{"blue": {pfx: "192.0.2.13"}}, map[string][]string{}},
		{"a VNI of no local VPC is ignored",
			rib(received("192.0.2.12", pfx, 10999, 0, false)),
			map[string]map[string]string{}, map[string][]string{}},
		{"a path without next hop or router MAC is ignored",
			rib(noHop, noMAC),
			map[string]map[string]string{}, map[string][]string{}},
		{"a drained path suppresses every lower generation of its prefix",
			rib(received("192.0.2.12", pfx, 10100, 9, true), received("192.0.2.13", pfx, 10100, 3, false)),
			map[string]map[string]string{}, map[string][]string{"blue": {pfx}}},
		{"a drained path suppresses its own generation from another node",
			rib(received("192.0.2.12", pfx, 10100, 9, true), received("192.0.2.13", pfx, 10100, 9, false)),
			map[string]map[string]string{}, map[string][]string{"blue": {pfx}}},
		{"a higher generation than the drained one is selected",
			rib(received("192.0.2.12", pfx, 10100, 8, true), received("192.0.2.13", pfx, 10100, 9, false),
				received("192.0.2.14", pfx, 10100, 7, false)),
			map[string]map[string]string{"blue": {pfx: "192.0.2.13"}}, map[string][]string{"blue": {pfx}}},
		{"a drain fences only its own VPC and prefix",
			rib(received("192.0.2.12", pfx, 10100, 9, true), received("192.0.2.13", pfx, 10200, 3, false),
				received("192.0.2.13", "10.20.0.6/32", 10100, 3, false)),
			map[string]map[string]string{"blue": {"10.20.0.6/32": "192.0.2.13"}, "red": {pfx: "192.0.2.13"}}, map[string][]string{"blue": {pfx}}},
		{"every route target of a path is read",
			rib(withTargets(received("192.0.2.12", pfx, 10999, 4, false), speaker.RouteTarget{ASN: 65001, Value: 10100},
				speaker.RouteTarget{ASN: 65000, Value: 10100}, speaker.RouteTarget{ASN: 65000, Value: 10200}, speaker.RouteTarget{ASN: 65000, Value: 10777})),
			map[string]map[string]string{"blue": {pfx: "192.0.2.12"}, "red": {pfx: "192.0.2.12"}}, map[string][]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sel, drained := Select(tc.rib, 65000, vnis, nil)
			if got := selectedFrom(sel); !maps.EqualFunc(got, tc.selected, maps.Equal) {
				t.Errorf("selected %v, want %v", got, tc.selected)
			}
			if got := drainedFrom(drained); !maps.EqualFunc(got, tc.drained, slices.Equal) {
				t.Errorf("drained %v, want %v", got, tc.drained)
			}
		})
	}
}

func TestARIBForgetsAWithdrawnPath(t *testing.T) {
	r := rib(received("192.0.2.12", "10.20.0.5/32", 10100, 0, false), received("192.0.2.12", "10.20.0.6/32", 10100, 0, false))
	gone := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	gone.Withdrawn = true
	r.Apply([]speaker.Received{gone})
	if _, ok := r[gone.Key()]; ok || len(r) != 1 {
		t.Fatalf("RIB %v", r)
	}
}

// holderStep is one pass of the holder: the selection of a RIB of paths
// (drained ones included) at a time.
type holderStep struct {
	at       time.Duration
	selected []speaker.Received
	frozen   bool
	// want is the installed prefixes with the node they go via.
	want map[string]string
	next time.Duration // -1: no hold running
}

func runHolder(t *testing.T, h *Holder, managed map[string]bool, steps []holderStep) {
	t.Helper()
	prev := new(Fences)
	for i, s := range steps {
		sel, fences := Select(rib(s.selected...), 65000, vnis, *prev)
		*prev = fences
		out, next := h.Desired(epoch.Add(s.at), sel, fences, managed, s.frozen)
		got := map[string]string{}
		for vpc, rs := range out {
			for _, r := range rs {
				if vpc != "blue" {
					t.Errorf("step %d: a route of %s", i, vpc)
				}
				got[r.Prefix.String()] = r.NextHop.String()
			}
		}
		if !maps.Equal(got, s.want) {
			t.Errorf("step %d at %v: installed %v, want %v", i, s.at, got, s.want)
		}
		wantNext := time.Time{}
		if s.next >= 0 {
			wantNext = epoch.Add(s.next)
		}
		if !next.Equal(wantNext) {
			t.Errorf("step %d at %v: next %v, want %v", i, s.at, next, wantNext)
		}
	}
}

func TestTheHolderKeepsAWithdrawnRouteForTheHoldOnly(t *testing.T) {
	const s = time.Second
	a := received("192.0.2.12", "10.20.0.5/32", 10100, 1, false)
	b := received("192.0.2.13", "10.20.0.5/32", 10100, 2, false)
	aDrained := received("192.0.2.12", "10.20.0.5/32", 10100, 1, true)
	via12 := map[string]string{"10.20.0.5/32": "192.0.2.12"}
	via13 := map[string]string{"10.20.0.5/32": "192.0.2.13"}
	none := map[string]string{}
	blue := map[string]bool{"blue": true}
	cases := []struct {
		name  string
		steps []holderStep
	}{
		{"a withdrawn route without replacement stays for the hold, then goes", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, want: via12, next: 11 * s},
			{at: 10 * s, want: via12, next: 11 * s},
			{at: 11 * s, want: none, next: -1},
			{at: 12 * s, want: none, next: -1},
		}},
		{"a replacement takes over at once", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, selected: []speaker.Received{b}, want: via13, next: -1},
		}},
		{"a replacement during the hold takes over at once", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, want: via12, next: 11 * s},
			{at: 2 * s, selected: []speaker.Received{b}, want: via13, next: -1},
		}},
		{"a re-announcement within the hold changes nothing and ends the hold", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, want: via12, next: 11 * s},
			{at: 5 * s, selected: []speaker.Received{a}, want: via12, next: -1},
			// A later withdrawal gets a hold of its own.
			{at: 8 * s, want: via12, next: 18 * s},
			{at: 17 * s, want: via12, next: 18 * s},
			{at: 18 * s, want: none, next: -1},
		}},
		{"a drained prefix goes at once", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, selected: []speaker.Received{aDrained}, want: none, next: -1},
		}},
		{"a drained prefix goes at once during the hold", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, want: via12, next: 11 * s},
			{at: 2 * s, selected: []speaker.Received{aDrained}, want: none, next: -1},
		}},
		{"frozen keeps a withdrawn route without starting the clock", []holderStep{
			{at: 0, selected: []speaker.Received{a}, want: via12, next: -1},
			{at: 1 * s, frozen: true, want: via12, next: -1},
			{at: 60 * s, frozen: true, want: via12, next: -1},
			{at: 100 * s, want: via12, next: 110 * s},
			{at: 110 * s, want: none, next: -1},
		}},
		{"frozen still takes a replacement", []holderStep{
			{at: 0, selected: []speaker.Received{a}, frozen: true, want: via12, next: -1},
			{at: 1 * s, selected: []speaker.Received{b}, frozen: true, want: via13, next: -1},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runHolder(t, &Holder{Hold: 10 * s}, blue, tc.steps)
		})
	}
}

func TestTheHoldEndsAtTheEarliestHeldRoutesEnd(t *testing.T) {
	const s = time.Second
	a := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	b := received("192.0.2.12", "10.20.0.6/32", 10100, 0, false)
	runHolder(t, &Holder{Hold: 10 * s}, map[string]bool{"blue": true}, []holderStep{
		{at: 0, selected: []speaker.Received{a, b}, want: map[string]string{"10.20.0.5/32": "192.0.2.12", "10.20.0.6/32": "192.0.2.12"}, next: -1},
		{at: 2 * s, selected: []speaker.Received{b}, want: map[string]string{"10.20.0.5/32": "192.0.2.12", "10.20.0.6/32": "192.0.2.12"}, next: 12 * s},
		{at: 5 * s, want: map[string]string{"10.20.0.5/32": "192.0.2.12", "10.20.0.6/32": "192.0.2.12"}, next: 12 * s},
		{at: 12 * s, want: map[string]string{"10.20.0.6/32": "192.0.2.12"}, next: 15 * s},
		{at: 15 * s, want: map[string]string{}, next: -1},
	})
}

func TestSeededKernelRoutesAreHeldLikeWithdrawnOnes(t *testing.T) {
	const s = time.Second
	h := &Holder{Hold: 10 * s}
	h.Seed("blue", []dataplane.Remote{
		{Prefix: netip.MustParsePrefix("10.20.0.5/32"), NextHop: netip.MustParseAddr("192.0.2.12"), RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, 12}},
		{Prefix: netip.MustParsePrefix("10.20.0.6/32"), NextHop: netip.MustParseAddr("192.0.2.12"), RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, 12}},
	})
	moved := received("192.0.2.13", "10.20.0.6/32", 10100, 0, false)
	runHolder(t, h, map[string]bool{"blue": true}, []holderStep{
		// Before End-of-RIB nothing is judged.
		{at: 0, frozen: true, want: map[string]string{"10.20.0.5/32": "192.0.2.12", "10.20.0.6/32": "192.0.2.12"}, next: -1},
		{at: 3 * s, selected: []speaker.Received{moved}, want: map[string]string{"10.20.0.5/32": "192.0.2.12", "10.20.0.6/32": "192.0.2.13"}, next: 13 * s},
		{at: 13 * s, selected: []speaker.Received{moved}, want: map[string]string{"10.20.0.6/32": "192.0.2.13"}, next: -1},
	})
}

func TestTheRoutesOfAVPCThatIsNoLongerManagedGoAtOnce(t *testing.T) {
	const s = time.Second
	a := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	h := &Holder{Hold: 10 * s}
	runHolder(t, h, map[string]bool{"blue": true}, []holderStep{
		{at: 0, selected: []speaker.Received{a}, want: map[string]string{"10.20.0.5/32": "192.0.2.12"}, next: -1},
	})
	runHolder(t, h, map[string]bool{}, []holderStep{
		{at: 1 * s, selected: []speaker.Received{a}, want: map[string]string{}, next: -1},
		{at: 2 * s, frozen: true, want: map[string]string{}, next: -1},
	})
}

func TestAHoldOfZeroRemovesAWithdrawnRouteAtOnce(t *testing.T) {
	a := received("192.0.2.12", "10.20.0.5/32", 10100, 0, false)
	runHolder(t, &Holder{}, map[string]bool{"blue": true}, []holderStep{
		{at: 0, selected: []speaker.Received{a}, want: map[string]string{"10.20.0.5/32": "192.0.2.12"}, next: -1},
		{at: time.Second, want: map[string]string{}, next: -1},
	})
}

func TestFencingDecidesInEveryStateOfThePaths(t *testing.T) {
	const s = time.Second
	const pfx = "10.20.0.5/32"
	// A is the predecessor whose deletion never worked, B the current
	// holder, C a later holder.
	a7 := received("192.0.2.12", pfx, 10100, 7, false)
	b8 := received("192.0.2.13", pfx, 10100, 8, false)
	b8Drained := received("192.0.2.13", pfx, 10100, 8, true)
	c9 := received("192.0.2.14", pfx, 10100, 9, false)
	viaA := map[string]string{pfx: "192.0.2.12"}
	viaB := map[string]string{pfx: "192.0.2.13"}
	viaC := map[string]string{pfx: "192.0.2.14"}
	none := map[string]string{}
	cases := []struct {
		name  string
		steps []holderStep
	}{
		{"a held higher generation is not replaced by a lower one during its hold", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			// B's router restarts: its path is withdrawn, A's is still there.
			{at: 1 * s, selected: []speaker.Received{a7}, want: viaB, next: 11 * s},
			{at: 5 * s, selected: []speaker.Received{a7}, want: viaB, next: 11 * s},
			// B is back within the hold: nothing changed.
			{at: 6 * s, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
		}},
		{"after the hold the lower generation takes over", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7}, want: viaB, next: 11 * s},
			{at: 11 * s, selected: []speaker.Received{a7}, want: viaA, next: -1},
		}},
		{"a higher generation replaces a held one at once", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7}, want: viaB, next: 11 * s},
			{at: 2 * s, selected: []speaker.Received{a7, c9}, want: viaC, next: -1},
		}},
		{"the holder's drain removes the prefix and never installs the predecessor", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7, b8Drained}, want: none, next: -1},
			{at: 30 * s, selected: []speaker.Received{a7, b8Drained}, want: none, next: -1},
		}},
		{"a drain during the hold of its own withdrawal removes at once", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7}, want: viaB, next: 11 * s},
			{at: 2 * s, selected: []speaker.Received{a7, b8Drained}, want: none, next: -1},
		}},
		{"the drain is remembered after the drained path is withdrawn", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7, b8Drained}, want: none, next: -1},
			{at: 2 * s, selected: []speaker.Received{a7}, want: none, next: -1},
			{at: 60 * s, selected: []speaker.Received{a7}, want: none, next: -1},
		}},
		{"a drained holder that is available again is installed", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7, b8Drained}, want: none, next: -1},
			{at: 2 * s, selected: []speaker.Received{a7, b8}, want: viaB, next: -1},
		}},
		{"a prefix without any path forgets its drain, so a reused address is routed", []holderStep{
			{at: 0, selected: []speaker.Received{b8Drained}, want: none, next: -1},
			{at: 1 * s, want: none, next: -1},
			{at: 2 * s, selected: []speaker.Received{a7}, want: viaA, next: -1},
		}},
		{"a later holder is installed over a drained one", []holderStep{
			{at: 0, selected: []speaker.Received{b8}, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{b8Drained, a7, c9}, want: viaC, next: -1},
		}},
		{"frozen keeps a higher generation over a lower one without a clock", []holderStep{
			{at: 0, selected: []speaker.Received{a7, b8}, frozen: true, want: viaB, next: -1},
			{at: 1 * s, selected: []speaker.Received{a7}, frozen: true, want: viaB, next: -1},
			{at: 40 * s, selected: []speaker.Received{a7}, want: viaB, next: 50 * s},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runHolder(t, &Holder{Hold: 10 * s}, map[string]bool{"blue": true}, tc.steps)
		})
	}
}
