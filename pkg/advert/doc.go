// Package advert maintains BGPAdvertisements: one object per (attachment,
// node) listing every container on that node that published the
// attachment's prefixes.
//
// Every write is guarded. Updates carry the resourceVersion that was read,
// deletes carry UID and resourceVersion preconditions, and a conflict (or a
// create that lost a race, or an update of an object deleted meanwhile)
// re-reads the object and decides again, with jittered exponential backoff,
// until the caller's context ends. Transient API errors (connection refused,
// timeouts, 5xx, 429) are retried the same way; errors that retrying cannot
// fix (forbidden, invalid) are returned at once.
//
// The operations are shared by the galactic-bgp plugin (Publish, Release,
// Remove, DeleteOthers) and the node GC daemon (Prune):
//
//   - Publish upserts one container's entry in this node's advertisement
//     and drops entries whose netns is gone.
//   - Release removes one container's entries; the advertisement is deleted
//     once no remaining entry is live.
//   - Remove is Release for any set of entries (CNI GC).
//   - Prune drops dead entries from advertisements the caller listed, and
//     deletes those left without a live entry.
//   - DeleteOthers deletes an attachment's advertisements on other nodes,
//     each only if it is still exactly the object that was listed.
//
// An entry is live while its netns path is a mounted network namespace, a
// judgement only the node that recorded it can make: nothing here ever
// judges another node's entries.
package advert
