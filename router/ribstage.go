package router

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// ribStage is what the peers sent: the speaker's events queued for the
// next pass, the Adj (every peer's paths, stale ones included), the
// Importer's selection from it and the Holder's routes to install.
type ribStage struct {
	// mu guards the events the speaker delivered since the last pass
	// took them, and the sessions' last state.
	mu     sync.Mutex
	events []timedEvent
	peerUp map[string]bool

	// Only the loop touches these. The Importer reads the Adj in place.
	adj    Adj
	imp    Importer
	holder Holder
	// peers are the configured peers' addresses; wait is how long a start
	// waits for their End-of-RIB (Options.RIBWait), stale the stale bound.
	peers       []string
	wait, stale time.Duration
	// start is when the router started, ready whether the RIB has counted
	// as synced since.
	start time.Time
	ready bool
	// size is the RIB view's paths at the last pass, current the live
	// sessions' paths the RIB view holds, for the metrics.
	size, current atomic.Int64
}

// timedEvent is a speaker event and when it arrived.
type timedEvent struct {
	at time.Time
	ev speaker.Event
}

// onEvent queues one event of the speaker's stream, in order, for the
// next pass; only events that can change the selection start one.
func (d *Daemon) onEvent(ev speaker.Event) {
	changed := d.rib.queue(d.clock.Now(), ev)
	switch ev.Kind {
	case speaker.EventPaths:
		d.metrics.received.Add(float64(len(ev.Paths)))
	case speaker.EventEndOfRIB:
		d.log.Info("End-of-RIB", "peer", ev.Peer)
	case speaker.EventPeer:
		if changed {
			d.log.Info("peer", "address", ev.Peer, "state", ev.State.State, "established", ev.State.Established)
		}
	}
	if changed {
		d.trigger()
	}
}

// queue adds ev, arrived at at, to the events of the next pass and says
// whether it can change the selection.
func (r *ribStage) queue(at time.Time, ev speaker.Event) (changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, timedEvent{at, ev})
	if ev.Kind != speaker.EventPeer {
		return true
	}
	// Only a session's coming up or going down is read by a pass.
	if r.peerUp == nil {
		r.peerUp = map[string]bool{}
	}
	changed = r.peerUp[ev.Peer] != ev.State.Established
	r.peerUp[ev.Peer] = ev.State.Established
	return changed
}

// seed hands the routes a previous run installed to the hold, so they
// stay until the RIB confirms or replaces them.
func (r *ribStage) seed(plane dataplane.Plane) error {
	k, err := plane.ReadDevices()
	if err != nil {
		return err
	}
	// One table at a time: a node of many routes holds one VPC's while it
	// reads, not every VPC's.
	for vpc := range k.Devices() {
		dom, err := k.Domain(vpc)
		if err != nil || dom == nil {
			continue
		}
		if err := k.ReadTables([]int{dom.Table}); err != nil {
			return err
		}
		r.holder.Seed(vpc, k.Installed(vpc, dom))
		k.Forget([]int{dom.Table})
	}
	return nil
}

// receive is a pass's first step: the queued events and the stale
// bounds applied to the Adj, and its changes to the Importer. It returns
// whether a session is established, the peers' sessions and when a bound
// ends next.
func (r *ribStage) receive(now time.Time, log *slog.Logger) (anyPeer bool, established map[string]bool, next time.Time) {
	changes, anyPeer, synced, established, next := r.snapshot(now)
	r.imp.Apply(changes)
	r.size.Store(int64(r.imp.Len()))
	if !r.ready && synced {
		r.ready = true
		log.Info("RIB synced", "after", now.Sub(r.start).Round(time.Millisecond))
	}
	return anyPeer, established, next
}

// snapshot applies the speaker's queued events and the stale bounds and
// returns the RIB view's changes, whether a session is established,
// whether the RIB counts as synced for a start, the peers' sessions and
// when a bound ends next.
func (r *ribStage) snapshot(now time.Time) (changes []ribChange, anyPeer, synced bool, established map[string]bool, next time.Time) {
	r.mu.Lock()
	evs := r.events
	r.events = nil
	r.mu.Unlock()
	for _, e := range evs {
		r.adj.Apply(e.at, e.ev)
	}
	next = r.adj.Expire(now)
	changes = r.adj.TakeChanges()
	r.current.Store(int64(r.adj.Current()))
	anyPeer, anySynced, allSynced := r.adj.Sessions(r.peers)
	return changes, anyPeer, StartSynced(now.Sub(r.start), anySynced, allSynced, r.wait, r.stale), r.adj.Established(), next
}

// StartSynced says whether a started router may judge the routes it found
// in the kernel: once every peer sent its End-of-RIB, or one did and wait
// has passed; with no End-of-RIB at all (reflectors unreachable) only when
// the stale bound (at least wait) has passed.
func StartSynced(since time.Duration, anySynced, allSynced bool, wait, stale time.Duration) bool {
	return allSynced || anySynced && since >= wait || since >= max(wait, stale)
}

// hold brings the selection up to date with the VPCs' VNIs and the
// routes to install with the selection, for the VPCs with a device and
// those whose device failed (their kernel routes stay as they are until
// it is back). Until the RIB is synced routes that went are held without
// the hold's clock. It returns when the next hold ends.
func (r *ribStage) hold(now time.Time, vnis map[string]uint32, devices map[string]*dataplane.Device, deviceErrs map[string]error) time.Time {
	// The selection follows the RIB's changes exactly, so a resync only
	// reads the kernel again.
	r.imp.SetVNIs(vnis)
	changes := r.imp.Select()
	managed := map[string]bool{}
	for vpc := range devices {
		managed[vpc] = true
	}
	for vpc := range deviceErrs {
		managed[vpc] = true
	}
	return r.holder.Update(now, &r.imp, r.imp.Fences(), managed, !r.ready, changes)
}
