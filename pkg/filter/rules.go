package filter

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is galactic's table, in the inet family.
const TableName = "galactic"

// VXLANPort is the only VXLAN port galactic uses.
const VXLANPort = 4789

// Interface name prefixes the rules match: workload host interfaces (tap,
// veth), VPC VXLAN devices and VRF devices (pkg/names, pkg/routing).
const (
	tapPrefix   = "gt"
	vethPrefix  = "gv"
	vxlanPrefix = "gx"
	vrfPrefix   = "gr"
	// galacticPrefix begins all four, so one comparison sends the
	// underlay's packets past the rules of galactic's interfaces.
	galacticPrefix = "g"
)

// Set names.
const (
	setSrc4  = "workload_src4"
	setSrc6  = "workload_src6"
	setNet4  = "workload_net4"
	setNet6  = "workload_net6"
	setGw4   = "workload_gw4"
	setGw6   = "workload_gw6"
	setMAC   = "workload_mac"
	setVTEP4 = "vtep4"
	setVTEP6 = "vtep6"
	// The arp table's: ARP never reaches the inet family's hooks, and a
	// rule can look up only its own table's sets.
	setARPSrc = "arp_src4"
	setARPNet = "arp_net4"
	setARPMAC = "arp_mac"
)

// metaSDIFNAME is NFT_META_SDIFNAME: the enslaved device a packet arrived
// on when its iif is a VRF; x/sys does not name it.
const metaSDIFNAME expr.MetaKey = 34

// Registers: a 16-byte interface name fills NFT_REG_1 (the 32-bit
// registers 0..3), so the second field of a concatenation starts at the
// 32-bit register 4.
const (
	reg1     = 1
	regField = unix.NFT_REG32_04
)

// ICMP and ICMPv6 types the rules name.
const (
	icmpEchoReply     = 0
	icmpEchoRequest   = 8
	icmpRedirect      = 5
	icmp6EchoRequest  = 128
	icmp6EchoReply    = 129
	icmp6RouterAdvert = 134
	icmp6NeighSolicit = 135
	icmp6NeighAdvert  = 136
	icmp6Redirect     = 137
)

var (
	table    = &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	arpTable = &nftables.Table{Name: TableName, Family: nftables.TableFamilyARP}
	tables   = []*nftables.Table{table, arpTable}
)

// nfArpIn is NF_ARP_IN, the arp family's input hook (google/nftables
// names only the inet hooks, whose input is another number).
var nfArpIn = nftables.ChainHookRef(0)

func concat(t ...nftables.SetDatatype) nftables.SetDatatype { return nftables.MustConcatSetType(t...) }

// sets are the table's sets; their elements are the node's state.
func sets() map[string]*nftables.Set {
	in := func(t *nftables.Table) func(string, nftables.SetDatatype, bool) *nftables.Set {
		return func(name string, key nftables.SetDatatype, interval bool) *nftables.Set {
			return &nftables.Set{Table: t, Name: name, KeyType: key, Interval: interval, HasTimeout: true, Concatenation: len(nftables.ConcatSetTypeElements(key)) > 1}
		}
	}
	mk, arp := in(table), in(arpTable)
	return map[string]*nftables.Set{
		setSrc4:   mk(setSrc4, concat(nftables.TypeIFName, nftables.TypeIPAddr), false),
		setSrc6:   mk(setSrc6, concat(nftables.TypeIFName, nftables.TypeIP6Addr), false),
		setNet4:   mk(setNet4, concat(nftables.TypeIFName, nftables.TypeIPAddr), true),
		setNet6:   mk(setNet6, concat(nftables.TypeIFName, nftables.TypeIP6Addr), true),
		setGw4:    mk(setGw4, concat(nftables.TypeIFName, nftables.TypeIPAddr), false),
		setGw6:    mk(setGw6, concat(nftables.TypeIFName, nftables.TypeIP6Addr), false),
		setMAC:    mk(setMAC, concat(nftables.TypeIFName, nftables.TypeEtherAddr), false),
		setVTEP4:  {Table: table, Name: setVTEP4, KeyType: nftables.TypeIPAddr},
		setVTEP6:  {Table: table, Name: setVTEP6, KeyType: nftables.TypeIP6Addr},
		setARPSrc: arp(setARPSrc, concat(nftables.TypeIFName, nftables.TypeIPAddr), false),
		setARPNet: arp(setARPNet, concat(nftables.TypeIFName, nftables.TypeIPAddr), true),
		setARPMAC: arp(setARPMAC, concat(nftables.TypeIFName, nftables.TypeEtherAddr), false),
	}
}

// setOrder is the order sets are created in.
var setOrder = []string{setSrc4, setSrc6, setNet4, setNet6, setGw4, setGw6, setMAC, setVTEP4, setVTEP6, setARPSrc, setARPNet, setARPMAC}

// chainSpec is one chain and its rules, each rule a list of expressions.
type chainSpec struct {
	chain *nftables.Chain
	rules [][]expr.Any
}

// anonSet is a constant anonymous set of one rule: its lookup carries a
// placeholder name until build creates the set in the rule's batch and
// points the lookup at it.
type anonSet struct {
	key   nftables.SetDatatype
	elems []nftables.SetElement
}

func (a anonSet) set() *nftables.Set {
	return &nftables.Set{Table: table, Anonymous: true, Constant: true, KeyType: a.key, Concatenation: len(nftables.ConcatSetTypeElements(a.key)) > 1}
}

// anonWorkloadDeny is the placeholder of the anonymous set of what a
// workload may not send even from its own address: DHCP server replies
// (UDP from port 67 or 547) and ICMP redirects (type 5, every code).
const anonWorkloadDeny = "@workload_deny"

// protoAndFirstTwo is a key of the deny set: the layer 4 protocol and the
// transport header's first two bytes (a UDP source port, an ICMP type
// and code), each padded to a register.
func protoAndFirstTwo(proto byte, v uint16) nftables.SetElement {
	b := binaryutil.BigEndian.PutUint16(v)
	return nftables.SetElement{Key: []byte{proto, 0, 0, 0, b[0], b[1], 0, 0}}
}

func workloadDeny() []nftables.SetElement {
	out := []nftables.SetElement{protoAndFirstTwo(unix.IPPROTO_UDP, 67), protoAndFirstTwo(unix.IPPROTO_UDP, 547)}
	// Codes are listed one by one: a hash set is one lookup where an
	// interval would be a slower set type on every forwarded packet.
	for code := range 256 {
		out = append(out, protoAndFirstTwo(unix.IPPROTO_ICMP, icmpRedirect<<8|uint16(code)))
	}
	return out
}

var anonymous = map[string]anonSet{
	anonWorkloadDeny: {key: concat(nftables.TypeInetProto, nftables.TypeInetService), elems: workloadDeny()},
}

func ref(p nftables.ChainPriority) *nftables.ChainPriority { return &p }

func baseChain(name string, hook *nftables.ChainHook, prio nftables.ChainPriority) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: name, Table: table, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: ref(prio), Policy: &accept}
}

func regularChain(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: table} }

func inARP(c *nftables.Chain) *nftables.Chain { c.Table = arpTable; return c }

// Expression helpers. Each returns the expressions of one match.

func metaCmp(key expr.MetaKey, data []byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: data}}
}

// namePrefix matches an interface name starting with prefix (`"gv*"`).
func namePrefix(key expr.MetaKey, prefix string) []expr.Any { return metaCmp(key, []byte(prefix)) }

// notNamePrefix matches an interface name not starting with prefix.
func notNamePrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: reg1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte(prefix)}}
}

// workloadIf matches a workload host interface, tap or veth, in one
// comparison: "gt" and "gv" differ only in the bit 0x02 of their second
// byte.
func workloadIf(key expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 2, Mask: []byte{0xff, 0xfd}, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte(tapPrefix)},
	}
}

func nfproto(p byte) []expr.Any { return metaCmp(expr.MetaKeyNFPROTO, []byte{p}) }

func l4proto(p byte) []expr.Any { return metaCmp(expr.MetaKeyL4PROTO, []byte{p}) }

func transportByte(offset uint32, v byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{v}},
	}
}

// icmpType matches ICMP (v6: ICMPv6) of one type.
func icmpType(v6 bool, typ byte) []expr.Any {
	proto := byte(unix.IPPROTO_ICMP)
	if v6 {
		proto = unix.IPPROTO_ICMPV6
	}
	return join(l4proto(proto), transportByte(0, typ))
}

// udpPort matches UDP to (dst) or from port.
func udpPort(dst bool, port uint16) []expr.Any {
	off := uint32(0)
	if dst {
		off = 2
	}
	return join(l4proto(unix.IPPROTO_UDP), []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(port)},
	})
}

// addrField is the network-header offset and length of an address.
func addrField(v6, dst bool) (uint32, uint32) {
	switch {
	case v6 && dst:
		return 24, 16
	case v6:
		return 8, 16
	case dst:
		return 16, 4
	}
	return 12, 4
}

func family(v6 bool) byte {
	if v6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// ifAddrIn matches `<key> . <saddr|daddr> @set`.
func ifAddrIn(key expr.MetaKey, v6, dst bool, set string) []expr.Any {
	off, n := addrField(v6, dst)
	return join(nfproto(family(v6)), []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Payload{DestRegister: regField, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: reg1, SetName: set},
	})
}

// ifFieldIn matches `iifname . <base>[off:off+n] @set`, or its negation.
func ifFieldIn(base expr.PayloadBase, off, n uint32, set string, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Payload{DestRegister: regField, Base: base, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: reg1, SetName: set, Invert: invert},
	}
}

// field compares <base>[off:off+len(v)] with v.
func field(base expr.PayloadBase, off uint32, op expr.CmpOp, v []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: base, Offset: off, Len: uint32(len(v))},
		&expr.Cmp{Op: op, Register: reg1, Data: v},
	}
}

// addrIn matches `saddr @set`.
func addrIn(v6 bool, set string) []expr.Any {
	off, n := addrField(v6, false)
	return join(nfproto(family(v6)), []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: reg1, SetName: set},
	})
}

// macNotIn matches `iifname . ether saddr != @workload_mac`.
func macNotIn() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Payload{DestRegister: regField, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		&expr.Lookup{SourceRegister: reg1, SetName: setMAC, Invert: true},
	}
}

// linkLocalSource6 matches an IPv6 source in fe80::/10.
func linkLocalSource6() []expr.Any {
	return join(nfproto(unix.NFPROTO_IPV6), []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 2},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 2, Mask: []byte{0xff, 0xc0}, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{0xfe, 0x80}},
	})
}

// unspecifiedSource6 matches the IPv6 source ::.
func unspecifiedSource6() []expr.Any {
	return join(nfproto(unix.NFPROTO_IPV6), []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 16)},
	})
}

// tcpNotConnect matches TCP that is not a connection request (SYN
// without ACK): the segments of connections the node opened, without
// conntrack, which would track every forwarded packet too.
func tcpNotConnect() []expr.Any {
	return join(l4proto(unix.IPPROTO_TCP), []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0x02}},
	})
}

// fromNodesConnections accepts what answers the node's own connections
// and pings: TCP other than a connection request, echo replies.
func fromNodesConnections() [][]expr.Any {
	return [][]expr.Any{
		rule(tcpNotConnect(), accept),
		rule(icmpType(false, icmpEchoReply), accept),
		rule(icmpType(true, icmp6EchoReply), accept),
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func rule(parts ...any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case []expr.Any:
			out = append(out, v...)
		case expr.Any:
			out = append(out, v)
		}
	}
	return out
}

var (
	accept = verdict(expr.VerdictAccept)
	drop   = verdict(expr.VerdictDrop)
)

// toNode is the chain for what a workload sends to the node itself. key
// names the workload interface: iifname, or sdifname behind a VRF.
func toNode(name string, key expr.MetaKey) chainSpec {
	rules := [][]expr.Any{
		rule(icmpType(true, icmp6NeighSolicit), accept),
		rule(icmpType(true, icmp6NeighAdvert), accept),
		rule(ifAddrIn(key, false, true, setGw4), icmpType(false, icmpEchoRequest), accept),
		rule(ifAddrIn(key, true, true, setGw6), icmpType(true, icmp6EchoRequest), accept),
	}
	rules = append(rules, fromNodesConnections()...)
	return chainSpec{chain: regularChain(name), rules: append(rules, rule(drop))}
}

// Offsets in an ARP header (Ethernet/IPv4) and in an ICMPv6 neighbour
// solicitation or advertisement.
const (
	arpFormat   = 2  // htype's end: ptype, hlen, plen
	arpSHA      = 8  // sender hardware address
	arpSPA      = 14 // sender protocol address
	ndTarget    = 8  // target address of an NS or NA
	ndOption    = 24 // the first option: type, length, link-layer address
	ndOptionMAC = 26
	ip6PayLen   = 4 // IPv6 payload length in the network header
)

// arpChains bind what a workload claims in ARP: the sender address must be
// one of the attachment's IPv4 sources (or 0.0.0.0, a probe), and a
// veth's sender hardware address its container end's MAC.
func arpChains() []chainSpec {
	workload := chainSpec{chain: inARP(regularChain("arp_workload")), rules: [][]expr.Any{
		// Ethernet and IPv4 only, so the offsets below are the fields.
		rule(field(expr.PayloadBaseNetworkHeader, arpFormat, expr.CmpOpNeq, []byte{0x08, 0x00, 6, 4}), drop),
		rule(namePrefix(expr.MetaKeyIIFNAME, vethPrefix), ifFieldIn(expr.PayloadBaseNetworkHeader, arpSHA, 6, setARPMAC, true), drop),
		rule(field(expr.PayloadBaseNetworkHeader, arpSPA, expr.CmpOpEq, make([]byte, 4)), accept),
		rule(ifFieldIn(expr.PayloadBaseNetworkHeader, arpSPA, 4, setARPSrc, false), accept),
		rule(ifFieldIn(expr.PayloadBaseNetworkHeader, arpSPA, 4, setARPNet, false), accept),
		rule(drop),
	}}
	input := chainSpec{chain: inARP(baseChain("arp_input", nfArpIn, nftables.ChainPriority(0))), rules: [][]expr.Any{
		rule(namePrefix(expr.MetaKeyIIFNAME, tapPrefix), jump("arp_workload")),
		rule(namePrefix(expr.MetaKeyIIFNAME, vethPrefix), jump("arp_workload")),
	}}
	return []chainSpec{workload, input}
}

// chains is the whole ruleset, in the order it is created.
func chains() []chainSpec {
	// An advertisement may name as its target only an address the
	// attachment may send from, or a link-local one.
	ndTargetChain := chainSpec{chain: regularChain("nd_target"), rules: [][]expr.Any{
		rule(field(expr.PayloadBaseTransportHeader, ndTarget, expr.CmpOpEq, []byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0}), verdict(expr.VerdictReturn)),
		rule(ifFieldIn(expr.PayloadBaseTransportHeader, ndTarget, 16, setSrc6, false), verdict(expr.VerdictReturn)),
		rule(ifFieldIn(expr.PayloadBaseTransportHeader, ndTarget, 16, setNet6, false), verdict(expr.VerdictReturn)),
		rule(drop),
	}}
	// A veth's solicitation or advertisement carries no option or one
	// link-layer address option, and that is the container end's MAC.
	ndLLAddr := chainSpec{chain: regularChain("nd_lladdr"), rules: [][]expr.Any{
		rule(field(expr.PayloadBaseNetworkHeader, ip6PayLen, expr.CmpOpEq, []byte{0, ndOption}), verdict(expr.VerdictReturn)),
		rule(field(expr.PayloadBaseNetworkHeader, ip6PayLen, expr.CmpOpNeq, []byte{0, ndOption + 8}), drop),
		rule(field(expr.PayloadBaseTransportHeader, ndOption, expr.CmpOpEq, []byte{1, 1}), ifFieldIn(expr.PayloadBaseTransportHeader, ndOptionMAC, 6, setMAC, false), verdict(expr.VerdictReturn)),
		rule(field(expr.PayloadBaseTransportHeader, ndOption, expr.CmpOpEq, []byte{2, 1}), ifFieldIn(expr.PayloadBaseTransportHeader, ndOptionMAC, 6, setMAC, false), verdict(expr.VerdictReturn)),
		rule(drop),
	}}
	// ICMPv6 from a workload: what claims a router's or a neighbour's role
	// is checked here; whatever returns goes on to the source check.
	// Routers' messages are matched here by type, whatever their code,
	// which the deny set would need an element for each of.
	workloadICMP6 := chainSpec{chain: regularChain("workload_icmp6"), rules: [][]expr.Any{
		rule(icmpType(true, icmp6RouterAdvert), drop),
		rule(icmpType(true, icmp6Redirect), drop),
		// DAD: a solicitation from :: announces nothing.
		rule(unspecifiedSource6(), accept),
		rule(icmpType(true, icmp6NeighAdvert), jump("nd_target")),
		rule(namePrefix(expr.MetaKeyIIFNAME, vethPrefix), icmpType(true, icmp6NeighSolicit), jump("nd_lladdr")),
		rule(namePrefix(expr.MetaKeyIIFNAME, vethPrefix), icmpType(true, icmp6NeighAdvert), jump("nd_lladdr")),
		rule(linkLocalSource6(), accept),
	}}
	// Ordered so that a workload's ordinary packet meets as few rules as
	// possible: each costs every forwarded packet. IPv4 is accepted before
	// the ICMPv6 rule, which no IPv4 packet could match.
	workload := chainSpec{chain: regularChain("workload"), rules: [][]expr.Any{
		rule(namePrefix(expr.MetaKeyIIFNAME, vethPrefix), macNotIn(), drop),
		rule(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Payload{DestRegister: unix.NFT_REG32_01, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
			&expr.Lookup{SourceRegister: reg1, SetName: anonWorkloadDeny}, drop),
		rule(ifAddrIn(expr.MetaKeyIIFNAME, false, false, setSrc4), accept),
		rule(l4proto(unix.IPPROTO_ICMPV6), jump("workload_icmp6")),
		rule(ifAddrIn(expr.MetaKeyIIFNAME, true, false, setSrc6), accept),
		rule(ifAddrIn(expr.MetaKeyIIFNAME, false, false, setNet4), accept),
		rule(ifAddrIn(expr.MetaKeyIIFNAME, true, false, setNet6), accept),
		rule(drop),
	}}
	remoteRules := [][]expr.Any{
		rule(icmpType(false, icmpEchoRequest), accept),
		rule(icmpType(true, icmp6EchoRequest), accept),
		rule(icmpType(true, icmp6NeighSolicit), accept),
		rule(icmpType(true, icmp6NeighAdvert), accept),
	}
	remoteRules = append(remoteRules, fromNodesConnections()...)
	remote := chainSpec{chain: regularChain("from_vxlan"), rules: append(remoteRules, rule(drop))}
	// VXLAN is taken only from a VTEP over the underlay: never from one
	// of galactic's interfaces, whatever the source a workload may use.
	vxlan := chainSpec{chain: regularChain("vxlan"), rules: [][]expr.Any{
		rule(addrIn(false, setVTEP4), notNamePrefix(expr.MetaKeyIIFNAME, galacticPrefix), accept),
		rule(addrIn(true, setVTEP6), notNamePrefix(expr.MetaKeyIIFNAME, galacticPrefix), accept),
		rule(drop),
	}}
	prerouting := chainSpec{chain: baseChain("prerouting", nftables.ChainHookPrerouting, nftables.ChainPriority(-300)), rules: [][]expr.Any{
		rule(workloadIf(expr.MetaKeyIIFNAME), jump("workload")),
	}}
	// Behind a VRF the iif is the VRF device and sdif the member.
	inputVRF := chainSpec{chain: regularChain("input_vrf"), rules: [][]expr.Any{
		rule(namePrefix(metaSDIFNAME, vethPrefix), jump("to_node_vrf")),
		rule(namePrefix(metaSDIFNAME, tapPrefix), jump("to_node_vrf")),
		rule(namePrefix(metaSDIFNAME, vxlanPrefix), jump("from_vxlan")),
	}}
	inputGalactic := chainSpec{chain: regularChain("input_galactic"), rules: [][]expr.Any{
		rule(namePrefix(expr.MetaKeyIIFNAME, vethPrefix), jump("to_node")),
		rule(namePrefix(expr.MetaKeyIIFNAME, tapPrefix), jump("to_node")),
		rule(namePrefix(expr.MetaKeyIIFNAME, vxlanPrefix), jump("from_vxlan")),
		rule(namePrefix(expr.MetaKeyIIFNAME, vrfPrefix), jump("input_vrf")),
	}}
	// VXLAN first: on a node that forwards between nodes, the underlay's
	// VXLAN is most of what arrives.
	input := chainSpec{chain: baseChain("input", nftables.ChainHookInput, nftables.ChainPriority(-10)), rules: [][]expr.Any{
		rule(udpPort(true, VXLANPort), jump("vxlan")),
		rule(namePrefix(expr.MetaKeyIIFNAME, galacticPrefix), jump("input_galactic")),
	}}
	// No forward chain: what reaches a workload from outside its VPC is
	// kept out by routing (see docs/security.md), and a hook costs every
	// forwarded packet.
	// Regular chains first: base chains jump to them.
	return append([]chainSpec{ndTargetChain, ndLLAddr, workloadICMP6, workload, toNode("to_node", expr.MetaKeyIIFNAME),
		toNode("to_node_vrf", metaSDIFNAME), remote, vxlan, inputVRF, inputGalactic, prerouting, input}, arpChains()...)
}
