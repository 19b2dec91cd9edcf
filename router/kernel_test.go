package router

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/netnstest"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/dataplane"
)

// kernelNode is a node's kernel in a test namespace: an underlay address
// and n VPCs with table domains, each with perVPC remote routes.
type kernelNode struct {
	ks      *kernelStage
	vnis    map[string]uint32
	remotes map[string][]dataplane.Remote
}

var benchUnderlay = netip.MustParseAddr("198.51.100.1")

// underlayUp brings up the test namespace's loopback and an underlay
// device with benchUnderlay.
func underlayUp(tb testing.TB) {
	tb.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		tb.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		tb.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0", MTU: 1500}, PeerName: "ul1"}
	if err := netlink.LinkAdd(veth); err != nil {
		tb.Fatal(err)
	}
	ul, err := netlink.LinkByName("ul0")
	if err != nil {
		tb.Fatal(err)
	}
	if err := netlink.AddrAdd(ul, &netlink.Addr{IPNet: routing.IPNet(netip.PrefixFrom(benchUnderlay, 24))}); err != nil {
		tb.Fatal(err)
	}
	if err := netlink.LinkSetUp(ul); err != nil {
		tb.Fatal(err)
	}
}

func newKernelNode(tb testing.TB, n, perVPC int) *kernelNode {
	tb.Helper()
	underlayUp(tb)
	ks := &kernelStage{
		plane:      dataplane.Plane{Underlay: benchUnderlay, Node: "bench"},
		stateDir:   tb.TempDir(),
		log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		clock:      clock.RealClock{},
		metrics:    NewMetrics(clock.RealClock{}),
		marks:      &kernelMarks{},
		kick:       func() {},
		synced:     map[string]synced{},
		deviceErrs: map[string]error{},
	}
	kn := &kernelNode{ks: ks, vnis: map[string]uint32{}, remotes: map[string][]dataplane.Remote{}}
	for i := range n {
		vpc := fmt.Sprintf("v%d", i)
		if _, _, err := routing.Ensure(vpc, routing.KindTable); err != nil {
			tb.Fatal(err)
		}
		kn.vnis[vpc] = uint32(20000 + i)
		rs := make([]dataplane.Remote, perVPC)
		for j := range rs {
			vtep := netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + j%20)})
			rs[j] = dataplane.Remote{
				Prefix:    netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), byte(j)}), 32),
				NextHop:   vtep,
				RouterMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, byte(1 + j%20)},
			}
		}
		kn.remotes[vpc] = rs
	}
	return kn
}

// pass runs the kernel part of a pass, as Daemon.pass does around the
// selection.
func (kn *kernelNode) pass(full bool) passCost {
	kp, devices := kn.ks.devicesStage(kn.vnis, full)
	kp.routesStage(devices, remoteMap(kn.remotes))
	kp.apply(devices, remoteMap(kn.remotes))
	return kp.cost
}

// move changes the next hop of one remote route of one VPC.
func (kn *kernelNode) move(i int) {
	rs := kn.remotes["v0"]
	vtep := netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + (i+1)%20)})
	rs[0].NextHop, rs[0].RouterMAC = vtep, net.HardwareAddr{0x02, 0, 0, 0, 0, byte(1 + (i+1)%20)}
}

func TestAPassReadsAndWritesOnlyWhatChanged(t *testing.T) {
	netnstest.Run(t, func() {
		kn := newKernelNode(t, 3, 40)
		first := kn.pass(true)
		if first.writes == 0 || first.read == 0 {
			t.Fatalf("the first pass read %d objects and wrote %d times; want both", first.read, first.writes)
		}
		if c := kn.pass(false); c.read != 0 || c.writes != 0 || c.vpcs != 0 {
			t.Fatalf("a steady pass: %+v; want nothing read, written or synced", c)
		}
		if c := kn.pass(true); c.read == 0 || c.writes != 1 {
			// The packet filter is synced on every full pass.
			t.Fatalf("a full pass at steady state: %+v; want a read and only the packet filter's sync", c)
		}
		kn.move(0)
		c := kn.pass(false)
		if c.vpcs != 1 || c.writes != 1 || c.locked <= 0 {
			t.Fatalf("one moved route: %+v; want one VPC synced with one write under the lock", c)
		}
		if c := kn.pass(false); c.read != 0 || c.writes != 0 {
			t.Fatalf("the pass after the move: %+v; want nothing", c)
		}
		// A route of galactic-cni's that came in a table marks only that
		// VPC for the next pass.
		dom, err := routing.Find("v1")
		if err != nil || dom == nil {
			t.Fatal(dom, err)
		}
		kn.ks.marks.table(dom.Table)
		if c := kn.pass(false); c.vpcs != 1 || c.writes != 0 {
			t.Fatalf("a marked table: %+v; want its VPC read, nothing written", c)
		}
		// A change of one VPC's device or domain reads that VPC again; a
		// VXLAN device of no VPC here, every VPC.
		kn.ks.marks.link(routing.VXLANDeviceName("v1"))
		if c := kn.pass(false); c.vpcs != 1 || c.writes != 0 {
			t.Fatalf("v1's device changed: %+v; want v1 read, nothing written", c)
		}
		kn.ks.marks.marker(routing.Marker("v2"))
		if c := kn.pass(false); c.vpcs != 1 || c.writes != 0 {
			t.Fatalf("v2's domain changed: %+v; want v2 read, nothing written", c)
		}
		kn.ks.marks.link(routing.VXLANDeviceName("gone"))
		if c := kn.pass(false); c.vpcs != 3 || c.writes != 0 {
			t.Fatalf("a device of no VPC here changed: %+v; want every VPC read, nothing written", c)
		}
		full := kn.pass(true)
		// A VPC that comes reads the devices and the markers, and only its
		// own table of routes.
		if _, _, err := routing.Ensure("v3", routing.KindTable); err != nil {
			t.Fatal(err)
		}
		kn.vnis["v3"] = 20003
		kn.remotes["v3"] = []dataplane.Remote{{Prefix: netip.MustParsePrefix("10.9.0.1/32"), NextHop: netip.MustParseAddr("192.0.2.1"),
			RouterMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}}}
		c = kn.pass(false)
		if c.vpcs != 1 || c.writes == 0 || c.read >= full.read {
			t.Fatalf("a new VPC: %+v (a full pass read %d); want it alone synced and written, fewer objects read", c, full.read)
		}
		dom3, err := routing.Find("v3")
		if err != nil || dom3 == nil {
			t.Fatal(dom3, err)
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: dom3.Table}, netlink.RT_FILTER_TABLE)
		if err != nil || !slices.ContainsFunc(rs, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == "10.9.0.1/32" }) {
			t.Fatalf("v3's table: %v %v", rs, err)
		}
	})
}

// BenchmarkKernelPass measures the kernel part of a pass at 1, 100 and
// 1,000 VPCs of 100 remote routes: steady (nothing changed), one route
// moved, and a full resync.
func BenchmarkKernelPass(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		for _, kind := range []string{"steady", "move", "full"} {
			b.Run(fmt.Sprintf("vpcs=%d/%s", n, kind), func(b *testing.B) {
				netnstest.Run(b, func() {
					kn := newKernelNode(b, n, 100)
					kn.pass(true)
					var read, writes, locked float64
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if kind == "move" {
							kn.move(i)
						}
						c := kn.pass(kind == "full")
						read += float64(c.read)
						writes += float64(c.writes)
						locked += float64(c.locked.Nanoseconds())
					}
					b.ReportMetric(read/float64(b.N), "objects-read/op")
					b.ReportMetric(writes/float64(b.N), "writes/op")
					b.ReportMetric(locked/float64(b.N), "lock-ns/op")
				})
			})
		}
	}
}
