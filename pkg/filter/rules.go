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

// Offsets in an ARP header (Ethernet/IPv4).
const (
	arpFormat = 2  // htype's end: ptype, hlen, plen
	arpSHA    = 8  // sender hardware address
	arpSPA    = 14 // sender protocol address
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
	// No prerouting or forward chain: what a workload sends is the
	// workload classifier's (classifier.go), what reaches a workload from
	// outside its VPC is kept out by routing (see docs/concepts/security.md), and
	// a hook costs every forwarded packet.
	// Regular chains first: base chains jump to them.
	return append([]chainSpec{toNode("to_node", expr.MetaKeyIIFNAME),
		toNode("to_node_vrf", metaSDIFNAME), remote, vxlan, inputVRF, inputGalactic, input}, arpChains()...)
}
