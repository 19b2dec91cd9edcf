//go:build ignore
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

/* The workload classifier: one tc program per network namespace, attached
 * to the ingress of every workload host interface, that looks the
 * interface's attachment up by ifindex in a hash map and lets through only
 * what the attachment may send. ADD and DEL write and delete one map entry,
 * so nothing is verified per attachment. What passes and is to be routed
 * through the node, the program forwards itself (forward4, forward6).
 * docs/security.md says what it enforces and why. */

#include "kernel.h"
#include "packet.h"

#define MAX_SOURCES 16
/* flags: the frames' source MAC must be the attachment's mac. */
#define FLAG_MAC 1

struct source4 {
	__be32 addr, mask;
};

struct source6 {
	__u64 addr[2], mask[2];
};

/* An attachment: the map's value, as pkg/filter writes it (classifier.go). */
struct attachment {
	__u32 flags;
	__u8 n4, n6;
	__u8 _pad0[2];
	__u8 mac[6];
	__u8 _pad1[2];
	struct source4 v4[MAX_SOURCES];
	struct source6 v6[MAX_SOURCES];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 16);
	__type(key, __u32);
	__type(value, struct attachment);
} attachments SEC(".maps");

#define ICMP_REDIRECT 5
#define ICMPV6_ECHO_REQUEST 128
#define ICMPV6_ECHO_REPLY 129
#define NDISC_ROUTER_ADVERTISEMENT 134
#define NDISC_NEIGHBOUR_SOLICITATION 135
#define NDISC_NEIGHBOUR_ADVERTISEMENT 136
#define NDISC_REDIRECT 137
#define DHCP_SERVER_PORT 67
#define DHCPV6_SERVER_PORT 547
/* An IPv6 fragment header's offset bits. */
#define IP6_OFFSET 0xfff8
/* The payload of a neighbour solicitation or advertisement without
 * options, and with one 8-byte option. */
#define ND_LEN 24
#define ND_OPT_LEN 32

/* The frame's first bytes, copied to the stack: direct packet access would
 * need them in the linear part, and pulling them there costs more than a
 * copy. The Ethernet header starts two bytes into the 8-byte aligned copy,
 * so that the IPv4 header is 4-byte and the IPv6 addresses 8-byte aligned:
 * the verifier takes only aligned stack loads. */
#define L3_COPY 74
struct frame {
	__u8 _pad[2];
	struct ethhdr eth;
	union {
		struct iphdr ip4;
		struct ipv6hdr ip6;
		__u8 l3[L3_COPY];
	};
};
#define FRAME_COPY (ETH_HLEN + L3_COPY)
_Static_assert(__builtin_offsetof(struct frame, ip6.saddr) % 8 == 0, "8-byte aligned IPv6 addresses");

/* Offsets in the copy's l3 after an IPv6 header: the fragment header, and
 * in a neighbour solicitation or advertisement its target, option and the
 * option's link-layer address. */
#define IP6_FRAG IP6_HLEN
#define IP6_FRAG_L4 (IP6_HLEN + 8)
#define ND_TARGET (IP6_HLEN + 8)
#define ND_OPT (IP6_HLEN + 24)
#define ND_OPT_MAC (ND_OPT + 2)

enum verdict {
	PASS = TC_ACT_OK,
	DROP = TC_ACT_SHOT,
	/* Not decided yet: go on to the source check. */
	SOURCE = -1,
};

static __always_inline int source4_allowed(const struct attachment *a, __be32 saddr)
{
	__u32 n = a->n4;

	for (__u32 i = 0; i < MAX_SOURCES; i++) {
		if (i >= n)
			return 0;
		if ((saddr & a->v4[i].mask) == a->v4[i].addr)
			return 1;
	}
	return 0;
}

/* source6_allowed says whether the address at addr (8-byte aligned) is in
 * one of the attachment's IPv6 prefixes. */
static __always_inline int source6_allowed(const struct attachment *a, const __u64 *addr)
{
	__u64 hi = addr[0], lo = addr[1];
	__u32 n = a->n6;

	for (__u32 i = 0; i < MAX_SOURCES; i++) {
		if (i >= n)
			return 0;
		if ((hi & a->v6[i].mask[0]) == a->v6[i].addr[0] && (lo & a->v6[i].mask[1]) == a->v6[i].addr[1])
			return 1;
	}
	return 0;
}

static __always_inline int dhcp_server_port(__be16 port)
{
	return port == bpf_htons(DHCP_SERVER_PORT) || port == bpf_htons(DHCPV6_SERVER_PORT);
}

/* IPv6 next headers that are extension headers: walking them would
 * multiply what the verifier explores, and a workload needs none but a
 * fragment header. */
static __always_inline int extension_header(__u8 next)
{
	return next == 0 || next == 43 || next == 44 || next == 51 || next == 60 || next == 135 ||
	       next == 139 || next == 140 || next == 253 || next == 254;
}

static __always_inline int link_local(const __u64 *addr)
{
	return (*(const __be16 *)addr & bpf_htons(0xffc0)) == bpf_htons(0xfe80);
}

/* forward4 is the IPv4 fast path, for a header of hlen bytes. */
static __always_inline int forward4(struct __sk_buff *skb, const struct frame *f, __u32 len, __u32 hlen)
{
	struct bpf_fib_lookup fib;

	if (hlen != IP_HLEN || !ipv4_header_valid(&f->ip4))
		return PASS;
	if (skb->pkt_type != PACKET_HOST || (f->ip4.frag_off & bpf_htons(IP_MF_OFFSET)) || f->ip4.ttl <= 1)
		return PASS;
	fib_ipv4(&fib, skb, &f->ip4, len >= ETH_HLEN + IP_HLEN + 4);
	if (!fib_route(skb, &fib))
		return PASS;
	if (!decrement_ttl4(skb, &f->ip4, ETH_HLEN))
		return DROP;
	return redirect_to(&fib);
}

static __always_inline int ipv4(struct __sk_buff *skb, const struct attachment *a, const struct frame *f, __u32 len)
{
	if (len < ETH_HLEN + IP_HLEN || (f->l3[0] & 0xf0) != 0x40)
		return DROP;
	/* 20 to 60 */
	__u32 hlen = (f->l3[0] & 0x0f) * 4;
	if (hlen < IP_HLEN)
		return DROP;
	if (!source4_allowed(a, f->ip4.saddr))
		return DROP;
	/* Later fragments carry no transport header. */
	if (f->ip4.frag_off & bpf_htons(IP_OFFSET))
		return PASS;
	__u8 proto = f->ip4.protocol;
	if (proto == IPPROTO_UDP) {
		/* DHCP server replies. */
		if (len < ETH_HLEN + hlen + 2 || dhcp_server_port(*(const __be16 *)&f->l3[hlen]))
			return DROP;
	} else if (proto == IPPROTO_ICMP) {
		/* An ICMP redirect, whatever its code. */
		if (len < ETH_HLEN + hlen + 2 || f->l3[hlen] == ICMP_REDIRECT)
			return DROP;
	}
	return forward4(skb, f, len, hlen);
}

/* icmp6 checks unfragmented ICMPv6. */
static __always_inline int icmp6(const struct attachment *a, const struct frame *f, __u32 len)
{
	if (len < ETH_HLEN + IP6_HLEN + 4)
		return DROP;
	__u8 type = f->l3[IP6_HLEN];
	if (type == NDISC_ROUTER_ADVERTISEMENT || type == NDISC_REDIRECT)
		return DROP;
	/* DAD: a solicitation from :: announces nothing. */
	if ((f->ip6.saddr[0] | f->ip6.saddr[1]) == 0)
		return PASS;
	if (type == NDISC_NEIGHBOUR_ADVERTISEMENT) {
		/* An advertisement names as its target only a link-local
		 * address or one the attachment may send from. */
		if (len < ETH_HLEN + ND_OPT)
			return DROP;
		const __u64 *target = (const __u64 *)&f->l3[ND_TARGET];
		if (target[0] != bpf_htonll(0xfe80000000000000ull) && !source6_allowed(a, target))
			return DROP;
	}
	if (type == NDISC_NEIGHBOUR_SOLICITATION || type == NDISC_NEIGHBOUR_ADVERTISEMENT) {
		/* A veth's solicitation or advertisement carries no option or
		 * one link-layer address option, and that is the container
		 * end's MAC. */
		if ((a->flags & FLAG_MAC) && f->ip6.payload_len != bpf_htons(ND_LEN)) {
			if (f->ip6.payload_len != bpf_htons(ND_OPT_LEN) || len < ETH_HLEN + ND_OPT + 8)
				return DROP;
			/* Type 1 (source) or 2 (target link-layer address), length 1. */
			__be16 opt = *(const __be16 *)&f->l3[ND_OPT];
			if (opt != bpf_htons(0x0101) && opt != bpf_htons(0x0201))
				return DROP;
			if (!mac_equal(&f->l3[ND_OPT_MAC], a->mac))
				return DROP;
		}
	}
	if (link_local(f->ip6.saddr))
		return PASS;
	return SOURCE;
}

/* forward6 is the IPv6 fast path: TCP, UDP and ICMPv6 echo without
 * extension headers, between addresses that are not link-local, to one
 * that is not multicast. IPv6 has no header checksum. */
static __always_inline int forward6(struct __sk_buff *skb, const struct frame *f, __u32 len)
{
	struct bpf_fib_lookup fib;

	if (skb->pkt_type != PACKET_HOST || f->ip6.hop_limit <= 1)
		return PASS;
	if (*(const __u8 *)f->ip6.daddr == 0xff || link_local(f->ip6.daddr) || link_local(f->ip6.saddr))
		return PASS;
	__u8 next = f->ip6.nexthdr;
	if (next == IPPROTO_ICMPV6) {
		if (len < ETH_HLEN + IP6_HLEN + 4)
			return PASS;
		__u8 type = f->l3[IP6_HLEN];
		if (type != ICMPV6_ECHO_REQUEST && type != ICMPV6_ECHO_REPLY)
			return PASS;
	} else if (next != IPPROTO_TCP && next != IPPROTO_UDP) {
		return PASS;
	}
	fib_start(&fib, skb, AF_INET6, next, bpf_ntohs(f->ip6.payload_len) + IP6_HLEN);
	fib_ports(&fib, &f->l3[IP6_HLEN], len >= ETH_HLEN + IP6_HLEN + 4);
	/* Traffic class and flow label, which the kernel's route lookup takes. */
	fib.flowinfo = f->ip6.ver_flow & bpf_htonl(0x0fffffff);
	__builtin_memcpy(fib.ipv6_src, f->ip6.saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, f->ip6.daddr, 16);
	if (!fib_route(skb, &fib))
		return PASS;
	__u8 hop = f->ip6.hop_limit - 1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + __builtin_offsetof(struct ipv6hdr, hop_limit), &hop, 1, 0))
		return DROP;
	return redirect_to(&fib);
}

static __always_inline int ipv6(struct __sk_buff *skb, const struct attachment *a, const struct frame *f, __u32 len)
{
	int v = SOURCE;

	if (len < ETH_HLEN + IP6_HLEN || (f->l3[0] & 0xf0) != 0x60)
		return DROP;
	__u8 next = f->ip6.nexthdr;
	if (next == IPPROTO_FRAGMENT) {
		if (len < ETH_HLEN + IP6_FRAG_L4)
			return DROP;
		next = f->l3[IP6_FRAG];
		/* A later fragment: only its source to check. */
		if (*(const __be16 *)&f->l3[IP6_FRAG + 2] & bpf_htons(IP6_OFFSET))
			goto source;
		if (extension_header(next))
			return DROP;
		/* A first fragment: of ICMPv6 only echo, whose checks need
		 * nothing past the type. */
		if (next == IPPROTO_UDP) {
			if (len < ETH_HLEN + IP6_FRAG_L4 + 4 || dhcp_server_port(*(const __be16 *)&f->l3[IP6_FRAG_L4]))
				return DROP;
		} else if (next == IPPROTO_ICMPV6) {
			if (len < ETH_HLEN + IP6_FRAG_L4 + 4)
				return DROP;
			__u8 type = f->l3[IP6_FRAG_L4];
			if (type != ICMPV6_ECHO_REQUEST && type != ICMPV6_ECHO_REPLY)
				return DROP;
		}
		goto source;
	}
	if (extension_header(next))
		return DROP;
	if (next == IPPROTO_UDP) {
		if (len < ETH_HLEN + IP6_HLEN + 4 || dhcp_server_port(*(const __be16 *)&f->l3[IP6_HLEN]))
			return DROP;
	} else if (next == IPPROTO_ICMPV6) {
		v = icmp6(a, f, len);
		if (v != SOURCE)
			return v;
	}
source:
	if (!source6_allowed(a, f->ip6.saddr))
		return DROP;
	return forward6(skb, f, len);
}

SEC("tc")
int classify(struct __sk_buff *skb)
{
	__u32 key = skb->ifindex;
	const struct attachment *a = bpf_map_lookup_elem(&attachments, &key);
	if (!a)
		return DROP;

	__u32 len = skb->len;
	struct frame f;
	if (len < ETH_HLEN || bpf_skb_load_bytes(skb, 0, &f.eth, len < FRAME_COPY ? len : FRAME_COPY))
		return DROP;
	/* A veth's frames carry its container end's MAC. */
	if ((a->flags & FLAG_MAC) && !mac_equal(f.eth.h_source, a->mac))
		return DROP;
	switch (f.eth.h_proto) {
	case bpf_htons(ETH_P_ARP):
		/* Checked by the arp table's rules. */
		return PASS;
	case bpf_htons(ETH_P_IP):
		return ipv4(skb, a, &f, len);
	case bpf_htons(ETH_P_IPV6):
		return ipv6(skb, a, &f, len);
	}
	return DROP;
}

/* bpf_fib_lookup is GPL-only; the code is Apache-2.0 or GPL-2.0 (above). */
char __license[] SEC("license") = "GPL";
