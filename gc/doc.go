// Package gc is the node garbage collector behind galactic-gc. Each pass
// completes what CNI DEL could not:
//
//   - it prunes dead entries from this node's BGPAdvertisements and deletes
//     those left with none, with the same guarded writes as galactic-bgp DEL;
//   - it reclaims detached taps: a galactic tap that no VMM holds (no carrier,
//     no process with a tun fd bound to it) on two consecutive passes with the
//     same ifindex, whose attachment nothing on this node uses any more;
//   - it removes galactic-cni records whose container and host interface
//     are both gone;
//   - it renews handoff leases of live local holders and releases those of
//     dead ones.
//
// Anything that depends on advertisement state is skipped when the API
// server cannot be read: nothing is deleted on a guess.
package gc
