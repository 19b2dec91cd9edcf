// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

package filter

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf/asm"
)

// The workload classifier: one tc program per network namespace, attached
// to the ingress of every workload host interface, that looks the
// interface's attachment up by ifindex in a hash map and lets through
// only what the attachment may send. ADD and DEL write and delete one map
// entry, so nothing is verified per attachment. What passes and is to be
// routed through the node, the program forwards itself (forward4,
// forward6).
//
// A map value (the attachment), little-endian where it is a number:
//
//	0    u32 flags (flagMAC: the frames' source MAC must be the one at 8)
//	4    u8  IPv4 source prefixes, 5: u8 IPv6 source prefixes
//	8    6 bytes MAC
//	16   maxSources × {addr [4]byte, mask [4]byte}
//	144  maxSources × {addr [16]byte, mask [16]byte}
const (
	maxSources = MaxSources
	flagMAC    = 1
	valFlags   = 0
	valN4      = 4
	valN6      = 5
	valMAC     = 8
	valV4      = 16
	valV6      = valV4 + maxSources*8
	valueSize  = valV6 + maxSources*32
)

// The frame's first bufLen bytes are copied to the stack at bufAt (below
// the frame pointer), placed so that the IPv6 addresses are 8-byte and
// the IPv4 header 4-byte aligned: the verifier takes only aligned stack
// loads.
const (
	bufLen = 88
	bufAt  = -102
	keyAt  = -4
)

// b is the frame pointer offset of the frame's byte off.
func b(off int) int16 { return int16(bufAt + off) }

// Offsets in the frame (Ethernet, then IPv4 or IPv6).
const (
	ethSrc    = 6
	ethType   = 12
	ipStart   = 14
	ip4Frag   = ipStart + 6
	ip4Proto  = ipStart + 9
	ip4Src    = ipStart + 12
	ip6PayLen = ipStart + 4
	ip6Next   = ipStart + 6
	ip6Src    = ipStart + 8
	ip6L4     = ipStart + 40
	// With one fragment header: its next header and offset, and L4.
	ip6FragOff = ip6L4 + 2
	ip6FragL4  = ip6L4 + 8
	// In an ICMPv6 neighbour solicitation or advertisement.
	ndTargetAt = ip6L4 + 8
	ndOptAt    = ip6L4 + 24
	ndOptMAC   = ip6L4 + 26
)

// __sk_buff fields, and tc's verdicts.
const (
	skbLen     = 0
	skbPktType = 4
	skbIfindex = 40
	skbGSOSize = 176
	actOK      = 0
	actShot    = 2
)

// Frame fields as a little-endian load of their network-order bytes
// reads them.
const (
	le16ARP   = 0x0608
	le16IPv4  = 0x0008
	le16IPv6  = 0xdd86
	le16DHCP4 = 0x4300 // port 67
	le16DHCP6 = 0x2302 // port 547
	// The fragment offset bits of IPv4's flags/offset and of an IPv6
	// fragment header's offset/flags.
	le16Frag4 = 0xff1f
	le16Frag6 = 0xf8ff
	// fe80::/10 and fe80::/64's first 8 bytes.
	le16LLMask = 0xc0ff
	le16LL     = 0x80fe
	le64LL     = 0x80fe
	// The NS/NA payload without options, and with one 8-byte option.
	le16ND    = 0x1800
	le16NDOpt = 0x2000
	// Option type 1 (source) or 2 (target link-layer address), length 1.
	le16OptSrc = 0x0101
	le16OptTgt = 0x0102
)

// IPv6 next headers that are extension headers: walking them would
// multiply what the verifier explores, and a workload needs none but a
// fragment header.
var extHeaders = []int32{0, 43, 44, 51, 60, 135, 139, 140, 253, 254}

type emitter struct {
	insns   asm.Instructions
	pending string
	n       int
}

// at names the next instruction.
func (e *emitter) at(label string) {
	if e.pending != "" {
		// Two names for one place: the first jumps to the second.
		e.emit(asm.Ja.Label(label))
	}
	e.pending = label
}

func (e *emitter) emit(is ...asm.Instruction) {
	for _, in := range is {
		if e.pending != "" {
			in = in.WithSymbol(e.pending)
			e.pending = ""
		}
		e.insns = append(e.insns, in)
	}
}

func (e *emitter) label(prefix string) string {
	e.n++
	return fmt.Sprintf("%s_%d", prefix, e.n)
}

// Registers the program keeps: the context, the frame's length and the
// attachment's map value.
const (
	rCtx = asm.R6
	rLen = asm.R7
	rVal = asm.R9
)

// program is the classifier's code; cfg is the attachments map's fd.
func program(cfg int) asm.Instructions {
	e := &emitter{}
	e.emit(
		asm.Mov.Reg(rCtx, asm.R1),
		asm.LoadMem(asm.R2, rCtx, skbIfindex, asm.Word),
		asm.StoreMem(asm.RFP, keyAt, asm.R2, asm.Word),
	)
	e.lookup(cfg, "drop")
	e.emit(
		asm.Mov.Reg(rVal, asm.R0),
		// Copy the headers: direct packet access would need them in the
		// linear part, and pulling them there costs more than a copy.
		asm.LoadMem(rLen, rCtx, skbLen, asm.Word),
		asm.Mov.Reg(asm.R4, rLen),
		asm.JLE.Imm(asm.R4, bufLen, "copy"),
		asm.Mov.Imm(asm.R4, bufLen),
	)
	e.at("copy")
	e.emit(asm.JLT.Imm(asm.R4, ipStart, "drop"))
	e.loadBytes(0, bufAt, "drop")
	e.emit(
		// A veth's frames carry its container end's MAC.
		asm.LoadMem(asm.R2, rVal, valFlags, asm.Word),
		asm.And.Imm(asm.R2, flagMAC),
		asm.JEq.Imm(asm.R2, 0, "ethertype"),
		asm.LoadMem(asm.R2, asm.RFP, b(ethSrc), asm.Word),
		asm.LoadMem(asm.R3, rVal, valMAC, asm.Word),
		asm.JNE.Reg(asm.R2, asm.R3, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ethSrc+4), asm.Half),
		asm.LoadMem(asm.R3, rVal, valMAC+4, asm.Half),
		asm.JNE.Reg(asm.R2, asm.R3, "drop"),
	)
	e.at("ethertype")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ethType), asm.Half),
		// ARP is checked by the arp table's rules.
		asm.JEq.Imm(asm.R2, le16ARP, "pass"),
		asm.JEq.Imm(asm.R2, le16IPv4, "ip4"),
		asm.JNE.Imm(asm.R2, le16IPv6, "drop"),
	)
	e.ip6()
	e.ip4()
	e.exits()
	return e.insns
}

// exits are the labels pass (to the kernel) and drop.
func (e *emitter) exits() {
	e.at("pass")
	e.emit(asm.Mov.Imm(asm.R0, actOK), asm.Return())
	e.at("drop")
	e.emit(asm.Mov.Imm(asm.R0, actShot), asm.Return())
}

// lookup looks the key at keyAt up in the map fd and jumps to miss when
// it has none; R0 then points at the value.
func (e *emitter) lookup(fd int, miss string) {
	e.emit(
		asm.LoadMapPtr(asm.R1, fd),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyAt),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, miss),
	)
}

// loadBytes copies R4 bytes of the packet from offset off to the stack
// at at, and jumps to fail when the packet is shorter.
func (e *emitter) loadBytes(off, at int32, fail string) {
	e.emit(
		asm.Mov.Reg(asm.R1, rCtx),
		asm.Mov.Imm(asm.R2, off),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, at),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, fail),
	)
}

func (e *emitter) ip4() {
	e.at("ip4")
	e.emit(
		asm.JLT.Imm(rLen, ipStart+20, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart), asm.Byte),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 0xf0),
		asm.JNE.Imm(asm.R3, 0x40, "drop"),
		asm.And.Imm(asm.R2, 0x0f),
		asm.JLT.Imm(asm.R2, 5, "drop"),
		// R8: the header's length, 20 to 60.
		asm.LSh.Imm(asm.R2, 2),
		asm.Mov.Reg(asm.R8, asm.R2),
		asm.LoadMem(asm.R1, asm.RFP, b(ip4Src), asm.Word),
		asm.LoadMem(asm.R3, rVal, valN4, asm.Byte),
	)
	for i := range maxSources {
		next := e.label("v4")
		off := int16(valV4 + 8*i)
		e.emit(
			asm.JLE.Imm(asm.R3, int32(i), "drop"),
			asm.LoadMem(asm.R2, rVal, off+4, asm.Word),
			asm.And.Reg(asm.R2, asm.R1),
			asm.LoadMem(asm.R4, rVal, off, asm.Word),
			asm.JEq.Reg(asm.R2, asm.R4, "src4"),
		)
		e.at(next)
	}
	e.emit(asm.Ja.Label("drop"))
	e.at("src4")
	// Later fragments carry no transport header.
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ip4Frag), asm.Half),
		asm.And.Imm(asm.R2, le16Frag4),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R3, asm.RFP, b(ip4Proto), asm.Byte),
		asm.Mov.Reg(asm.R4, asm.R8),
		asm.Add.Imm(asm.R4, ipStart+2),
		asm.JEq.Imm(asm.R3, 17, "udp4"),
		asm.JNE.Imm(asm.R3, 1, "fwd4"),
		// An ICMP redirect, whatever its code.
		asm.JLT.Reg(rLen, asm.R4, "drop"),
		asm.Mov.Reg(asm.R4, asm.RFP),
		asm.Add.Reg(asm.R4, asm.R8),
		asm.LoadMem(asm.R2, asm.R4, b(ipStart), asm.Byte),
		asm.JEq.Imm(asm.R2, icmpRedirect, "drop"),
		asm.Ja.Label("fwd4"),
	)
	// DHCP server replies.
	e.at("udp4")
	e.emit(
		asm.JLT.Reg(rLen, asm.R4, "drop"),
		asm.Mov.Reg(asm.R4, asm.RFP),
		asm.Add.Reg(asm.R4, asm.R8),
		asm.LoadMem(asm.R2, asm.R4, b(ipStart), asm.Half),
		asm.JEq.Imm(asm.R2, le16DHCP4, "drop"),
		asm.JEq.Imm(asm.R2, le16DHCP6, "drop"),
	)
	e.forward4()
}

// match6 jumps to ok when the 16 bytes at the frame's offset off are in
// one of the attachment's IPv6 prefixes, and to fail otherwise.
func (e *emitter) match6(off int, ok, fail string) {
	e.emit(
		asm.LoadMem(asm.R1, asm.RFP, b(off), asm.DWord),
		asm.LoadMem(asm.R2, asm.RFP, b(off+8), asm.DWord),
		asm.LoadMem(asm.R3, rVal, valN6, asm.Byte),
	)
	for i := range maxSources {
		next := e.label("v6")
		o := int16(valV6 + 32*i)
		e.emit(
			asm.JLE.Imm(asm.R3, int32(i), fail),
			asm.LoadMem(asm.R4, rVal, o+16, asm.DWord),
			asm.And.Reg(asm.R4, asm.R1),
			asm.LoadMem(asm.R5, rVal, o, asm.DWord),
			asm.JNE.Reg(asm.R4, asm.R5, next),
			asm.LoadMem(asm.R4, rVal, o+24, asm.DWord),
			asm.And.Reg(asm.R4, asm.R2),
			asm.LoadMem(asm.R5, rVal, o+8, asm.DWord),
			asm.JEq.Reg(asm.R4, asm.R5, ok),
		)
		e.at(next)
	}
	e.emit(asm.Ja.Label(fail))
}

// compareMAC jumps to differ unless the MAC at the stack offset at
// (2-byte aligned) is the one at the map value's offset val.
func (e *emitter) compareMAC(at, val int16, differ string) {
	for i := int16(0); i < 6; i += 2 {
		e.emit(
			asm.LoadMem(asm.R2, asm.RFP, at+i, asm.Half),
			asm.LoadMem(asm.R3, rVal, val+i, asm.Half),
			asm.JNE.Reg(asm.R2, asm.R3, differ),
		)
	}
}

func (e *emitter) notExtension(reg asm.Register) {
	for _, h := range extHeaders {
		e.emit(asm.JEq.Imm(reg, h, "drop"))
	}
}

func (e *emitter) ip6() {
	e.emit(
		asm.JLT.Imm(rLen, ip6L4, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart), asm.Byte),
		asm.And.Imm(asm.R2, 0xf0),
		asm.JNE.Imm(asm.R2, 0x60, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6Next), asm.Byte),
		asm.JNE.Imm(asm.R2, 44, "unfragmented"),
		asm.JLT.Imm(rLen, ip6FragL4, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6L4), asm.Byte),
		asm.LoadMem(asm.R3, asm.RFP, b(ip6FragOff), asm.Half),
		asm.And.Imm(asm.R3, le16Frag6),
		// A later fragment: only its source to check.
		asm.JNE.Imm(asm.R3, 0, "src6"),
	)
	e.notExtension(asm.R2)
	// A first fragment: of ICMPv6 only echo, whose checks need nothing
	// past the type.
	e.emit(
		asm.JEq.Imm(asm.R2, 17, "udp6frag"),
		asm.JNE.Imm(asm.R2, 58, "src6"),
		asm.JLT.Imm(rLen, ip6FragL4+4, "drop"),
		asm.LoadMem(asm.R3, asm.RFP, b(ip6FragL4), asm.Byte),
		asm.JEq.Imm(asm.R3, icmp6EchoRequest, "src6"),
		asm.JEq.Imm(asm.R3, icmp6EchoReply, "src6"),
		asm.Ja.Label("drop"),
	)
	e.at("udp6frag")
	e.emit(
		asm.JLT.Imm(rLen, ip6FragL4+4, "drop"),
		asm.LoadMem(asm.R3, asm.RFP, b(ip6FragL4), asm.Half),
		asm.Ja.Label("udp6port"),
	)
	e.at("unfragmented")
	e.notExtension(asm.R2)
	e.emit(
		asm.JEq.Imm(asm.R2, 17, "udp6"),
		asm.JNE.Imm(asm.R2, 58, "src6"),
		asm.JLT.Imm(rLen, ip6L4+4, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6L4), asm.Byte),
		asm.JEq.Imm(asm.R2, icmp6RouterAdvert, "drop"),
		asm.JEq.Imm(asm.R2, icmp6Redirect, "drop"),
		// DAD: a solicitation from :: announces nothing.
		asm.LoadMem(asm.R3, asm.RFP, b(ip6Src), asm.DWord),
		asm.LoadMem(asm.R4, asm.RFP, b(ip6Src+8), asm.DWord),
		asm.Or.Reg(asm.R3, asm.R4),
		asm.JEq.Imm(asm.R3, 0, "pass"),
		asm.JEq.Imm(asm.R2, icmp6NeighSolicit, "lladdr"),
		asm.JNE.Imm(asm.R2, icmp6NeighAdvert, "linklocal"),
		// An advertisement names as its target only a link-local address
		// or one the attachment may send from.
		asm.JLT.Imm(rLen, ndOptAt, "drop"),
		asm.LoadMem(asm.R3, asm.RFP, b(ndTargetAt), asm.DWord),
		asm.JEq.Imm(asm.R3, le64LL, "lladdr"),
	)
	e.match6(ndTargetAt, "lladdr", "drop")
	// A veth's solicitation or advertisement carries no option or one
	// link-layer address option, and that is the container end's MAC.
	e.at("lladdr")
	e.emit(
		asm.LoadMem(asm.R2, rVal, valFlags, asm.Word),
		asm.And.Imm(asm.R2, flagMAC),
		asm.JEq.Imm(asm.R2, 0, "linklocal"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6PayLen), asm.Half),
		asm.JEq.Imm(asm.R2, le16ND, "linklocal"),
		asm.JNE.Imm(asm.R2, le16NDOpt, "drop"),
		asm.JLT.Imm(rLen, ndOptAt+8, "drop"),
		asm.LoadMem(asm.R2, asm.RFP, b(ndOptAt), asm.Half),
		asm.JEq.Imm(asm.R2, le16OptSrc, "optmac"),
		asm.JNE.Imm(asm.R2, le16OptTgt, "drop"),
	)
	e.at("optmac")
	e.compareMAC(b(ndOptMAC), valMAC, "drop")
	e.at("linklocal")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ip6Src), asm.Half),
		asm.And.Imm(asm.R2, le16LLMask),
		asm.JEq.Imm(asm.R2, le16LL, "pass"),
		asm.Ja.Label("src6"),
	)
	e.at("udp6")
	e.emit(
		asm.JLT.Imm(rLen, ip6L4+4, "drop"),
		asm.LoadMem(asm.R3, asm.RFP, b(ip6L4), asm.Half),
	)
	e.at("udp6port")
	e.emit(
		asm.JEq.Imm(asm.R3, le16DHCP4, "drop"),
		asm.JEq.Imm(asm.R3, le16DHCP6, "drop"),
	)
	e.at("src6")
	e.match6(ip6Src, "fwd6", "drop")
	e.forward6()
}

// MaxSources is how many source prefixes of each family an attachment
// may have, after merging those another contains.
const MaxSources = 16

// Validate says whether the classifier can hold a.
func (a Attachment) Validate() error {
	_, err := a.value()
	return err
}

// sourceFamily is where a map value keeps one family's prefixes: the
// count's offset, the first entry's, and the address size (an entry is
// the address, then its mask).
type sourceFamily struct {
	name        string
	count, base int
	size        int
}

var sourceFamilies = [2]sourceFamily{{"IPv4", valN4, valV4, 4}, {"IPv6", valN6, valV6, 16}}

func familyOf(a netip.Addr) sourceFamily {
	if a.Is4() {
		return sourceFamilies[0]
	}
	return sourceFamilies[1]
}

// value is a's map value.
func (a Attachment) value() ([]byte, error) {
	v := make([]byte, valueSize)
	if len(a.MAC) == 6 {
		binary.LittleEndian.PutUint32(v[valFlags:], flagMAC)
		copy(v[valMAC:], a.MAC)
	}
	for _, p := range Cover(a.Sources) {
		f := familyOf(p.Addr())
		n := int(v[f.count])
		if n == maxSources {
			return nil, fmt.Errorf("more than %d %s source prefixes (after merging those another contains)", maxSources, f.name)
		}
		off := f.base + 2*f.size*n
		copy(v[off:], p.Addr().AsSlice())
		copy(v[off+f.size:], net.CIDRMask(p.Bits(), 8*f.size))
		v[f.count]++
	}
	return v, nil
}

// describeValue names what a map value allows, for CHECK's messages.
func describeValue(v []byte) string {
	if len(v) != valueSize {
		return fmt.Sprintf("%d bytes", len(v))
	}
	var out []netip.Prefix
	for _, f := range sourceFamilies {
		for i := range int(v[f.count]) {
			off := f.base + 2*f.size*i
			a, _ := netip.AddrFromSlice(v[off : off+f.size])
			ones, _ := net.IPMask(v[off+f.size : off+2*f.size]).Size()
			out = append(out, netip.PrefixFrom(a, ones))
		}
	}
	s := fmt.Sprint(out)
	if binary.LittleEndian.Uint32(v[valFlags:])&flagMAC != 0 {
		s += " mac " + net.HardwareAddr(v[valMAC:valMAC+6]).String()
	}
	return s
}

// progLicense is the license the program declares to the kernel: its code
// (this file) is Apache-2.0 or GPL-2.0, and bpf_fib_lookup is GPL-only.
const progLicense = "GPL"

// The forwarding fast path. A packet that passed the checks is looked up
// in the kernel's FIB as the kernel's own input path would (the rules with
// the interface as iif, so the attachment's routing domain), and, when the
// answer is a unicast route to forward through, sent from here to the
// route's device and next hop, its TTL or hop limit decremented; the
// neighbour subsystem writes the Ethernet header. That skips the kernel's
// IP input and forwarding for the packets the classifier has just read,
// which pays for the classifier (see docs/security.md, Performance).
// Whatever the kernel would not simply forward (local, broadcast,
// multicast and unreachable destinations, a packet over the route's MTU,
// IP options, fragments, a last hop, an unresolved neighbour, extension
// headers, link-local addresses, ICMPv6 but echo) goes on to the kernel
// unchanged.
//
// bpf_fib_lookup's parameters (struct bpf_fib_lookup, 64 bytes) are on
// the stack at fibAt, bpf_redirect_neigh's next hop (struct
// bpf_redir_neigh, 20 bytes) at nhAt.
const (
	fibAt      = -168
	nhAt       = -192
	tmpAt      = keyAt
	fibFamily  = 0
	fibL4      = 1
	fibSport   = 2
	fibDport   = 4
	fibTotLen  = 6
	fibIfindex = 8
	fibTOS     = 12 // IPv6: the flow information
	fibSrc     = 16
	fibDst     = 32 // after a successful lookup: the next hop
	fibLen     = 64
	nhLen      = 20
	afInet     = 2
	afInet6    = 10
	ip6Dst     = ip6Src + 16
	// IPv4's more-fragments flag and fragment offset.
	le16FragMF4 = 0xff3f
	// The IPv6 header's first word but the version: traffic class and
	// flow label, which the kernel's route lookup takes.
	le32FlowInfo = ^0xf0
)

func fib(off int16) int16 { return fibAt + off }

// fibStart zeroes the parameters and fills in what both families share:
// family, L4 protocol (R3), ingress interface and the packet's length
// (R4), which makes the lookup check the route's MTU. A GSO packet's
// length is left 0: the kernel then checks it by its segments against
// the route's device, as its forwarding does.
func (e *emitter) fibStart(family int64) {
	notGSO := e.label("gso")
	e.emit(
		asm.LoadMem(asm.R2, rCtx, skbGSOSize, asm.Word),
		asm.JEq.Imm(asm.R2, 0, notGSO),
		asm.Mov.Imm(asm.R4, 0),
	)
	e.at(notGSO)
	e.emit(asm.Mov.Imm(asm.R2, 0))
	for off := int16(0); off < fibLen; off += 8 {
		e.emit(asm.StoreMem(asm.RFP, fib(off), asm.R2, asm.DWord))
	}
	e.emit(
		asm.StoreImm(asm.RFP, fib(fibFamily), family, asm.Byte),
		asm.StoreMem(asm.RFP, fib(fibL4), asm.R3, asm.Byte),
		asm.StoreMem(asm.RFP, fib(fibTotLen), asm.R4, asm.Half),
		asm.LoadMem(asm.R2, rCtx, skbIfindex, asm.Word),
		asm.StoreMem(asm.RFP, fib(fibIfindex), asm.R2, asm.Word),
	)
}

// fibPorts copies the TCP or UDP ports at the stack offset at when the
// protocol in R3 has them and the frame is long enough to hold them
// (end bytes), so that rules on ports match as in the kernel's lookup.
func (e *emitter) fibPorts(at int16, end int32) {
	skip := e.label("ports")
	e.emit(
		asm.JLT.Imm(rLen, end, skip),
		asm.JEq.Imm(asm.R3, 6, skip+"_copy"),
		asm.JNE.Imm(asm.R3, 17, skip),
	)
	e.at(skip + "_copy")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, at, asm.Half),
		asm.StoreMem(asm.RFP, fib(fibSport), asm.R2, asm.Half),
		asm.LoadMem(asm.R2, asm.RFP, at+2, asm.Half),
		asm.StoreMem(asm.RFP, fib(fibDport), asm.R2, asm.Half),
	)
	e.at(skip)
}

// fibIPv4 fills the lookup's parameters for the IPv4 header (without
// options) at the stack offset hdr (4-byte aligned), its ports after it
// when the frame is end bytes long; R3 and R4 as fibStart takes them.
func (e *emitter) fibIPv4(hdr int16, end int32) {
	e.fibStart(afInet)
	e.fibPorts(hdr+20, end)
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, hdr+1, asm.Byte),
		asm.StoreMem(asm.RFP, fib(fibTOS), asm.R2, asm.Byte),
		asm.LoadMem(asm.R2, asm.RFP, hdr+12, asm.Word),
		asm.StoreMem(asm.RFP, fib(fibSrc), asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, hdr+16, asm.Word),
		asm.StoreMem(asm.RFP, fib(fibDst), asm.R2, asm.Word),
	)
}

// fibLookup looks the route up and jumps to fail for anything but a
// route to forward through (BPF_FIB_LKUP_RET_SUCCESS).
func (e *emitter) fibLookup(fail string) {
	e.emit(
		asm.Mov.Reg(asm.R1, rCtx),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fibAt),
		asm.Mov.Imm(asm.R3, fibLen),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnFibLookup.Call(),
		asm.JNE.Imm(asm.R0, 0, fail),
	)
}

// redirect sends the packet to the route's device and next hop; the
// neighbour subsystem resolves it and writes the Ethernet header.
func (e *emitter) redirect() {
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, fib(fibFamily), asm.Byte),
		asm.StoreMem(asm.RFP, nhAt, asm.R2, asm.Word),
	)
	// The next hop's address, IPv4 or IPv6 (an IPv4 route may have an
	// IPv6 next hop): 16 bytes from fibDst to nhAt+4.
	for off := int16(0); off < 16; off += 4 {
		e.emit(
			asm.LoadMem(asm.R2, asm.RFP, fib(fibDst)+off, asm.Word),
			asm.StoreMem(asm.RFP, nhAt+4+off, asm.R2, asm.Word),
		)
	}
	e.emit(
		asm.LoadMem(asm.R1, asm.RFP, fib(fibIfindex), asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, nhAt),
		asm.Mov.Imm(asm.R3, nhLen),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnRedirectNeigh.Call(),
		asm.Return(),
	)
}

// ip4HeaderValid jumps to fail unless the 20-byte IPv4 header at the
// stack offset at (4-byte aligned) has a valid checksum: the kernel's IP
// input drops the others. The one's complement sum of the header's
// 16-bit words, checksum included, is 0xffff in either byte order, so
// the words are summed as loaded. Uses R2 to R4.
func (e *emitter) ip4HeaderValid(at int16, fail string) {
	e.emit(asm.Mov.Imm(asm.R2, 0))
	for off := int16(0); off < 20; off += 4 {
		e.emit(
			asm.LoadMem(asm.R3, asm.RFP, at+off, asm.Word),
			asm.Add.Reg(asm.R2, asm.R3),
		)
	}
	// Fold the 35-bit sum to 32 bits, then to 16 twice.
	e.emit(
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.RSh.Imm(asm.R4, 32),
		asm.LSh.Imm(asm.R2, 32),
		asm.RSh.Imm(asm.R2, 32),
		asm.Add.Reg(asm.R2, asm.R4),
	)
	for range 2 {
		e.emit(
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.RSh.Imm(asm.R4, 16),
			asm.And.Imm(asm.R2, 0xffff),
			asm.Add.Reg(asm.R2, asm.R4),
		)
	}
	e.emit(asm.JNE.Imm(asm.R2, 0xffff, fail))
}

// forward4 is the IPv4 fast path; R8 holds the header's length.
func (e *emitter) forward4() {
	e.at("fwd4")
	e.emit(asm.JNE.Imm(asm.R8, 20, "pass"))
	e.ip4HeaderValid(b(ipStart), "pass")
	e.emit(
		asm.LoadMem(asm.R2, rCtx, skbPktType, asm.Word),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip4Frag), asm.Half),
		asm.And.Imm(asm.R2, le16FragMF4),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart+8), asm.Byte),
		asm.JLE.Imm(asm.R2, 1, "pass"),
		asm.LoadMem(asm.R3, asm.RFP, b(ip4Proto), asm.Byte),
		asm.LoadMem(asm.R4, asm.RFP, b(ipStart+2), asm.Half),
		asm.HostTo(asm.BE, asm.R4, asm.Half),
	)
	e.fibIPv4(b(ipStart), ipStart+24)
	e.fibLookup("pass")
	e.decrementTTL4(b(ipStart + 8))
	e.redirect()
}

// decrementTTL4 decrements the TTL of the frame's IPv4 header, whose
// TTL and protocol word is at the stack offset word. The two are one
// 16-bit word, the TTL its low byte as loaded here; the header checksum
// is updated for the word's change.
func (e *emitter) decrementTTL4(word int16) {
	e.emit(
		asm.LoadMem(asm.R3, asm.RFP, word, asm.Half),
		asm.Mov.Reg(asm.R4, asm.R3),
		asm.Sub.Imm(asm.R4, 1),
		asm.StoreMem(asm.RFP, tmpAt, asm.R4, asm.Half),
		asm.Mov.Reg(asm.R1, rCtx),
		asm.Mov.Imm(asm.R2, ipStart+10),
		asm.Mov.Imm(asm.R5, 2),
		asm.FnL3CsumReplace.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop"),
	)
	e.storeBytes(ipStart+8, tmpAt, 2)
}

// storeBytes writes the n bytes at the stack offset at into the frame at
// off, and drops the packet when that fails.
func (e *emitter) storeBytes(off, at, n int32) {
	e.emit(
		asm.Mov.Reg(asm.R1, rCtx),
		asm.Mov.Imm(asm.R2, off),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, at),
		asm.Mov.Imm(asm.R4, n),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop"),
	)
}

// forward6 is the IPv6 fast path: TCP, UDP and ICMPv6 echo without
// extension headers, between addresses that are not link-local, to one
// that is not multicast.
func (e *emitter) forward6() {
	e.at("fwd6")
	e.emit(
		asm.LoadMem(asm.R2, rCtx, skbPktType, asm.Word),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart+7), asm.Byte),
		asm.JLE.Imm(asm.R2, 1, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6Dst), asm.Byte),
		asm.JEq.Imm(asm.R2, 0xff, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6Dst), asm.Half),
		asm.And.Imm(asm.R2, le16LLMask),
		asm.JEq.Imm(asm.R2, le16LL, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6Src), asm.Half),
		asm.And.Imm(asm.R2, le16LLMask),
		asm.JEq.Imm(asm.R2, le16LL, "pass"),
		asm.LoadMem(asm.R3, asm.RFP, b(ip6Next), asm.Byte),
		asm.JEq.Imm(asm.R3, 6, "fwd6_ok"),
		asm.JEq.Imm(asm.R3, 17, "fwd6_ok"),
		asm.JNE.Imm(asm.R3, 58, "pass"),
		asm.JLT.Imm(rLen, ip6L4+4, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip6L4), asm.Byte),
		asm.JEq.Imm(asm.R2, icmp6EchoRequest, "fwd6_ok"),
		asm.JNE.Imm(asm.R2, icmp6EchoReply, "pass"),
	)
	e.at("fwd6_ok")
	e.emit(
		asm.LoadMem(asm.R4, asm.RFP, b(ip6PayLen), asm.Half),
		asm.HostTo(asm.BE, asm.R4, asm.Half),
		asm.Add.Imm(asm.R4, 40),
	)
	e.fibStart(afInet6)
	e.fibPorts(b(ip6L4), ip6L4+4)
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart), asm.Word),
		asm.And.Imm(asm.R2, le32FlowInfo),
		asm.StoreMem(asm.RFP, fib(fibTOS), asm.R2, asm.Word),
	)
	for off := int16(0); off < 32; off += 8 {
		e.emit(
			asm.LoadMem(asm.R2, asm.RFP, b(ip6Src)+off, asm.DWord),
			asm.StoreMem(asm.RFP, fib(fibSrc)+off, asm.R2, asm.DWord),
		)
	}
	e.fibLookup("pass")
	// IPv6 has no header checksum.
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart+7), asm.Byte),
		asm.Sub.Imm(asm.R2, 1),
		asm.StoreMem(asm.RFP, tmpAt, asm.R2, asm.Byte),
	)
	e.storeBytes(ipStart+7, tmpAt, 1)
	e.redirect()
}
