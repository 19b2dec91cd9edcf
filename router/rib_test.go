package router

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// TestTheIncrementalSelectionEqualsTheComputationFromScratch runs random
// event sequences (announce, withdraw, drain, session down and up,
// End-of-RIB, the bounds' expiry, VNI and device changes, resyncs) through
// the Adj's changes, the Importer and Holder.Update, and after every event
// compares with Adj.RIB, Select and Holder.Desired from scratch.
func TestTheIncrementalSelectionEqualsTheComputationFromScratch(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 100
	}
	for seed := range seeds {
		if !runRandomSelection(t, uint64(seed), 80) {
			return
		}
	}
}

func runRandomSelection(t *testing.T, seed uint64, steps int) bool {
	rng := rand.New(rand.NewPCG(seed, 23))
	const s = time.Second
	peers := []string{"192.0.2.250", "192.0.2.251", "192.0.2.252"}
	nodes := []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("192.0.2.13")}
	me := nodes[0]
	prefixes := []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32"), netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd20::5/128")}
	vniSets := []map[string]uint32{
		{"blue": 10100, "red": 10200},
		{"blue": 10100},
		{"blue": 10100, "red": 10300},
		{"red": 10100, "green": 10200},
	}
	stale := []time.Duration{0, 20 * s}[rng.IntN(2)]
	a := &Adj{Stale: stale, Sync: 10 * s}
	im := &Importer{RTASN: 65000, RouterID: me, Underlay: netip.MustParseAddr("198.51.100.1"), Adj: a}
	inc, ref := &Holder{Hold: 5 * s}, &Holder{Hold: 5 * s}
	var prev Fences
	vnis := vniSets[0]
	managed := map[string]bool{"blue": true, "red": true, "green": true}
	frozen := rng.IntN(2) == 0
	now := epochAdj
	for _, h := range []*Holder{inc, ref} {
		h.Seed("blue", []dataplane.Remote{{Prefix: prefixes[0], NextHop: nodes[2], RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, 13}}})
	}
	path := func() speaker.Received {
		n := nodes[rng.IntN(len(nodes))]
		r := speaker.Received{Route: speaker.Route{
			RD: speaker.RD{Admin: n, Assigned: uint16(1 + rng.IntN(2))}, Prefix: prefixes[rng.IntN(len(prefixes))],
			VNI: 10100, RTASN: 65000, NextHop: n, RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, n.As4()[3]},
			Generation: uint32(rng.IntN(4)), Drained: rng.IntN(4) == 0,
		}}
		switch rng.IntN(8) {
		case 0:
			r.RouterMAC = nil
		case 1:
			r.NextHop = nodes[rng.IntN(len(nodes))]
		}
		switch rng.IntN(4) {
		case 0:
			r.VNI = []uint32{10100, 10200, 10300}[rng.IntN(3)]
		default:
			for _, v := range []uint32{10100, 10200, 10300} {
				if rng.IntN(2) == 0 {
					r.Targets = append(r.Targets, speaker.RouteTarget{ASN: 65000, Value: v})
				}
			}
			if rng.IntN(6) == 0 {
				r.Targets = append(r.Targets, speaker.RouteTarget{ASN: 65001, Value: 10100})
			}
		}
		return r
	}
	var sent []speaker.Received
	// kernel is what the last step installed.
	kernel := map[string][]dataplane.Remote{}
	for _, vpc := range []string{"blue"} {
		kernel[vpc] = inc.Routes(vpc)
	}
	inc.Synced()
	for step := range steps {
		what := ""
		full := false
		switch k := rng.IntN(20); {
		case k < 7:
			r := path()
			sent = append(sent, r)
			p := peers[rng.IntN(len(peers))]
			what = "announce " + r.Key().String() + " via " + p
			a.Apply(now, paths(p, r))
		case k < 10 && len(sent) > 0:
			r := sent[rng.IntN(len(sent))]
			p := peers[rng.IntN(len(peers))]
			what = "withdraw " + r.Key().String() + " via " + p
			a.Apply(now, paths(p, withdrawn(r)))
		case k < 11:
			p := peers[rng.IntN(len(peers))]
			what = "down " + p
			a.Apply(now, down(p, "IDLE"))
		case k < 12:
			p := peers[rng.IntN(len(peers))]
			what = "up " + p
			a.Apply(now, up(p))
		case k < 13:
			p := peers[rng.IntN(len(peers))]
			what = "End-of-RIB " + p
			a.Apply(now, eor(p))
		case k < 15:
			d := time.Duration(rng.IntN(12)) * s
			what = fmt.Sprintf("time +%v", d)
			now = now.Add(d)
		case k < 16:
			vnis = vniSets[rng.IntN(len(vniSets))]
			what = fmt.Sprintf("VNIs %v", vnis)
		case k < 17:
			vpc := []string{"blue", "red", "green"}[rng.IntN(3)]
			managed[vpc] = !managed[vpc]
			what = fmt.Sprintf("managed %v", managed)
		case k < 18:
			frozen = false
			what = "synced"
		default:
			full = true
			what = "resync"
		}
		a.Expire(now)
		im.Apply(a.TakeChanges())
		im.SetVNIs(vnis)
		if full {
			im.Resync()
		}
		changes := im.Select()
		next := inc.Update(now, im, im.Fences(), managed, frozen, changes)

		rib := a.RIB()
		sel, fences := Select(rib, 65000, vnis, prev)
		prev = fences
		out, refNext := ref.Desired(now, sel, fences, managed, frozen)

		fail := func(format string, args ...any) bool {
			t.Errorf("seed %d step %d (%s): "+format, append([]any{seed, step, what}, args...)...)
			return false
		}
		if im.Len() != len(rib) {
			return fail("RIB view of %d paths, from scratch %d", im.Len(), len(rib))
		}
		if got, want := im.index, indexOf(rib, 65000); !sameIndex(got, want) {
			return fail("index %v, from scratch %v", got, want)
		}
		if !reflect.DeepEqual(im.Selected(), sel) {
			return fail("selected %v, from scratch %v", selectedFrom(im.Selected()), selectedFrom(sel))
		}
		if !reflect.DeepEqual(im.Fences(), fences) {
			return fail("fences %v, from scratch %v", im.Fences(), fences)
		}
		if !next.Equal(refNext) {
			return fail("next %v, from scratch %v", next, refNext)
		}
		for _, vpc := range []string{"blue", "red", "green"} {
			if inc.Sum(vpc) != sumOf(inc.Routes(vpc)) {
				return fail("%s: the hold's sum is not the sum of its routes", vpc)
			}
			got, want := remoteSet(inc.Routes(vpc)), remoteSet(out[vpc])
			if !reflect.DeepEqual(got, want) {
				return fail("%s installs %v, from scratch %v", vpc, got, want)
			}
			if !reflect.DeepEqual(got, remoteSet(kernel[vpc])) && !inc.Changed(vpc) {
				return fail("%s changed without being marked", vpc)
			}
		}
		if got, want := inc.VTEPs(), vtepsOf(out); !slices.Equal(got, want) {
			return fail("VTEPs %v, from scratch %v", got, want)
		}
		if got, want := im.Duplicates(), Duplicates(rib, me, im.Underlay); !slices.Equal(got, want) {
			return fail("duplicates %v, from scratch %v", got, want)
		}
		kernel = out
		inc.Synced()
	}
	return true
}

// indexOf is the Importer's index of rib, computed from scratch.
func indexOf(rib RIB, rtASN uint16) map[uint32]map[netip.Prefix][]pathKey {
	out := map[uint32]map[netip.Prefix][]pathKey{}
	for k, r := range rib {
		for _, vni := range r.TargetVNIs(rtASN) {
			if out[vni] == nil {
				out[vni] = map[netip.Prefix][]pathKey{}
			}
			if !slices.Contains(out[vni][k.Prefix], packKey(k)) {
				out[vni][k.Prefix] = append(out[vni][k.Prefix], packKey(k))
			}
		}
	}
	return out
}

// sameIndex compares two indexes, each key list as a set.
func sameIndex(a, b map[uint32]map[netip.Prefix][]pathKey) bool {
	if len(a) != len(b) {
		return false
	}
	for vni, ps := range a {
		if len(ps) != len(b[vni]) {
			return false
		}
		for p, ks := range ps {
			other := b[vni][p]
			if len(ks) != len(other) {
				return false
			}
			for _, k := range ks {
				if !slices.Contains(other, k) {
					return false
				}
			}
		}
	}
	return true
}

func remoteSet(rs []dataplane.Remote) map[netip.Prefix]string {
	out := map[netip.Prefix]string{}
	for _, r := range rs {
		out[r.Prefix] = r.NextHop.String() + " " + r.RouterMAC.String()
	}
	return out
}
