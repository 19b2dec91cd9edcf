package speaker

import "context"

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
}
