// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only

/* What galactic's programs use of the kernel's BPF interface: types,
 * helper numbers, the structures the helpers take and the section and map
 * conventions the loader (cilium/ebpf) reads. Declared here rather than
 * taken from the kernel's and libbpf's headers, so that the objects depend
 * on the compiler alone and `make verify-generated` gives the same bytes
 * wherever it runs. */

#ifndef GALACTIC_KERNEL_H
#define GALACTIC_KERNEL_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;

#define __always_inline inline __attribute__((always_inline))

#define SEC(name) __attribute__((section(name), used))

/* A map declared with BTF: the loader reads these members' types. */
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_HASH 1
#define BPF_F_NO_PREALLOC 1

/* Network byte order of a constant or a loaded value. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_htonl(x) __builtin_bswap32(x)
#define bpf_htonll(x) __builtin_bswap64(x)
#else
#define bpf_htons(x) (x)
#define bpf_htonl(x) (x)
#define bpf_htonll(x) (x)
#endif
#define bpf_ntohs(x) bpf_htons(x)

/* The fields of struct __sk_buff the programs read, at their offsets. */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 _unused0[8];
	__u32 ifindex;
	__u32 _unused1[33];
	__u32 gso_size;
};
_Static_assert(__builtin_offsetof(struct __sk_buff, ifindex) == 40, "__sk_buff.ifindex");
_Static_assert(__builtin_offsetof(struct __sk_buff, gso_size) == 176, "__sk_buff.gso_size");

/* tc's verdicts. */
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

#define PACKET_HOST 0
#define AF_INET 2
#define AF_INET6 10

/* struct bpf_fib_lookup: bpf_fib_lookup's parameters and answer. */
struct bpf_fib_lookup {
	__u8 family;
	__u8 l4_protocol;
	__be16 sport;
	__be16 dport;
	__u16 tot_len;
	__u32 ifindex;
	union {
		__u8 tos;
		__be32 flowinfo;
	};
	union {
		__be32 ipv4_src;
		__u32 ipv6_src[4];
	};
	/* After a successful lookup: the next hop. */
	union {
		__be32 ipv4_dst;
		__u32 ipv6_dst[4];
	};
	__u32 _unused[4];
};
_Static_assert(sizeof(struct bpf_fib_lookup) == 64, "struct bpf_fib_lookup");

/* bpf_fib_lookup's answer for a route to forward through. */
#define BPF_FIB_LKUP_RET_SUCCESS 0

/* struct bpf_redir_neigh: bpf_redirect_neigh's next hop. */
struct bpf_redir_neigh {
	__u32 nh_family;
	__u32 nh[4];
};
_Static_assert(sizeof(struct bpf_redir_neigh) == 20, "struct bpf_redir_neigh");

#define BPF_ADJ_ROOM_MAC 1
#define BPF_F_INGRESS 1

/* Helpers, by their number in the kernel's list. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_skb_store_bytes)(struct __sk_buff *skb, __u32 offset, const void *from, __u32 len, __u64 flags) = (void *)9;
static long (*bpf_l3_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 size) = (void *)10;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)23;
static long (*bpf_skb_load_bytes)(const struct __sk_buff *skb, __u32 offset, void *to, __u32 len) = (void *)26;
static long (*bpf_skb_adjust_room)(struct __sk_buff *skb, __s32 len_diff, __u32 mode, __u64 flags) = (void *)50;
static long (*bpf_fib_lookup)(void *ctx, struct bpf_fib_lookup *params, int plen, __u32 flags) = (void *)69;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) = (void *)152;

#endif
