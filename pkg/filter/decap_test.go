package filter

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// snmp reads one counter of /proc/net/snmp in the thread's namespace.
func snmp(t *testing.T, proto, name string) int {
	t.Helper()
	f, err := os.Open("/proc/thread-self/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 || fields[0] != proto+":" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for i, n := range names {
			if n == name {
				v, _ := strconv.Atoi(fields[i])
				return v
			}
		}
	}
	t.Fatalf("no %s %s in /proc/net/snmp", proto, name)
	return 0
}

// What the decapsulation program takes in arrives on the VPC's VXLAN
// device without crossing the node's UDP (the fast path); what it does
// not take goes on to the kernel, which accepts it or not as before:
// a UDP checksum is the kernel's to verify, another VTEP, another VNI and
// the device's own MAC as inner source reach nothing. Uninstalling takes
// the program off the underlay.
func TestDecapsulationTakesOnlyWhatTheKernelWouldAccept(t *testing.T) {
	inNetns(t, func() {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "u0"}, PeerName: "u1"}); err != nil {
			t.Fatal(err)
		}
		local, vtep := netip.MustParseAddr("10.97.0.1"), netip.MustParseAddr("10.97.0.2")
		devMAC := net.HardwareAddr{2, 0, 0, 0, 0, 0x77}
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "gxdecaptest", HardwareAddr: devMAC}, VxlanId: 77, SrcAddr: local.AsSlice(), Port: VXLANPort}
		if err := netlink.LinkAdd(vx); err != nil {
			t.Fatal(err)
		}
		// A workload's interface behind w0, its MAC resolved.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "w0"}, PeerName: "w1"}); err != nil {
			t.Fatal(err)
		}
		// The workload's end forwards nothing back.
		// (all/ first: writing it sets every interface's.)
		for _, f := range []string{"all/forwarding=1", "w1/forwarding=0"} {
			k, v, _ := strings.Cut(f, "=")
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k, []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		addrs := map[string]string{"u0": "10.97.0.1/24", "gxdecaptest": "10.98.0.1/24", "w0": "10.96.0.1/24"}
		for _, name := range []string{"lo", "u0", "u1", "gxdecaptest", "w0", "w1"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if a, ok := addrs[name]; ok {
				addr, _ := netlink.ParseAddr(a)
				if err := netlink.AddrAdd(l, addr); err != nil {
					t.Fatal(err)
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		u0, _ := netlink.LinkByName("u0")
		u1, _ := netlink.LinkByName("u1")
		w0, _ := netlink.LinkByName("w0")
		w1, _ := netlink.LinkByName("w1")
		workload := netip.MustParseAddr("10.96.0.5")
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: w0.Attrs().Index, State: netlink.NUD_PERMANENT, IP: workload.AsSlice(), HardwareAddr: w1.Attrs().HardwareAddr}); err != nil {
			t.Fatal(err)
		}
		// What reaches the workload, read on its end of the veth.
		capture, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(capture)
		if err := unix.Bind(capture, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: w1.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
		if err := unix.SetNonblock(capture, true); err != nil {
			t.Fatal(err)
		}
		received := func() (frames [][]byte) {
			buf := make([]byte, 2048)
			for {
				n, _, err := unix.Recvfrom(capture, buf, 0)
				if err != nil {
					return frames
				}
				frames = append(frames, slices.Clone(buf[:n]))
			}
		}
		if _, err := k.SetVTEPs([]netip.Addr{vtep}); err != nil {
			t.Fatal(err)
		}
		if f, err := decapFilter(u0); err != nil || f == nil {
			t.Fatalf("the underlay has no decapsulation filter (%v)", err)
		}
		if f, err := decapFilter(u1); err != nil || f != nil {
			t.Fatalf("an interface without the devices' address has the decapsulation filter (%v)", err)
		}

		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: u1.Attrs().Index, Halen: 6}
		copy(to.Addr[:], u0.Attrs().HardwareAddr)
		inner := net.HardwareAddr{2, 0, 0, 0, 0, 0x78}
		remote := netip.MustParseAddr("10.98.0.2")
		echo := packet.ICMP(remote, netip.MustParseAddr("10.98.0.1"), icmpEchoRequest, 0, []byte{0, 1, 0, 1})
		toWorkload := packet.UDP(remote, workload, 5000, 9, []byte("to the workload"))
		frame := func(from netip.Addr, vni uint32, innerSrc net.HardwareAddr, csum bool, innerIP []byte) []byte {
			ip := packet.UDP(from, local, 40000, VXLANPort, packet.VXLAN(vni, packet.Ethernet(devMAC, innerSrc, packet.EtherTypeIPv4, innerIP)))
			if !csum {
				ip[26], ip[27] = 0, 0
			}
			return packet.Ethernet(u0.Attrs().HardwareAddr, u1.Attrs().HardwareAddr, packet.EtherTypeIPv4, ip)
		}
		fast := frame(vtep, 77, inner, false, echo)
		martian := slices.Clone(toWorkload)
		martian[12] = 127
		binary.BigEndian.PutUint16(martian[10:], 0)
		binary.BigEndian.PutUint16(martian[10:], packet.Checksum(martian[:20]))
		// A header checksum spoilt: the kernel's IP input drops the packet.
		spoil := func(f []byte, at int) []byte {
			f = slices.Clone(f)
			f[at+11] ^= 1
			return f
		}
		cases := []struct {
			name                               string
			f                                  []byte
			echoes, udps, delivered, forwarded int
		}{
			{"to the node, the fast path", fast, 1, 0, 0, 0},
			{"to the node with a UDP checksum, the kernel's path", frame(vtep, 77, inner, true, echo), 1, 1, 0, 0},
			{"a VTEP the router did not install", frame(netip.MustParseAddr("10.97.0.3"), 77, inner, false, echo), 0, 0, 0, 0},
			{"a VNI of no device", frame(vtep, 78, inner, false, echo), 0, 1, 0, 0},
			{"the device's own MAC as inner source", frame(vtep, 77, devMAC, false, echo), 0, 1, 0, 0},
			{"to a workload, forwarded from the program", frame(vtep, 77, inner, false, toWorkload), 0, 0, 1, 0},
			{"to a workload with a UDP checksum, the kernel's forwarding", frame(vtep, 77, inner, true, toWorkload), 0, 1, 1, 1},
			{"to a workload from a martian source, the kernel's to drop", frame(vtep, 77, inner, false, martian), 0, 0, 0, 0},
			{"a wrong outer header checksum", spoil(frame(vtep, 77, inner, false, toWorkload), 14), 0, 0, 0, 0},
			{"a wrong inner header checksum", spoil(frame(vtep, 77, inner, false, toWorkload), 64), 0, 0, 0, 0},
		}
		for _, c := range cases {
			echoes, udps, forwarded := snmp(t, "Icmp", "InEchos"), snmp(t, "Udp", "InDatagrams"), snmp(t, "Ip", "ForwDatagrams")
			// The fast path's frame after the case's: once its echo is
			// counted, the case's frame has been dealt with.
			for _, f := range [][]byte{c.f, fast} {
				if err := unix.Sendto(fd, f, 0, to); err != nil {
					t.Fatal(err)
				}
			}
			for deadline := time.Now().Add(5 * time.Second); snmp(t, "Icmp", "InEchos") < echoes+c.echoes+1 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if got := snmp(t, "Icmp", "InEchos") - echoes - 1; got != c.echoes {
				t.Errorf("%s: %d echo requests reached the node, want %d", c.name, got, c.echoes)
			}
			if got := snmp(t, "Udp", "InDatagrams") - udps; got != c.udps {
				t.Errorf("%s: %d datagrams crossed the node's UDP, want %d", c.name, got, c.udps)
			}
			if got := snmp(t, "Ip", "ForwDatagrams") - forwarded; got != c.forwarded {
				t.Errorf("%s: the kernel forwarded %d packets, want %d", c.name, got, c.forwarded)
			}
			var got [][]byte
			for _, f := range received() {
				if len(f) >= 14+20 && netip.AddrFrom4([4]byte(f[14+16:14+20])) == workload {
					got = append(got, f)
				}
			}
			if len(got) != c.delivered {
				t.Errorf("%s: %d packets reached the workload, want %d", c.name, len(got), c.delivered)
				continue
			}
			for _, f := range got {
				ip := f[14:]
				if want := slices.Concat(w1.Attrs().HardwareAddr, w0.Attrs().HardwareAddr); string(f[:12]) != string(want) {
					t.Errorf("%s: the frame's MACs are %x, want %x", c.name, f[:12], want)
				}
				if ip[8] != toWorkload[8]-1 || packet.Checksum(ip[:20]) != 0 {
					t.Errorf("%s: TTL %d (sent %d), header checksum valid: %v", c.name, ip[8], toWorkload[8], packet.Checksum(ip[:20]) == 0)
				}
				if string(ip[20:]) != string(toWorkload[20:]) {
					t.Errorf("%s: the payload changed", c.name)
				}
			}
		}

		if err := k.Delete(); err != nil {
			t.Fatal(err)
		}
		if f, err := decapFilter(u0); err != nil || f != nil {
			t.Fatalf("the decapsulation filter outlived the uninstall (%v)", err)
		}
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
