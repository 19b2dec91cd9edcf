// Package packet builds raw frames and packets for tests that act as an
// attacker would: every header is built here, so a source, a MAC or a VNI
// can be anything. It has no dependencies, so the VM guest scenarios use
// it too.
package packet

import (
	"crypto/rand"
	"encoding/binary"
	"net"
	"net/netip"
)

// EtherType values.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86dd
	EtherTypeARP  = 0x0806
)

// ARP operations.
const (
	ARPRequest = 1
	ARPReply   = 2
)

// ARP is an Ethernet/IPv4 ARP message (an EtherTypeARP payload): op,
// then sender and target hardware and protocol addresses.
func ARP(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := []byte{0, 1, 0x08, 0x00, 6, 4}
	b = binary.BigEndian.AppendUint16(b, op)
	b = append(append(b, sha[:6]...), spa.AsSlice()...)
	return append(append(b, tha[:6]...), tpa.AsSlice()...)
}

// NeighborSolicitation asks for target's link-layer address, from src to
// target's solicited-node group, with a source link-layer option of sll
// (none when nil).
func NeighborSolicitation(src, target netip.Addr, sll net.HardwareAddr) []byte {
	t := target.As16()
	group := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: t[13], 14: t[14], 15: t[15]})
	body := append([]byte{0, 0, 0, 0}, t[:]...)
	if sll != nil {
		body = append(append(body, 1, 1), sll...)
	}
	return ICMP(src, group, 135, 0, body)
}

// NeighborAdvertisement is an unsolicited advertisement with the override
// flag, from src to all nodes, that target is at tll.
func NeighborAdvertisement(src, target netip.Addr, tll net.HardwareAddr) []byte {
	body := append([]byte{0x20, 0, 0, 0}, target.AsSlice()...)
	body = append(append(body, 2, 1), tll...)
	return ICMP(src, netip.MustParseAddr("ff02::1"), 136, 0, body)
}

// IP protocol numbers.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// NewMarker is a random payload tag that tells a test's packets from
// everything else a capture sees.
func NewMarker() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}

// Ethernet is a frame: dst, src, EtherType, payload.
func Ethernet(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b, dst)
	copy(b[6:], src)
	binary.BigEndian.PutUint16(b[12:], etherType)
	return append(b, payload...)
}

// EtherTypeOf is the EtherType of an IP packet from src.
func EtherTypeOf(src netip.Addr) uint16 {
	if src.Is4() {
		return EtherTypeIPv4
	}
	return EtherTypeIPv6
}

// IPPacket is an IPv4 or IPv6 packet (by the family of src and dst) with
// TTL or hop limit ttl.
func IPPacket(src, dst netip.Addr, proto, ttl byte, payload []byte) []byte {
	if src.Is4() {
		b := make([]byte, 20, 20+len(payload))
		b[0] = 0x45
		binary.BigEndian.PutUint16(b[2:], uint16(20+len(payload)))
		b[6] = 0x40 // don't fragment
		b[8], b[9] = ttl, proto
		copy(b[12:], src.AsSlice())
		copy(b[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(b[10:], Checksum(b))
		return append(b, payload...)
	}
	b := make([]byte, 40, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6], b[7] = proto, ttl
	copy(b[8:], src.AsSlice())
	copy(b[24:], dst.AsSlice())
	return append(b, payload...)
}

// pseudoChecksum is the transport checksum over the IP pseudo-header and msg.
func pseudoChecksum(src, dst netip.Addr, proto byte, msg []byte) uint16 {
	var ph []byte
	ph = append(ph, src.AsSlice()...)
	ph = append(ph, dst.AsSlice()...)
	if src.Is4() {
		ph = append(ph, 0, proto)
		ph = binary.BigEndian.AppendUint16(ph, uint16(len(msg)))
	} else {
		ph = binary.BigEndian.AppendUint32(ph, uint32(len(msg)))
		ph = append(ph, 0, 0, 0, proto)
	}
	return Checksum(append(ph, msg...))
}

// UDP is an IP packet carrying a UDP datagram.
func UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u, sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	c := pseudoChecksum(src, dst, ProtoUDP, u)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return IPPacket(src, dst, ProtoUDP, 64, u)
}

// TCP flags.
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPPsh = 0x08
	TCPAck = 0x10
)

// TCP is an IP packet carrying a TCP segment with flags, sequence and
// acknowledgement numbers seq and ack, a 20-byte header and payload.
func TCP(src, dst netip.Addr, sport, dport uint16, flags byte, seq, ack uint32, payload []byte) []byte {
	s := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(s, sport)
	binary.BigEndian.PutUint16(s[2:], dport)
	binary.BigEndian.PutUint32(s[4:], seq)
	binary.BigEndian.PutUint32(s[8:], ack)
	s[12] = 5 << 4
	s[13] = flags
	binary.BigEndian.PutUint16(s[14:], 65535)
	s = append(s, payload...)
	binary.BigEndian.PutUint16(s[16:], pseudoChecksum(src, dst, ProtoTCP, s))
	return IPPacket(src, dst, ProtoTCP, 64, s)
}

// ICMP is an IP packet carrying an ICMP (IPv4) or ICMPv6 message of type
// and code with body after the 4-byte header; IPv6 uses hop limit 255, as
// neighbour discovery requires.
func ICMP(src, dst netip.Addr, typ, code byte, body []byte) []byte {
	m := append([]byte{typ, code, 0, 0}, body...)
	if src.Is4() {
		binary.BigEndian.PutUint16(m[2:], Checksum(m))
		return IPPacket(src, dst, ProtoICMP, 64, m)
	}
	binary.BigEndian.PutUint16(m[2:], pseudoChecksum(src, dst, ProtoICMPv6, m))
	return IPPacket(src, dst, ProtoICMPv6, 255, m)
}

// VXLAN is the 8-byte VXLAN header with vni (flags: VNI valid) and the
// inner Ethernet frame: a UDP payload for port 4789.
func VXLAN(vni uint32, inner []byte) []byte {
	b := make([]byte, 8, 8+len(inner))
	b[0] = 0x08
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	return append(b, inner...)
}

// Checksum is the Internet checksum (RFC 1071) of b.
func Checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = (sum & 0xffff) + sum>>16
	}
	return ^uint16(sum)
}
