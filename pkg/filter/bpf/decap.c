//go:build ignore
// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

/* The decapsulation fast path: a tc program on the ingress of the underlay
 * interface that takes the VXLAN packets the kernel's path would accept
 * and the nftables vxlan chain let in (IPv4, a valid header, from a VTEP in
 * galactic's VTEP set, to the local address of one of galactic-router's
 * VXLAN devices with that device's VNI, no UDP checksum) and removes the
 * outer headers. The inner packet it then forwards itself when the kernel
 * would only forward it (forward_inner), or hands to the device's ingress,
 * where the kernel takes it as arriving on the device: the VPC's rules, the
 * nftables input chain for what is addressed to the node. Either way the
 * node's IP input, netfilter input hook, UDP and VXLAN receive are skipped
 * for the outer packet. Anything else goes on to the kernel unchanged and
 * meets the nftables rules: other VTEPs and VNIs, GSO packets, outer ECN
 * marks, IP options, fragments, UDP checksums (the kernel verifies them),
 * VXLAN flags other than the VNI's, and an inner source MAC that is the
 * device's own (the kernel drops those as loops). */

#include "kernel.h"
#include "packet.h"

#define VXLAN_PORT 4789
/* The VXLAN flags word with only the VNI flag. */
#define VXLAN_FLAGS 0x08000000

/* One of galactic-router's VXLAN devices, by VNI (its three bytes and a
 * zero, as the VXLAN header carries them), as pkg/filter writes it
 * (decap.go). */
struct vxlan_device {
	__u32 ifindex;
	__be32 local;
	__u8 mac[6];
	__u8 _pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 14);
	__type(key, __be32);
	__type(value, struct vxlan_device);
} vnis SEC(".maps");

/* The VTEPs galactic-router installed, by IPv4 address. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 16);
	__type(key, __be32);
	__type(value, __u8);
} vteps SEC(".maps");

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__be16 check;
};

struct vxlanhdr {
	__be32 flags;
	__be32 vni;
};

/* What the program reads of a VXLAN frame over IPv4 without options: the
 * outer headers and the inner Ethernet header, all of which but the outer
 * Ethernet header it removes. Copied two bytes into an 8-byte aligned
 * buffer, as the classifier's frame, for aligned loads. */
struct vxlan_frame {
	__u8 _pad[2];
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct vxlanhdr vx;
	struct ethhdr inner;
} __attribute__((aligned(8)));
#define DECAP_HEADER (__builtin_offsetof(struct vxlan_frame, inner) + ETH_HLEN - 2)
_Static_assert(DECAP_HEADER == 64, "the outer headers and the inner Ethernet header");

/* The inner IPv4 header and the four bytes after it (ports), copied on
 * their own: in the frame they sit 50 bytes after the outer one, so one
 * copy cannot align both. */
struct inner4 {
	struct iphdr ip;
	__be16 ports[2];
} __attribute__((aligned(8)));

/* pop removes the outer IPv4, UDP and VXLAN headers and the inner Ethernet
 * header, leaving the outer Ethernet header before the inner packet.
 * Nothing is changed when it fails. */
static __always_inline int pop(struct __sk_buff *skb)
{
	return bpf_skb_adjust_room(skb, ETH_HLEN - (__s32)DECAP_HEADER, BPF_ADJ_ROOM_MAC, 0) == 0;
}

/* Martian sources (0/8, 127/8, multicast, reserved, broadcast) are the
 * kernel's to drop. */
static __always_inline int martian(__be32 addr)
{
	__u8 first = *(const __u8 *)&addr;
	return first == 0 || first == 127 || first >= 224;
}

#define TO_DEVICE -1

/* forward_inner forwards the inner packet from here when the kernel,
 * taking it on the device, would only forward it: IPv4 without options,
 * not fragmented, to the device's MAC, with a TTL above 1, a source that
 * is no martian, and a unicast route through the node in the device's
 * domain (bpf_fib_lookup with the device as input interface, as the
 * classifier's fast path does with the workload's). Anything else goes to
 * the device's ingress (TO_DEVICE). */
static __always_inline int forward_inner(struct __sk_buff *skb, const struct vxlan_frame *f, const struct vxlan_device *dev, __u32 len)
{
	struct bpf_fib_lookup fib;
	struct inner4 in;

	if (len < DECAP_HEADER + sizeof(in) || f->inner.h_proto != bpf_htons(ETH_P_IP) || !mac_equal(f->inner.h_dest, dev->mac))
		return TO_DEVICE;
	if (bpf_skb_load_bytes(skb, DECAP_HEADER, &in, sizeof(in)))
		return TO_DEVICE;
	if (in.ip.ver_ihl != 0x45 || !ipv4_header_valid(&in.ip))
		return TO_DEVICE;
	if ((in.ip.frag_off & bpf_htons(IP_MF_OFFSET)) || in.ip.ttl <= 1 || martian(in.ip.saddr))
		return TO_DEVICE;
	if (bpf_ntohs(in.ip.tot_len) != len - DECAP_HEADER)
		return TO_DEVICE;
	fib_ipv4(&fib, skb, &in.ip, 1);
	/* Looked up as arriving on the device, not on the underlay. */
	fib.ifindex = dev->ifindex;
	if (!fib_route(skb, &fib))
		return TO_DEVICE;
	if (!pop(skb))
		return TC_ACT_OK;
	if (!decrement_ttl4(skb, &in.ip, ETH_HLEN))
		return TC_ACT_SHOT;
	return redirect_to(&fib);
}

SEC("tc")
int decap(struct __sk_buff *skb)
{
	__u32 len = skb->len;
	struct vxlan_frame f;

	/* pkt_type: addressed to this host's MAC, or IP input would drop it. */
	if (len < DECAP_HEADER || skb->gso_size || skb->pkt_type != PACKET_HOST)
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, 0, &f.eth, DECAP_HEADER))
		return TC_ACT_OK;
	if (f.eth.h_proto != bpf_htons(ETH_P_IP) || f.ip.ver_ihl != 0x45 || !ipv4_header_valid(&f.ip))
		return TC_ACT_OK;
	/* An outer ECN mark is the kernel's to carry to the inner header. */
	if ((f.ip.tos & 3) || (f.ip.frag_off & bpf_htons(IP_MF_OFFSET)) || f.ip.protocol != IPPROTO_UDP)
		return TC_ACT_OK;
	/* The whole frame is the packet and the datagram the rest of it: no
	 * padding, nothing cut. */
	if (bpf_ntohs(f.ip.tot_len) != len - ETH_HLEN || bpf_ntohs(f.udp.len) != len - ETH_HLEN - IP_HLEN)
		return TC_ACT_OK;
	if (f.udp.dest != bpf_htons(VXLAN_PORT) || f.udp.check)
		return TC_ACT_OK;
	/* The VNI word's last byte is reserved: zero. */
	if (f.vx.flags != bpf_htonl(VXLAN_FLAGS) || (f.vx.vni & bpf_htonl(0xff)))
		return TC_ACT_OK;

	__be32 key = f.vx.vni;
	const struct vxlan_device *dev = bpf_map_lookup_elem(&vnis, &key);
	if (!dev || f.ip.daddr != dev->local || mac_equal(f.inner.h_source, dev->mac))
		return TC_ACT_OK;
	key = f.ip.saddr;
	if (!bpf_map_lookup_elem(&vteps, &key))
		return TC_ACT_OK;

	__u32 ifindex = dev->ifindex;
	int v = forward_inner(skb, &f, dev, len);
	if (v != TO_DEVICE)
		return v;
	if (!pop(skb))
		return TC_ACT_OK;
	/* The inner Ethernet header over the outer one. */
	if (bpf_skb_store_bytes(skb, 0, &f.inner, ETH_HLEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(ifindex, BPF_F_INGRESS);
}

/* bpf_fib_lookup is GPL-only; the code is Apache-2.0 or GPL-2.0 (above). */
char __license[] SEC("license") = "GPL";
