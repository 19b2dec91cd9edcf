package speaker

import (
	"context"
	"net/netip"
)

// Speaker is what the reconcilers need of a BGP speaker.
type Speaker interface {
	// Announce adds r, replacing the path of the same key if one exists
	// (an implicit update: peers see one UPDATE, no withdrawal).
	Announce(ctx context.Context, r Route) error
	// Withdraw removes the locally originated path of k.
	Withdraw(ctx context.Context, k Key) error
	// Peers lists the configured neighbours' sessions.
	Peers(ctx context.Context) ([]PeerState, error)
	// Rejected lists paths peers sent that the speaker refused (a loop by
	// ORIGINATOR_ID: another node with this node's router ID, over a
	// reflector); cheap when there are none.
	Rejected(ctx context.Context) ([]Received, error)
	// Stop ends every session with a Cease: the end of a drain.
	Stop(ctx context.Context) error
	// SetMembership makes rts the route targets imported (and asked for
	// from peers that speak rtc); paths of others are left out.
	SetMembership(ctx context.Context, rts []RouteTarget) error
	// RTCPeers are the peers known to negotiate rtc.
	RTCPeers(ctx context.Context) ([]netip.Addr, error)
}
