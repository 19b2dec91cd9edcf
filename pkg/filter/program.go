// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

package filter

import (
	"fmt"

	"github.com/cilium/ebpf/asm"
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
