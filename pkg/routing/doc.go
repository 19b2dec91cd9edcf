// Package routing keeps one routing domain per VPC on a node: the routing
// table (and, with vrf routing, the VRF device) that every host interface
// of the VPC's attachments is placed in.
//
// Two kinds exist. With vrf routing the domain is a VRF device named
// DeviceName(vpc) bound to the VPC's table; host interfaces are enslaved to
// it. With table routing there is no device: each host interface gets
// `ip rule iif <host-if> lookup <table>` for IPv4 and IPv6, and each
// workload address `ip rule to <address> lookup <table>` so traffic the
// node itself sends to a workload (for example the reply to a ping of the
// gateway) finds it.
//
// Either way the table ends with an unreachable default route for IPv4 and
// IPv6, so a lookup that misses never falls through to the main table: a
// workload reaches only its own VPC.
//
// The kernel consults the local table (every address of the node) by a
// rule at preference 0, before any of the above; left there, it would let
// a workload reach the node's own addresses. Ensure therefore moves it to
// LocalPriority, just before main, for the whole node and for good (see
// MoveLocalRule). With vrf routing the kernel puts the local routes of a
// VRF member's addresses into the VRF's table, so gateways still answer;
// with table routing each host interface gets `local <gateway> dev
// <host-if>` routes in the VPC's table.
//
// Table IDs come from a private range and are chosen so that no two VPCs
// on a node share one: a table is free only when no route and no rule in
// the kernel uses it. A domain is found again after a restart from kernel
// state alone: its table holds a marker route, `unreachable
// 100::<64 bits of sha256(vpc)>/128 proto galactic` (sha256("vrf:<vpc>")
// with vrf routing, so the kind is known even when the VRF device was
// deleted by hand), in the IPv6 discard prefix (RFC 6666), so it can never
// carry traffic.
//
// Callers hold the node lock (state.Lock) around every change, so
// concurrent ADDs of one VPC create one domain.
package routing
