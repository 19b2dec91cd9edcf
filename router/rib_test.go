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

var (
	randomPeers    = []string{"192.0.2.250", "192.0.2.251", "192.0.2.252"}
	randomNodes    = []netip.Addr{netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("192.0.2.13")}
	randomPrefixes = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32"), netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd20::5/128")}
	randomVNISets  = []map[string]uint32{
		{"blue": 10100, "red": 10200},
		{"blue": 10100},
		{"blue": 10100, "red": 10300},
		{"red": 10100, "green": 10200},
	}
)

// randomRun is one random event sequence, kept both incrementally (im,
// inc) and from scratch (ref, prev).
type randomRun struct {
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	a       *Adj
	im      *Importer
	me      netip.Addr
	inc     *Holder
	ref     *Holder
	prev    Fences
	vnis    map[string]uint32
	managed map[string]bool
	frozen  bool
	now     time.Time
	sent    []speaker.Received
	// kernel is what the last step installed.
	kernel map[string][]dataplane.Remote
}

func runRandomSelection(t *testing.T, seed uint64, steps int) bool {
	rng := rand.New(rand.NewPCG(seed, 23))
	const s = time.Second
	stale := []time.Duration{0, 20 * s}[rng.IntN(2)]
	r := &randomRun{t: t, seed: seed, rng: rng, a: &Adj{Stale: stale, Sync: 10 * s}, me: randomNodes[0],
		inc: &Holder{Hold: 5 * s}, ref: &Holder{Hold: 5 * s}, vnis: randomVNISets[0],
		managed: map[string]bool{"blue": true, "red": true, "green": true}, now: epochAdj, kernel: map[string][]dataplane.Remote{}}
	r.im = &Importer{RTASN: 65000, RouterID: r.me, Underlay: netip.MustParseAddr("198.51.100.1"), Adj: r.a}
	r.frozen = rng.IntN(2) == 0
	for _, h := range []*Holder{r.inc, r.ref} {
		h.Seed("blue", []dataplane.Remote{{Prefix: randomPrefixes[0], NextHop: randomNodes[2], RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, 13}}})
	}
	for _, vpc := range []string{"blue"} {
		r.kernel[vpc] = r.inc.Routes(vpc)
	}
	r.inc.Synced()
	for step := range steps {
		what, full := r.event()
		if !r.compare(step, what, full) {
			return false
		}
	}
	return true
}

// path is a random path: any node's, of any prefix, generation and
// drain, sometimes without a router MAC or with another next hop, with
// a VNI or with route targets (some of another AS).
func (r *randomRun) path() speaker.Received {
	rng := r.rng
	n := randomNodes[rng.IntN(len(randomNodes))]
	p := speaker.Received{Route: speaker.Route{
		RD: speaker.RD{Admin: n, Assigned: uint16(1 + rng.IntN(2))}, Prefix: randomPrefixes[rng.IntN(len(randomPrefixes))],
		VNI: 10100, RTASN: 65000, NextHop: n, RouterMAC: net.HardwareAddr{2, 0, 0, 0, 0, n.As4()[3]},
		Generation: uint32(rng.IntN(4)), Drained: rng.IntN(4) == 0,
	}}
	switch rng.IntN(8) {
	case 0:
		p.RouterMAC = nil
	case 1:
		p.NextHop = randomNodes[rng.IntN(len(randomNodes))]
	}
	switch rng.IntN(4) {
	case 0:
		p.VNI = []uint32{10100, 10200, 10300}[rng.IntN(3)]
	default:
		for _, v := range []uint32{10100, 10200, 10300} {
			if rng.IntN(2) == 0 {
				p.Targets = append(p.Targets, speaker.RouteTarget{ASN: 65000, Value: v})
			}
		}
		if rng.IntN(6) == 0 {
			p.Targets = append(p.Targets, speaker.RouteTarget{ASN: 65001, Value: 10100})
		}
	}
	return p
}

// event makes one random event happen and says what it was and whether
// it is a resync.
func (r *randomRun) event() (what string, full bool) {
	rng, a := r.rng, r.a
	peer := func() string { return randomPeers[rng.IntN(len(randomPeers))] }
	switch k := rng.IntN(20); {
	case k < 7:
		x := r.path()
		r.sent = append(r.sent, x)
		p := peer()
		what = "announce " + x.Key().String() + " via " + p
		a.Apply(r.now, paths(p, x))
	case k < 10 && len(r.sent) > 0:
		x := r.sent[rng.IntN(len(r.sent))]
		p := peer()
		what = "withdraw " + x.Key().String() + " via " + p
		a.Apply(r.now, paths(p, withdrawn(x)))
	case k < 11:
		p := peer()
		what = "down " + p
		a.Apply(r.now, down(p, "IDLE"))
	case k < 12:
		p := peer()
		what = "up " + p
		a.Apply(r.now, up(p))
	case k < 13:
		p := peer()
		what = "End-of-RIB " + p
		a.Apply(r.now, eor(p))
	case k < 15:
		d := time.Duration(rng.IntN(12)) * time.Second
		what = fmt.Sprintf("time +%v", d)
		r.now = r.now.Add(d)
	case k < 16:
		r.vnis = randomVNISets[rng.IntN(len(randomVNISets))]
		what = fmt.Sprintf("VNIs %v", r.vnis)
	case k < 17:
		vpc := []string{"blue", "red", "green"}[rng.IntN(3)]
		r.managed[vpc] = !r.managed[vpc]
		what = fmt.Sprintf("managed %v", r.managed)
	case k < 18:
		r.frozen = false
		what = "synced"
	default:
		full = true
		what = "resync"
	}
	return what, full
}

// compare runs one pass both ways and compares them.
func (r *randomRun) compare(step int, what string, full bool) bool {
	a, im, inc, now := r.a, r.im, r.inc, r.now
	a.Expire(now)
	im.Apply(a.TakeChanges())
	im.SetVNIs(r.vnis)
	if full {
		im.Resync()
	}
	changes := im.Select()
	next := inc.Update(now, im, im.Fences(), r.managed, r.frozen, changes)

	rib := a.RIB()
	sel, fences := Select(rib, 65000, r.vnis, r.prev)
	r.prev = fences
	out, refNext := r.ref.Desired(now, sel, fences, r.managed, r.frozen)

	fail := func(format string, args ...any) bool {
		r.t.Errorf("seed %d step %d (%s): "+format, append([]any{r.seed, step, what}, args...)...)
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
		if !reflect.DeepEqual(got, remoteSet(r.kernel[vpc])) && !inc.Changed(vpc) {
			return fail("%s changed without being marked", vpc)
		}
	}
	if got, want := inc.VTEPs(), vtepsOf(out); !slices.Equal(got, want) {
		return fail("VTEPs %v, from scratch %v", got, want)
	}
	if got, want := im.Duplicates(), Duplicates(rib, r.me, im.Underlay); !slices.Equal(got, want) {
		return fail("duplicates %v, from scratch %v", got, want)
	}
	r.kernel = out
	inc.Synced()
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
