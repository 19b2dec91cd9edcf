package filter

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/galactic-cni/galactic/test/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const actRedirect = 7

// A packet the kernel would forward leaves the classifier redirected to
// its route, its TTL or hop limit one less (the IPv4 header's checksum
// still right); one the kernel would deliver locally, has no route for
// or would drop for its header's checksum goes on to the kernel
// unchanged.
func TestTheClassifierForwardsWhatTheKernelWouldForward(t *testing.T) {
	inNetns(t, func() {
		for _, f := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fwd0"}, PeerName: "fwd1"}
		if err := netlink.LinkAdd(out); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"lo", "fwd0", "fwd1"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
		l, _ := netlink.LinkByName("fwd0")
		for _, a := range []string{"10.99.0.1/24", "fd99::1/64"} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(l, addr); err != nil {
				t.Fatal(err)
			}
		}
		for _, ip := range []string{"10.99.0.2", "fd99::2"} {
			n := &netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT, IP: net.ParseIP(ip), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 9}}
			if err := netlink.NeighAdd(n); err != nil {
				t.Fatal(err)
			}
		}
		p, _ := loadTestClassifier(t, vethAttachment())
		cases := []struct {
			name    string
			f       []byte
			forward bool
			// badSum spoils the IPv4 header's checksum, which the
			// kernel's input drops.
			badSum bool
		}{
			{"IPv4 to a routed neighbour", frame(ownMAC, own4, netip.MustParseAddr("10.99.0.2"), 6, tcp()), true, false},
			{"IPv6 to a routed neighbour", frame(ownMAC, own6, netip.MustParseAddr("fd99::2"), 6, tcp()), true, false},
			{"IPv4 to the node itself", frame(ownMAC, own4, netip.MustParseAddr("10.99.0.1"), 6, tcp()), false, false},
			{"IPv6 to the node itself", frame(ownMAC, own6, netip.MustParseAddr("fd99::1"), 6, tcp()), false, false},
			{"IPv4 without a route", frame(ownMAC, own4, netip.MustParseAddr("10.98.0.1"), 6, tcp()), false, false},
			{"IPv4 with its last hop", lastHop(frame(ownMAC, own4, netip.MustParseAddr("10.99.0.2"), 6, tcp())), false, false},
			{"IPv6 multicast", frame(ownMAC, own6, netip.MustParseAddr("ff02::1"), 17, udp(999)), false, false},
			{"IPv4 with a wrong header checksum", frame(ownMAC, own4, netip.MustParseAddr("10.99.0.2"), 6, tcp()), false, true},
		}
		for _, c := range cases {
			in := c.f
			if in[12] == 0x08 {
				binary.BigEndian.PutUint16(in[ipStart+10:], packet.Checksum(in[ipStart:ipStart+20]))
				if c.badSum {
					in[ipStart+11] ^= 1
				}
			}
			in = padFrame(in)
			got := make([]byte, len(in)+64)
			r, err := p.Run(&ebpf.RunOptions{Data: in, DataOut: got})
			if err != nil {
				t.Fatal(err)
			}
			if !c.forward {
				if r != actOK {
					t.Errorf("%s: verdict %d, want %d (to the kernel)", c.name, r, actOK)
				}
				continue
			}
			if r != actRedirect {
				t.Errorf("%s: verdict %d, want %d (forwarded)", c.name, r, actRedirect)
				continue
			}
			if in[12] == 0x08 {
				if got[ipStart+8] != in[ipStart+8]-1 || packet.Checksum(got[ipStart:ipStart+20]) != 0 {
					t.Errorf("%s: TTL %d (was %d), checksum wrong: %v", c.name, got[ipStart+8], in[ipStart+8], packet.Checksum(got[ipStart:ipStart+20]) != 0)
				}
			} else if got[ipStart+7] != in[ipStart+7]-1 {
				t.Errorf("%s: hop limit %d (was %d)", c.name, got[ipStart+7], in[ipStart+7])
			}
		}
	})
}

func lastHop(f []byte) []byte { f[ipStart+8] = 1; return f }
