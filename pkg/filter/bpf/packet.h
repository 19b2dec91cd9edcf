// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

/* Headers, and the pieces of the forwarding fast path both programs share:
 * a packet is looked up in the kernel's FIB as the kernel's own input path
 * would, and when the answer is a unicast route to forward through it is
 * sent from here to the route's device and next hop, its TTL or hop limit
 * decremented; the neighbour subsystem writes the Ethernet header. */

#ifndef GALACTIC_PACKET_H
#define GALACTIC_PACKET_H

#include "kernel.h"

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_P_IPV6 0x86dd

#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_FRAGMENT 44
#define IPPROTO_ICMPV6 58

#define IP_HLEN 20
#define IP6_HLEN 40
/* IPv4's fragment offset, and with it the more-fragments flag. */
#define IP_OFFSET 0x1fff
#define IP_MF_OFFSET 0x3fff

struct ethhdr {
	__u8 h_dest[6];
	__u8 h_source[6];
	__be16 h_proto;
};

struct iphdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

/* The addresses as two 64-bit words each: the classifier compares them
 * that way, so the header must be 8-byte aligned. */
struct ipv6hdr {
	__be32 ver_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u64 saddr[2];
	__u64 daddr[2];
};

/* mac_equal says whether the MACs at a and b (2-byte aligned) are one. */
static __always_inline int mac_equal(const __u8 *a, const __u8 *b)
{
	const __u16 *x = (const __u16 *)a, *y = (const __u16 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2];
}

/* ipv4_header_valid says whether the 20-byte IPv4 header at ip (4-byte
 * aligned) has a valid checksum: the kernel's IP input drops the others.
 * The one's complement sum of the header's 16-bit words, checksum
 * included, is 0xffff in either byte order, so the words are summed as
 * loaded. */
static __always_inline int ipv4_header_valid(const struct iphdr *ip)
{
	const __u32 *w = (const __u32 *)ip;
	__u64 sum = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];

	/* Fold the 35-bit sum to 32 bits, then to 16 twice. */
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

/* fib_start zeroes the lookup's parameters and fills in what both
 * families share: family, L4 protocol, ingress interface and the packet's
 * length, which makes the lookup check the route's MTU. A GSO packet's
 * length is left 0: the kernel then checks it by its segments against the
 * route's device, as its forwarding does. */
static __always_inline void fib_start(struct bpf_fib_lookup *fib, const struct __sk_buff *skb, __u8 family, __u8 proto, __u16 tot_len)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = family;
	fib->l4_protocol = proto;
	fib->tot_len = skb->gso_size ? 0 : tot_len;
	fib->ifindex = skb->ifindex;
}

/* fib_ports copies the TCP or UDP ports at l4 (2-byte aligned) when the
 * protocol has them and the frame holds them (has holds), so that rules on
 * ports match as in the kernel's lookup. */
static __always_inline void fib_ports(struct bpf_fib_lookup *fib, const __u8 *l4, int has)
{
	if (!has || (fib->l4_protocol != IPPROTO_TCP && fib->l4_protocol != IPPROTO_UDP))
		return;
	fib->sport = ((const __be16 *)l4)[0];
	fib->dport = ((const __be16 *)l4)[1];
}

/* fib_ipv4 fills the lookup's parameters for the IPv4 header ip (without
 * options, 4-byte aligned), followed by its ports when has_ports. */
static __always_inline void fib_ipv4(struct bpf_fib_lookup *fib, const struct __sk_buff *skb, const struct iphdr *ip, int has_ports)
{
	fib_start(fib, skb, AF_INET, ip->protocol, bpf_ntohs(ip->tot_len));
	fib_ports(fib, (const __u8 *)(ip + 1), has_ports);
	fib->tos = ip->tos;
	fib->ipv4_src = ip->saddr;
	fib->ipv4_dst = ip->daddr;
}

/* fib_route looks the route up; true only for a route to forward through. */
static __always_inline int fib_route(struct __sk_buff *skb, struct bpf_fib_lookup *fib)
{
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0) == BPF_FIB_LKUP_RET_SUCCESS;
}

/* redirect_to sends the packet to the looked-up route's device and next
 * hop (IPv4 or IPv6: an IPv4 route may have an IPv6 next hop); the
 * neighbour subsystem resolves it and writes the Ethernet header. */
static __always_inline long redirect_to(const struct bpf_fib_lookup *fib)
{
	struct bpf_redir_neigh nh;

	nh.nh_family = fib->family;
	nh.nh[0] = fib->ipv6_dst[0];
	nh.nh[1] = fib->ipv6_dst[1];
	nh.nh[2] = fib->ipv6_dst[2];
	nh.nh[3] = fib->ipv6_dst[3];
	return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
}

/* decrement_ttl4 decrements the TTL of the packet's IPv4 header at offset
 * off, of which ip is a copy, and updates its checksum for the change of
 * the 16-bit word TTL and protocol share. False when the packet could not
 * be written. */
static __always_inline int decrement_ttl4(struct __sk_buff *skb, const struct iphdr *ip, __u32 off)
{
	__u16 old = *(const __u16 *)&ip->ttl;
	__u16 word = old - bpf_htons(0x0100);

	if (bpf_l3_csum_replace(skb, off + __builtin_offsetof(struct iphdr, check), old, word, sizeof(word)))
		return 0;
	return bpf_skb_store_bytes(skb, off + __builtin_offsetof(struct iphdr, ttl), &word, sizeof(word), 0) == 0;
}

#endif
