package filter

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
)

// tc's verdict for what goes on to the kernel, and where a frame's IP
// header starts.
const (
	actOK   = 0
	ipStart = 14
)

// frame builds an Ethernet frame from src MAC with an IPv4 or IPv6
// header from src to dst, protocol proto, and payload after it.
func frame(mac net.HardwareAddr, src, dst netip.Addr, proto byte, payload []byte) []byte {
	f := append(make([]byte, 6), mac...)
	if src.Is4() {
		f = append(f, 0x08, 0x00)
		h := make([]byte, 20)
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
		h[8], h[9] = 64, proto
		copy(h[12:], src.AsSlice())
		copy(h[16:], dst.AsSlice())
		return append(append(f, h...), payload...)
	}
	f = append(f, 0x86, 0xdd)
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h[6], h[7] = proto, 255
	copy(h[8:], src.AsSlice())
	copy(h[24:], dst.AsSlice())
	return append(append(f, h...), payload...)
}

func testClassifier(t *testing.T, a Attachment) (func([]byte) uint32, *ebpf.Map) {
	t.Helper()
	p, m := loadTestClassifier(t, a)
	return func(f []byte) uint32 {
		t.Helper()
		r, err := p.Run(&ebpf.RunOptions{Data: padFrame(f)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}, m
}

// padFrame pads f to Ethernet's minimum frame size (without FCS), as
// frames on the wire are.
func padFrame(f []byte) []byte {
	for len(f) < 60 {
		f = append(f, 0)
	}
	return f
}

// loadTestClassifier loads the classifier with a's entry for the test
// run's interface.
func loadTestClassifier(t *testing.T, a Attachment) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading a BPF program needs root")
	}
	objs, err := loadClassifierNamed("gwtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	v, err := a.value()
	if err != nil {
		t.Fatal(err)
	}
	// A test run's packet arrives on the loopback device, index 1.
	if err := objs.Attachments.Put(uint32(1), v); err != nil {
		t.Fatal(err)
	}
	return objs.Classify, objs.Attachments
}

var (
	ownMAC   = net.HardwareAddr{2, 0, 0, 0, 0, 5}
	otherMAC = net.HardwareAddr{2, 0, 0, 0, 0, 6}
	own4     = netip.MustParseAddr("10.0.0.5")
	own6     = netip.MustParseAddr("fd00::5")
	peer4    = netip.MustParseAddr("10.0.0.7")
	peer6    = netip.MustParseAddr("fd00::7")
	ll6      = netip.MustParseAddr("fe80::5")
	any6     = netip.MustParseAddr("::")
)

func vethAttachment() Attachment {
	return Attachment{Interface: "gvtest", MAC: ownMAC, Sources: []netip.Prefix{
		netip.MustParsePrefix("10.0.0.5/32"), netip.MustParsePrefix("10.9.0.0/16"),
		netip.MustParsePrefix("fd00::5/128"), netip.MustParsePrefix("2001:db8:9::/48"),
	}}
}

func udp(src uint16) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint16(b, src)
	binary.BigEndian.PutUint16(b[2:], 9)
	return b
}

func tcp() []byte { b := make([]byte, 20); b[0], b[3], b[12] = 0x30, 80, 0x50; return b }

func icmp(typ byte) []byte { return []byte{typ, 0, 0, 0, 0, 0, 0, 0} }

// nd is a neighbour solicitation (135) or advertisement (136) for target
// with, when mac is set, a link-layer address option of type opt.
func nd(typ byte, target netip.Addr, opt byte, mac net.HardwareAddr) []byte {
	b := append([]byte{typ, 0, 0, 0, 0, 0, 0, 0}, target.AsSlice()...)
	if mac != nil {
		b = append(append(b, opt, 1), mac...)
	}
	return b
}

// ip4opts is frame's IPv4 header with one 4-byte option (IHL 6).
func ip4opts(f []byte) []byte {
	out := append([]byte{}, f[:34]...)
	out[14] = 0x46
	out = append(out, 1, 1, 1, 0)
	return append(out, f[34:]...)
}

// frag6 inserts a fragment header after frame's IPv6 header.
func frag6(f []byte, offset uint16) []byte {
	out := append([]byte{}, f[:54]...)
	next := out[20]
	out[20] = 44
	h := []byte{next, 0, 0, 0, 0, 0, 0, 1}
	binary.BigEndian.PutUint16(h[2:], offset<<3|1)
	return append(append(out, h...), f[54:]...)
}

func withEthertype(f []byte, t uint16) []byte {
	out := append([]byte{}, f...)
	binary.BigEndian.PutUint16(out[12:], t)
	return out
}

func TestTheClassifierPassesOnlyWhatTheAttachmentAllows(t *testing.T) {
	run, _ := testClassifier(t, vethAttachment())
	hbh := frame(ownMAC, own6, peer6, 0, append([]byte{6, 0, 1, 4, 0, 0, 0, 0}, tcp()...))
	cases := []struct {
		name string
		f    []byte
		pass bool
	}{
		{"IPv4 from its address", frame(ownMAC, own4, peer4, 6, tcp()), true},
		{"IPv4 from its allowed prefix", frame(ownMAC, netip.MustParseAddr("10.9.3.4"), peer4, 6, tcp()), true},
		{"IPv4 from a neighbour's address", frame(ownMAC, peer4, own4, 6, tcp()), false},
		{"IPv4 from a node address", frame(ownMAC, netip.MustParseAddr("192.168.0.1"), peer4, 17, udp(999)), false},
		{"IPv4 with another MAC", frame(otherMAC, own4, peer4, 6, tcp()), false},
		{"a DHCP server reply", frame(ownMAC, own4, peer4, 17, udp(67)), false},
		{"a DHCPv6 server port over IPv4", frame(ownMAC, own4, peer4, 17, udp(547)), false},
		{"a DHCP server reply behind IPv4 options", ip4opts(frame(ownMAC, own4, peer4, 17, udp(67))), false},
		{"UDP behind IPv4 options", ip4opts(frame(ownMAC, own4, peer4, 17, udp(999))), true},
		{"UDP", frame(ownMAC, own4, peer4, 17, udp(999)), true},
		{"an ICMP redirect", frame(ownMAC, own4, peer4, 1, icmp(5)), false},
		{"an ICMP echo request", frame(ownMAC, own4, peer4, 1, icmp(8)), true},
		{"an IPv4 header shorter than 20 bytes", func() []byte { f := frame(ownMAC, own4, peer4, 6, tcp()); f[14] = 0x44; return f }(), false},
		{"ARP", withEthertype(frame(ownMAC, own4, peer4, 6, tcp()), 0x0806), true},
		{"ARP with another MAC", withEthertype(frame(otherMAC, own4, peer4, 6, tcp()), 0x0806), false},
		{"a VLAN tag", withEthertype(frame(ownMAC, own4, peer4, 6, tcp()), 0x8100), false},
		{"IPv6 from its address", frame(ownMAC, own6, peer6, 6, tcp()), true},
		{"IPv6 from its allowed prefix", frame(ownMAC, netip.MustParseAddr("2001:db8:9:1::1"), peer6, 6, tcp()), true},
		{"IPv6 from a neighbour's address", frame(ownMAC, peer6, own6, 6, tcp()), false},
		{"IPv6 just outside its allowed prefix", frame(ownMAC, netip.MustParseAddr("2001:db8:a::1"), peer6, 6, tcp()), false},
		{"IPv6 with another MAC", frame(otherMAC, own6, peer6, 6, tcp()), false},
		{"TCP from a link-local address", frame(ownMAC, ll6, peer6, 6, tcp()), false},
		{"an echo request from a link-local address", frame(ownMAC, ll6, peer6, 58, icmp(128)), true},
		{"a router advertisement", frame(ownMAC, ll6, netip.MustParseAddr("ff02::1"), 58, icmp(134)), false},
		{"an ICMPv6 redirect", frame(ownMAC, ll6, peer6, 58, icmp(137)), false},
		{"DAD from ::", frame(ownMAC, any6, netip.MustParseAddr("ff02::1:ff00:5"), 58, nd(135, own6, 0, nil)), true},
		{"a solicitation with its MAC", frame(ownMAC, ll6, peer6, 58, nd(135, peer6, 1, ownMAC)), true},
		{"a solicitation with another MAC", frame(ownMAC, ll6, peer6, 58, nd(135, peer6, 1, otherMAC)), false},
		{"an advertisement of its address", frame(ownMAC, ll6, peer6, 58, nd(136, own6, 2, ownMAC)), true},
		{"an advertisement of a link-local address", frame(ownMAC, ll6, peer6, 58, nd(136, ll6, 0, nil)), true},
		{"an advertisement of a neighbour's address", frame(ownMAC, ll6, peer6, 58, nd(136, peer6, 2, ownMAC)), false},
		{"an advertisement with another MAC", frame(ownMAC, ll6, peer6, 58, nd(136, own6, 2, otherMAC)), false},
		{"a DHCPv6 server reply", frame(ownMAC, own6, peer6, 17, udp(547)), false},
		{"a hop-by-hop header", hbh, false},
		{"a first fragment of an echo request", frag6(frame(ownMAC, own6, peer6, 58, icmp(128)), 0), true},
		{"a first fragment of a router advertisement", frag6(frame(ownMAC, ll6, peer6, 58, icmp(134)), 0), false},
		{"a fragmented echo from a link-local address", frag6(frame(ownMAC, ll6, peer6, 58, icmp(128)), 0), false},
		{"a first fragment of a DHCPv6 server reply", frag6(frame(ownMAC, own6, peer6, 17, udp(547)), 0), false},
		{"a later fragment from its address", frag6(frame(ownMAC, own6, peer6, 17, udp(547)), 100), true},
		{"a later fragment from a neighbour's address", frag6(frame(ownMAC, peer6, own6, 17, udp(999)), 100), false},
		{"a fragment header behind a fragment header", frag6(frag6(frame(ownMAC, own6, peer6, 6, tcp()), 0), 0), false},
	}
	for _, c := range cases {
		if got := run(c.f) == actOK; got != c.pass {
			t.Errorf("%s: passed %v, want %v", c.name, got, c.pass)
		}
	}
}

func TestTheClassifierOfATapTakesAnyMACAndOfAnInterfaceWithoutEntryNothing(t *testing.T) {
	tap := vethAttachment()
	tap.MAC = nil
	run, _ := testClassifier(t, tap)
	for _, mac := range []net.HardwareAddr{ownMAC, otherMAC} {
		if run(frame(mac, own4, peer4, 6, tcp())) != actOK || run(frame(mac, own6, peer6, 6, tcp())) != actOK {
			t.Errorf("a tap's frame from %s was dropped", mac)
		}
	}
	only6 := Attachment{Interface: "gttest", Sources: []netip.Prefix{netip.MustParsePrefix("fd00::5/128")}}
	run, m := testClassifier(t, only6)
	if run(frame(ownMAC, own4, peer4, 6, tcp())) == actOK {
		t.Error("an attachment without IPv4 sources sent IPv4")
	}
	if run(frame(ownMAC, own6, peer6, 6, tcp())) != actOK {
		t.Error("an IPv6-only attachment's own packet was dropped")
	}
	if err := m.Delete(uint32(1)); err != nil {
		t.Fatal(err)
	}
	if run(frame(ownMAC, own6, peer6, 6, tcp())) == actOK {
		t.Error("an interface without an entry sent a packet")
	}
}

func TestAnAttachmentWithMoreSourcesThanTheClassifierHoldsIsRefused(t *testing.T) {
	a := Attachment{Interface: "gvtest"}
	for i := range maxSources + 1 {
		a.Sources = append(a.Sources, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 1}), 32))
	}
	if _, err := a.value(); err == nil {
		t.Fatal("no error")
	}
}

// The program's name carries the hash of the object that ships, so that
// a node tells this build's program from another's (make
// verify-generated checks that the object is bpf/classifier.c compiled).
func TestTheProgramsNameCarriesItsObjectsHash(t *testing.T) {
	if h := hashCode(); h != codeHash {
		t.Fatalf("the classifier's object changed: set codeHash in classifier.go to %q", h)
	}
}

// The map values the Go side writes are laid out as the C sources
// declare them (bpf2go's types are the C structs).
func TestTheMapValuesAreTheProgramsStructs(t *testing.T) {
	var a classifierAttachment
	var d decapVxlanDevice
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"attachment", unsafe.Sizeof(a), valueSize},
		{"attachment.flags", unsafe.Offsetof(a.Flags), valFlags},
		{"attachment.n4", unsafe.Offsetof(a.N4), valN4},
		{"attachment.n6", unsafe.Offsetof(a.N6), valN6},
		{"attachment.mac", unsafe.Offsetof(a.Mac), valMAC},
		{"attachment.v4", unsafe.Offsetof(a.V4), valV4},
		{"attachment.v6", unsafe.Offsetof(a.V6), valV6},
		{"vxlan_device", unsafe.Sizeof(d), decapValSize},
		{"vxlan_device.ifindex", unsafe.Offsetof(d.Ifindex), decapValIndex},
		{"vxlan_device.local", unsafe.Offsetof(d.Local), decapValLocal},
		{"vxlan_device.mac", unsafe.Offsetof(d.Mac), decapValMAC},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d in the C source, %d in Go", c.name, c.got, c.want)
		}
	}
}

// The lookup's raw info reads give what ebpf's full Info gives.
func TestTheRawInfoReadsAgreeWithEbpfs(t *testing.T) {
	inNetns(t, func() {
		c, err := current()
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		wantIDs, _ := info.MapIDs()
		name, ids, err := progNameAndMaps(c.prog)
		if err != nil || name != info.Name || !slices.Equal(ids, wantIDs) || name != progName() {
			t.Fatalf("program: %q %v %v, ebpf says %q %v", name, ids, err, info.Name, wantIDs)
		}
		mi, err := c.vals.Info()
		if err != nil {
			t.Fatal(err)
		}
		if name, err := mapObjName(c.vals); err != nil || name != mi.Name {
			t.Fatalf("map: %q %v, ebpf says %q", name, err, mi.Name)
		}
		ns, _ := currentNetns()
		if again := open(c.id, ns); again == nil {
			t.Fatal("open does not find the namespace's program by its ID")
		} else {
			again.close()
		}
		if open(c.id, ns+1) != nil {
			t.Fatal("open takes another namespace's program")
		}
	})
}
