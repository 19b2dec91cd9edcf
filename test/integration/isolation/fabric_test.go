package isolation

import (
	"cmp"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/packet"
	"golang.org/x/sys/unix"
)

// world is two routed nodes on a fabric: blue and red workloads on node-a
// (veths, a tap whose guest the test plays, a NAT appliance), a blue
// workload on node-c.
type world struct {
	env                          *harness.Env
	f                            *harness.Fabric
	a, c                         *harness.Routed
	blue1, blue2, red1, tap, nat *workload
	remote                       *workload
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{env: harness.Setup(t)}
	w.f = harness.NewFabric(t)
	w.a = w.f.NewRouted(t, w.env, "node-a")
	w.c = w.f.NewRouted(t, w.env, "node-c")
	w.blue1 = add(t, w.env, w.a.Node, harness.Attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}})
	w.blue2 = add(t, w.env, w.a.Node, harness.Attachment{VPC: "blue", Name: "web-2", VNI: 10100, Addresses: []string{"10.20.0.6/24", "fd20::6/64"}})
	w.tap = add(t, w.env, w.a.Node, harness.Attachment{VPC: "blue", Name: "vm-1", VNI: 10100, Mode: names.ModeTap, Addresses: []string{"10.20.0.8/24", "fd20::8/64"}})
	w.nat = add(t, w.env, w.a.Node, harness.Attachment{VPC: "blue", Name: "nat-1", VNI: 10100, Addresses: []string{"10.20.0.9/24", "fd20::9/64"},
		Allowed: []string{"192.168.7.0/24", "fd99:7::/64"}})
	w.red1 = add(t, w.env, w.a.Node, harness.Attachment{VPC: "red", Name: "db-1", VNI: 10200, Addresses: []string{"10.30.0.5/24", "fd30::5/64"}})
	w.remote = add(t, w.env, w.c.Node, harness.Attachment{VPC: "blue", Name: "web-c", VNI: 10100, Addresses: []string{"10.20.0.7/24", "fd20::7/64"}})
	// VXLAN from a real peer keeps working: node-a and node-c reach each
	// other's workloads only through each other's VXLAN.
	for _, v6 := range []bool{false, true} {
		w.blue1.c.WaitPing(t, w.remote.Addr(v6))
		w.remote.c.WaitPing(t, w.blue1.Addr(v6))
	}
	return w
}

// workloads are every container of the world.
func (w *world) workloads() []*workload {
	return []*workload{w.blue1, w.blue2, w.red1, w.tap, w.nat, w.remote}
}

// everywhere captures markers at every possible receiver: each workload's
// container, both nodes and the fabric. Index i of the result is
// namespace i of nss.
func (w *world) everywhere(t *testing.T, markers ...[]byte) (*receivers, []*harness.Netns) {
	nss := []*harness.Netns{}
	for _, wl := range w.workloads() {
		nss = append(nss, wl.c)
	}
	nss = append(nss, w.a.Netns, w.c.Netns, w.f.Netns)
	return capture(t, markers, nss...), nss
}

const (
	sport = 40000
	dport = 40001
)

func TestIsolationOnTheFabric(t *testing.T) {
	w := newWorld(t)
	t.Run("SpoofedSourcesFromAVethAndATapReachNoReceiver", func(t *testing.T) { spoofing(t, w) })
	t.Run("OnlyTheDeclaredAllowedSourcePrefixesPass", func(t *testing.T) { optOut(t, w) })
	t.Run("VXLANFromAWorkloadOrANonVTEPDeliversNothing", func(t *testing.T) { vxlanInjection(t, w) })
	t.Run("APlainPacketFromTheFabricReachesNoWorkload", func(t *testing.T) { fromOutside(t, w) })
}

func spoofing(t *testing.T, w *world) {
	spoofed4 := []netip.Addr{
		w.blue2.Addr(false),  // a neighbour of the same VPC
		w.remote.Addr(false), // the same VPC on another node
		w.red1.Addr(false),   // another VPC
		w.a.Underlay,         // the node
		w.f.RR,               // a fabric host
		addr("198.51.100.7"), // the internet
	}
	spoofed6 := []netip.Addr{w.blue2.Addr(true), w.remote.Addr(true), w.red1.Addr(true), addr("2001:db8::11"), addr("2001:db8:ffff::7")}
	dst4 := []netip.Addr{w.blue2.Addr(false), w.remote.Addr(false), w.red1.Addr(false), addr("10.20.0.1"), w.f.RR, addr("198.51.100.8")}
	dst6 := []netip.Addr{w.blue2.Addr(true), w.remote.Addr(true), w.red1.Addr(true), addr("fd20::1"), addr("2001:db8:ffff::8")}

	for _, sender := range []*workload{w.blue1, w.tap} {
		t.Run(cmp.Or(sender.Mode, names.ModeVeth), func(t *testing.T) {
			spoof, own := packet.NewMarker(), packet.NewMarker()
			r, nss := w.everywhere(t, spoof, own)
			// The sender's own frames and the node's copy of them as they
			// arrive on its host interface are where they start, not where
			// they went.
			for i, n := range nss {
				if n == sender.c {
					r.exclude(i, ifName)
				}
				if n == w.a.Netns {
					r.exclude(i, sender.HostIf())
				}
			}
			var bad [][]byte
			for _, src := range spoofed4 {
				for _, dst := range dst4 {
					bad = append(bad, packet.UDP(src, dst, sport, dport, spoof))
				}
			}
			for _, src := range spoofed6 {
				for _, dst := range dst6 {
					bad = append(bad, packet.UDP(src, dst, sport, dport, spoof))
				}
			}
			// A guest playing DHCP server for its neighbours.
			bad = append(bad, packet.UDP(sender.Addr(false), w.blue2.Addr(false), 67, 68, spoof))
			sender.send(t, bad...)
			if sender.tap == nil {
				// The veth's own addresses with another MAC.
				other := net.HardwareAddr{0x02, 0xde, 0xad, 0, 0, 1}
				sender.sendFrom(t, other, packet.UDP(sender.Addr(false), w.blue2.Addr(false), sport, dport, spoof),
					packet.UDP(sender.Addr(true), w.blue2.Addr(true), sport, dport, spoof))
			}
			// The attachment's own traffic goes where it is sent, after
			// the spoofed packets on the same paths.
			var good [][]byte
			for _, v6 := range []bool{false, true} {
				for _, dst := range []*workload{w.blue2, w.remote} {
					good = append(good, packet.UDP(sender.Addr(v6), dst.Addr(v6), sport, dport, own))
				}
			}
			sender.send(t, good...)
			deadline := time.Now().Add(20 * time.Second)
			for i, n := range nss {
				if n == w.blue2.c || n == w.remote.c {
					if err := r.caps[i].WaitFrames(1, deadline); err != nil {
						t.Fatalf("the attachment's own packets should reach %s: %v", n.Name, err)
					}
				}
			}
			r.none(t, 0, "packets with spoofed sources, a spoofed MAC or DHCP server replies from "+sender.HostIf())
		})
	}
}

func optOut(t *testing.T, w *world) {
	allowed, other := packet.NewMarker(), packet.NewMarker()
	r, nss := w.everywhere(t, allowed, other)
	for i, n := range nss {
		if n == w.nat.c {
			r.exclude(i, ifName)
		}
		if n == w.a.Netns {
			r.exclude(i, w.nat.HostIf())
		}
	}
	w.nat.send(t,
		packet.UDP(addr("192.168.8.9"), w.blue2.Addr(false), sport, dport, other),
		packet.UDP(addr("fd99:8::9"), w.blue2.Addr(true), sport, dport, other),
		packet.UDP(w.blue1.Addr(false), w.blue2.Addr(false), sport, dport, other),
		packet.UDP(addr("192.168.7.9"), w.blue2.Addr(false), sport, dport, allowed),
		packet.UDP(addr("fd99:7::9"), w.blue2.Addr(true), sport, dport, allowed),
		packet.UDP(addr("192.168.7.10"), w.remote.Addr(false), sport, dport, allowed),
	)
	for i, n := range nss {
		if n == w.blue2.c || n == w.remote.c {
			if err := r.caps[i].WaitFrames(0, time.Now().Add(20*time.Second)); err != nil {
				t.Fatalf("a source in allowedSourcePrefixes should reach %s: %v", n.Name, err)
			}
		}
	}
	if n := r.caps[1].Received(0, ifName); n != 2 {
		t.Errorf("blue-2 should receive both packets from allowed sources, got %d", n)
	}
	r.none(t, 1, "sources outside the NAT appliance's addresses and allowedSourcePrefixes")
}

// vxlanFrames are VXLAN payloads for red's and blue's VNIs whose inner
// packets go to red-1 and blue-2 on node-a, each carrying marker.
func vxlanFrames(t *testing.T, w *world, marker []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for _, vpc := range []struct {
		name     string
		vni      uint32
		src, dst netip.Addr
	}{{"red", 10200, addr("10.30.0.77"), w.red1.Addr(false)}, {"red", 10200, addr("fd30::77"), w.red1.Addr(true)},
		{"blue", 10100, addr("10.20.0.77"), w.blue2.Addr(false)}, {"blue", 10100, addr("fd20::77"), w.blue2.Addr(true)}} {
		// The router MAC of node-a's VXLAN device, which a fabric host can
		// compute from the node and VPC names.
		mac, err := w.a.LinkMAC(routing.VXLANDeviceName(vpc.name))
		if err != nil {
			t.Fatal(err)
		}
		inner := packet.Ethernet(mac, net.HardwareAddr{0x02, 0xbe, 0xef, 0, 0, 1}, packet.EtherTypeOf(vpc.src),
			packet.UDP(vpc.src, vpc.dst, sport, dport, marker))
		out = append(out, packet.VXLAN(vpc.vni, inner))
	}
	return out
}

// sendUDP sends payloads from a socket in ns bound to laddr, and again
// with UDP checksums off (SO_NO_CHECK), as galactic's VXLAN devices send
// over IPv4: the receiving node's decapsulation fast path takes only
// those, the kernel's path the others.
func sendUDP(t *testing.T, ns *harness.Netns, laddr, raddr netip.AddrPort, payloads ...[]byte) {
	t.Helper()
	err := ns.Do(func() error {
		for _, noCheck := range []bool{false, true} {
			c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(laddr), net.UDPAddrFromAddrPort(raddr))
			if err != nil {
				return err
			}
			defer c.Close()
			if noCheck {
				raw, err := c.SyscallConn()
				if err != nil {
					return err
				}
				var serr error
				if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) }); err != nil {
					return err
				}
				if serr != nil {
					return serr
				}
			}
			for _, p := range payloads {
				if _, err := c.Write(p); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func vxlanInjection(t *testing.T, w *world) {
	injected, fromPeer := packet.NewMarker(), packet.NewMarker()
	r, nss := w.everywhere(t, injected, fromPeer)
	for i, n := range nss {
		switch n {
		case w.blue1.c, w.tap.c:
			r.exclude(i, ifName)
		case w.a.Netns:
			// Where the injections arrive: the senders' host interfaces and
			// the underlay.
			r.exclude(i, w.blue1.HostIf(), w.tap.HostIf(), "ul0")
		case w.f.Netns:
			r.skip(i)
		}
	}
	// From workloads, to every address of node-a a VXLAN socket answers:
	// the gateway, broadcast, the underlay. The outer source is the
	// workload's own, so the source check passes it.
	for _, sender := range []*workload{w.blue1, w.tap} {
		var pkts [][]byte
		for _, dst := range []netip.Addr{addr("10.20.0.1"), addr("255.255.255.255"), addr("10.20.0.255"), w.a.Underlay} {
			for _, v := range vxlanFrames(t, w, injected) {
				pkts = append(pkts, packet.UDP(sender.Addr(false), dst, 43000, 4789, v))
			}
		}
		for _, v := range vxlanFrames(t, w, injected) {
			pkts = append(pkts, packet.UDP(sender.Addr(true), addr("fd20::1"), 43000, 4789, v))
		}
		sender.send(t, pkts...)
	}
	// From a fabric host that is not a VTEP (the route reflector's address).
	sendUDP(t, w.f.Netns, netip.AddrPortFrom(w.f.RR, 0), netip.AddrPortFrom(w.a.Underlay, 4789), vxlanFrames(t, w, injected)...)
	// The same frames from node-c, a VTEP node-a installed routes through,
	// are decapsulated: VXLAN from a real peer works, and the frames were
	// valid (a VTEP is trusted with every VNI: see docs/concepts/security.md).
	sendUDP(t, w.c.Netns, netip.AddrPortFrom(w.c.Underlay, 0), netip.AddrPortFrom(w.a.Underlay, 4789), vxlanFrames(t, w, fromPeer)...)
	for i, n := range nss {
		if n == w.red1.c || n == w.blue2.c {
			if err := r.caps[i].WaitFrames(1, time.Now().Add(20*time.Second)); err != nil {
				t.Fatalf("VXLAN from node-c should reach %s: %v", n.Name, err)
			}
		}
	}
	r.none(t, 0, "VXLAN sent by workloads and by a fabric host that is no VTEP")
}

func fromOutside(t *testing.T, w *world) {
	plain, control := packet.NewMarker(), packet.NewMarker()
	r, nss := w.everywhere(t, plain, control)
	for i, n := range nss {
		switch n {
		case w.a.Netns:
			r.exclude(i, "ul0")
		case w.f.Netns:
			r.skip(i)
		}
	}
	ul0, err := w.a.LinkMAC("ul0")
	if err != nil {
		t.Fatal(err)
	}
	br0, err := w.f.LinkMAC("br0")
	if err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for _, wl := range []*workload{w.blue1, w.tap, w.red1} {
		for _, v6 := range []bool{false, true} {
			src := w.f.RR
			if v6 {
				src = addr("2001:db8:f::1")
			}
			p := packet.UDP(src, wl.Addr(v6), sport, dport, plain)
			frames = append(frames, packet.Ethernet(ul0, br0, packet.EtherTypeOf(src), p))
		}
	}
	// Then one to the node itself, on the same path, as the barrier.
	frames = append(frames, packet.Ethernet(ul0, br0, packet.EtherTypeIPv4, packet.UDP(w.f.RR, w.a.Underlay, sport, dport, control)))
	if err := w.f.SendFrames("br0", frames...); err != nil {
		t.Fatal(err)
	}
	for i, n := range nss {
		if n == w.a.Netns {
			if err := r.caps[i].WaitFrames(1, time.Now().Add(10*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.none(t, 0, "plain packets from a fabric host to workload addresses")
}
