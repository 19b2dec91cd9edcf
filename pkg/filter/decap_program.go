// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

package filter

import "github.com/cilium/ebpf/asm"

// The decapsulation fast path: a tc program on the ingress of the
// underlay interface that takes the VXLAN packets the kernel's path would
// accept and the nftables vxlan chain let in (IPv4, a valid header, from
// a VTEP in galactic's VTEP set, to the local address of one of
// galactic-router's VXLAN devices with that device's VNI, no UDP
// checksum) and removes the outer headers. The inner packet it then
// forwards itself when the kernel would only forward it (decapForward),
// or hands to the device's ingress, where the kernel takes it as arriving
// on the device: the VPC's rules, the nftables input chain for what is
// addressed to the node. Either way the node's IP input, netfilter input
// hook, UDP and VXLAN receive are skipped for the outer packet. Anything
// else goes on to the kernel unchanged and meets the nftables rules:
// other VTEPs and VNIs, GSO packets, outer ECN marks, IP options,
// fragments, UDP checksums (the kernel verifies them), VXLAN flags other
// than the VNI's, and an inner source MAC that is the device's own (the
// kernel drops those as loops).
//
// The VNI map's value, by VNI (its three bytes and a zero, as the VXLAN
// header carries them):
//
//	0   u32 the device's ifindex
//	4   the device's local IPv4 address
//	8   the device's MAC
//
// The VTEP map is keyed by IPv4 address.
const (
	decapValIndex = 0
	decapValLocal = 4
	decapValMAC   = 8
	decapValSize  = 16
)

// Offsets in a VXLAN frame over IPv4 without options.
const (
	outerTOS   = ipStart + 1
	outerLen   = ipStart + 2
	outerDst   = ip4Src + 4
	udpStart   = ipStart + 20
	udpDport   = udpStart + 2
	udpLen     = udpStart + 4
	udpCsum    = udpStart + 6
	vxStart    = udpStart + 8
	vxVNI      = vxStart + 4
	innerStart = vxStart + 8
	innerSrc   = innerStart + ethSrc
	// What the program reads: the outer headers and the inner Ethernet
	// header, all of which but the outer Ethernet header it removes.
	decapHeader = innerStart + 14
	// Port 4789 and the VXLAN flags word with only the VNI flag, as a
	// little-endian load reads them.
	le16VXLANPort = 0xb512
	le32VXLANVNI  = 0x08
	adjRoomMAC    = 1
	bpfFIngress   = 1
)

// decapProgram is the decapsulation program; vnis and vteps are its maps'
// fds.
func decapProgram(vnis, vteps int) asm.Instructions {
	e := &emitter{}
	e.emit(
		asm.Mov.Reg(rCtx, asm.R1),
		asm.LoadMem(rLen, rCtx, skbLen, asm.Word),
		asm.JLT.Imm(rLen, decapHeader, "pass"),
		asm.LoadMem(asm.R2, rCtx, skbGSOSize, asm.Word),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		// Addressed to this host's MAC, or IP input would drop it.
		asm.LoadMem(asm.R2, rCtx, skbPktType, asm.Word),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.Mov.Imm(asm.R4, decapHeader),
	)
	e.loadBytes(0, bufAt, "pass")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ethType), asm.Half),
		asm.JNE.Imm(asm.R2, le16IPv4, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ipStart), asm.Byte),
		asm.JNE.Imm(asm.R2, 0x45, "pass"),
	)
	e.ip4HeaderValid(b(ipStart), "pass")
	e.emit(
		// An outer ECN mark is the kernel's to carry to the inner header.
		asm.LoadMem(asm.R2, asm.RFP, b(outerTOS), asm.Byte),
		asm.And.Imm(asm.R2, 3),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip4Frag), asm.Half),
		asm.And.Imm(asm.R2, le16FragMF4),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(ip4Proto), asm.Byte),
		asm.JNE.Imm(asm.R2, 17, "pass"),
		// The whole frame is the packet and the datagram the rest of it:
		// no padding, nothing cut.
		asm.LoadMem(asm.R2, asm.RFP, b(outerLen), asm.Half),
		asm.HostTo(asm.BE, asm.R2, asm.Half),
		asm.Mov.Reg(asm.R3, rLen),
		asm.Sub.Imm(asm.R3, ipStart),
		asm.JNE.Reg(asm.R2, asm.R3, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(udpLen), asm.Half),
		asm.HostTo(asm.BE, asm.R2, asm.Half),
		asm.Sub.Imm(asm.R3, 20),
		asm.JNE.Reg(asm.R2, asm.R3, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(udpDport), asm.Half),
		asm.JNE.Imm(asm.R2, le16VXLANPort, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(udpCsum), asm.Half),
		asm.JNE.Imm(asm.R2, 0, "pass"),
		asm.LoadMem(asm.R2, asm.RFP, b(vxStart), asm.Word),
		asm.JNE.Imm(asm.R2, le32VXLANVNI, "pass"),
		// The VNI word's last byte is reserved: zero.
		asm.LoadMem(asm.R2, asm.RFP, b(vxVNI), asm.Word),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.RSh.Imm(asm.R3, 24),
		asm.JNE.Imm(asm.R3, 0, "pass"),
		asm.StoreMem(asm.RFP, keyAt, asm.R2, asm.Word),
	)
	e.lookup(vnis, "pass")
	e.emit(
		asm.Mov.Reg(rVal, asm.R0),
		asm.LoadMem(asm.R2, asm.RFP, b(outerDst), asm.Word),
		asm.LoadMem(asm.R3, rVal, decapValLocal, asm.Word),
		asm.JNE.Reg(asm.R2, asm.R3, "pass"),
	)
	e.compareMAC(b(innerSrc), decapValMAC, "vtep")
	e.emit(asm.Ja.Label("pass"))
	e.at("vtep")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, b(ip4Src), asm.Word),
		asm.StoreMem(asm.RFP, keyAt, asm.R2, asm.Word),
	)
	e.lookup(vteps, "pass")
	e.emit(
		asm.LoadMem(asm.R8, rVal, decapValIndex, asm.Word),
	)
	e.decapForward()
	e.at("ingress")
	e.pop()
	// The inner Ethernet header over the outer one.
	e.storeBytes(0, int32(b(innerStart)), 14)
	e.emit(
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.Mov.Imm(asm.R2, bpfFIngress),
		asm.FnRedirect.Call(),
		asm.Return(),
	)
	e.exits()
	return e.insns
}

// pop removes the outer IPv4, UDP and VXLAN headers and the inner
// Ethernet header, leaving the outer Ethernet header before the inner
// packet. Nothing is changed when it fails: the kernel takes the packet.
func (e *emitter) pop() {
	e.emit(
		asm.Mov.Reg(asm.R1, rCtx),
		asm.Mov.Imm(asm.R2, ipStart-decapHeader),
		asm.Mov.Imm(asm.R3, adjRoomMAC),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkbAdjustRoom.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"),
	)
}

// The inner IPv4 header and the four bytes after it (ports) are copied
// to the stack at innerAt, 8-byte aligned: in the frame they sit 50 bytes
// after the outer one, so one copy cannot align both.
const (
	innerAt  = -224
	innerLen = 24
)

// decapForward forwards the inner packet from here when the kernel, taking
// it on the device, would only forward it: IPv4 without options, not
// fragmented, to the device's MAC, with a TTL above 1, a source that is
// no martian, and a unicast route through the node in the device's
// domain (bpf_fib_lookup with the device as input interface, as the
// classifier's fast path does with the workload's). Anything else goes
// to the device's ingress (label ingress). R8 holds the device's index.
func (e *emitter) decapForward() {
	e.emit(
		asm.JLT.Imm(rLen, decapHeader+innerLen, "ingress"),
		asm.LoadMem(asm.R2, asm.RFP, b(innerStart+ethType), asm.Half),
		asm.JNE.Imm(asm.R2, le16IPv4, "ingress"),
	)
	e.compareMAC(b(innerStart), decapValMAC, "ingress")
	e.emit(asm.Mov.Imm(asm.R4, innerLen))
	e.loadBytes(decapHeader, innerAt, "ingress")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, innerAt, asm.Byte),
		asm.JNE.Imm(asm.R2, 0x45, "ingress"),
	)
	e.ip4HeaderValid(innerAt, "ingress")
	e.emit(
		asm.LoadMem(asm.R2, asm.RFP, innerAt+6, asm.Half),
		asm.And.Imm(asm.R2, le16FragMF4),
		asm.JNE.Imm(asm.R2, 0, "ingress"),
		asm.LoadMem(asm.R2, asm.RFP, innerAt+8, asm.Byte),
		asm.JLE.Imm(asm.R2, 1, "ingress"),
		// Martian sources (0/8, 127/8, multicast, reserved, broadcast)
		// are the kernel's to drop.
		asm.LoadMem(asm.R2, asm.RFP, innerAt+12, asm.Byte),
		asm.JEq.Imm(asm.R2, 0, "ingress"),
		asm.JEq.Imm(asm.R2, 127, "ingress"),
		asm.JGE.Imm(asm.R2, 224, "ingress"),
		asm.LoadMem(asm.R4, asm.RFP, innerAt+2, asm.Half),
		asm.HostTo(asm.BE, asm.R4, asm.Half),
		asm.Mov.Reg(asm.R2, rLen),
		asm.Sub.Imm(asm.R2, decapHeader),
		asm.JNE.Reg(asm.R4, asm.R2, "ingress"),
		asm.LoadMem(asm.R3, asm.RFP, innerAt+9, asm.Byte),
	)
	e.fibIPv4(innerAt, decapHeader+innerLen)
	// Looked up as arriving on the device, not on the underlay.
	e.emit(asm.StoreMem(asm.RFP, fib(fibIfindex), asm.R8, asm.Word))
	e.fibLookup("ingress")
	e.pop()
	e.decrementTTL4(innerAt + 8)
	e.redirect()
}
