package router

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/speaker"
)

// benchRIB is a node in every one of n VPCs of perVPC remote routes each,
// announced by 200 nodes and received from two reflectors.
type benchRIB struct {
	vnis    map[string]uint32
	managed map[string]bool
	peers   [2]string
	routes  []speaker.Received
}

func newBenchRIB(n, perVPC int) *benchRIB {
	b := &benchRIB{vnis: map[string]uint32{}, managed: map[string]bool{}, peers: [2]string{"192.0.2.250", "192.0.2.251"}}
	for i := range n {
		vpc := fmt.Sprintf("v%d", i)
		vni := uint32(20000 + i)
		b.vnis[vpc], b.managed[vpc] = vni, true
		for j := range perVPC {
			node := (i*perVPC + j) % 200
			a := netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + node)})
			b.routes = append(b.routes, speaker.Received{Route: speaker.Route{
				RD:     speaker.RD{Admin: a, Assigned: uint16(1 + i)},
				Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), byte(j)}), 32),
				VNI:    vni, RTASN: 65000, NextHop: a,
				RouterMAC:  net.HardwareAddr{0x02, 0, 192, 0, 2, byte(1 + node)},
				Generation: 1,
			}, Targets: []speaker.RouteTarget{{ASN: 65000, Value: vni}}})
		}
	}
	return b
}

// load feeds every route from both peers, in batches as GoBGP's watch
// delivers them, and ends each peer's sync.
func (b *benchRIB) load(now time.Time, apply func(speaker.Event)) {
	for _, p := range b.peers {
		apply(up(p))
		for i := 0; i < len(b.routes); i += 500 {
			batch := make([]speaker.Received, 0, 500)
			for _, r := range b.routes[i:min(i+500, len(b.routes))] {
				r.RouterMAC = append(net.HardwareAddr(nil), r.RouterMAC...)
				r.Targets = append([]speaker.RouteTarget(nil), r.Targets...)
				batch = append(batch, r)
			}
			apply(paths(p, batch...))
		}
		apply(eor(p))
	}
}

// moved is route i moved to another node's VTEP, from both peers.
func (b *benchRIB) moved(i int) []speaker.Event {
	r := b.routes[(i*7919)%len(b.routes)]
	a := netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i%200)})
	r.NextHop, r.RouterMAC = a, net.HardwareAddr{0x02, 0, 192, 0, 2, byte(1 + i%200)}
	return []speaker.Event{paths(b.peers[0], r), paths(b.peers[1], r)}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkInMemoryPass measures the in-memory side of a pass (the Adj's
// view, the duplicate check, selection, the hold and the comparison with
// what the kernel holds) at 1, 100 and 1,000 VPCs of 100 routes from two
// reflectors: steady (nothing changed), one route moved, a resync (the
// kernel side compares every VPC) and a recompute (the selection from
// scratch, as on the first pass).
// heap-B/route is the heap the loaded state keeps, after GC, per route.
func BenchmarkInMemoryPass(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		for _, kind := range []string{"steady", "move", "resync", "recompute"} {
			b.Run(fmt.Sprintf("vpcs=%d/%s", n, kind), func(b *testing.B) {
				br := newBenchRIB(n, 100)
				now := epochAdj
				before := heapInUse()
				st := newPassState(br)
				br.load(now, st.apply)
				st.pass(now, true, true)
				heap := heapInUse() - before
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if kind == "move" {
						for _, ev := range br.moved(i) {
							st.apply(ev)
						}
					}
					st.pass(now, kind == "resync", kind == "recompute")
				}
				b.StopTimer()
				b.ReportMetric(float64(heap)/float64(len(br.routes)), "heap-B/route")
				runtime.KeepAlive(st)
			})
		}
	}
}
