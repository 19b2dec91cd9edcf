package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/state"
)

// Tap is a galactic tap as the kernel shows it.
type Tap struct {
	Name       string
	Index      int
	VPC        string
	Attachment string
	// UID is the VPCAttachment's its ifalias carries; empty for an inline
	// attachment's tap.
	UID     string
	Carrier bool
	// Holders are the processes with a tun fd bound to the tap.
	Holders []int
}

// Detached reports whether no VMM holds the tap.
func (t Tap) Detached() bool { return !t.Carrier && len(t.Holders) == 0 }

// Kernel is the node's kernel state the collector reads and changes.
type Kernel interface {
	// Taps lists the galactic taps (by name and ifalias).
	Taps() ([]Tap, error)
	// Tap re-reads one tap; ok is false when it is gone.
	Tap(name string) (t Tap, ok bool, err error)
	// Link reports whether a host interface exists and whose it is.
	Link(name string) (Link, error)
	// Release undoes what galactic-cni set up for a record whose container
	// is gone: host interface if still there, rules, and the routing domain
	// with its last attachment. It must tolerate what is already gone.
	Release(rec state.Record) error
	// RemoveTap removes a tap that no record describes.
	RemoveTap(t Tap) error
}

// Link is what the collector needs to know of a host interface.
type Link struct {
	Found bool
	// Galactic says its ifalias is galactic's; UID is the VPCAttachment's
	// UID it carries, empty for an inline attachment's.
	Galactic bool
	UID      string
}

// PruneResult says what pruning one advertisement changed.
type PruneResult struct {
	EntriesPruned int
	Deleted       bool
}

// Advertisements is this node's view of the BGPAdvertisement API.
type Advertisements interface {
	// List returns this node's advertisements with one label-selected list.
	List(ctx context.Context) ([]v1alpha1.BGPAdvertisement, error)
	// Prune drops dead entries and deletes the advertisement once no live
	// entry is left, with resourceVersion-guarded writes.
	Prune(ctx context.Context, adv *v1alpha1.BGPAdvertisement) (PruneResult, error)
	// Get re-reads this node's advertisement of an attachment; nil if none.
	Get(ctx context.Context, vpc, attachment string) (*v1alpha1.BGPAdvertisement, error)
}

// Leases renews and releases the handoff leases of local holders. Both
// return an error wrapping handoff.ErrLost when the record's holder and
// token are no longer current.
type Leases interface {
	Renew(ctx context.Context, rec state.Record) error
	Release(ctx context.Context, rec state.Record) error
}

// Reasons a detached tap is kept, as reported in metrics and logs.
const (
	KeptFirstSighting  = "first-sighting"
	KeptAPIUnavailable = "api-unavailable"
	KeptLiveRecord     = "live-record"
	KeptAdvertisedHere = "advertised-here"
	KeptChanged        = "changed-before-reclaim"
)

// Collector runs GC passes for one node.
type Collector struct {
	StateDir string
	Kernel   Kernel
	Adverts  Advertisements
	// Leases is nil when the node runs without handoff.
	Leases Leases
	// Live reports whether a container's netns still exists.
	Live func(netns string) bool
	// Filter restores the packet filter; nil skips it.
	Filter FilterSync
	Log    *slog.Logger
	// Clock times the passes and spaces them; nil is the real clock.
	Clock clock.Clock
}

func (c *Collector) passClock() clock.Clock {
	if c.Clock == nil {
		return clock.RealClock{}
	}
	return c.Clock
}

// Report is what one pass did.
type Report struct {
	EntriesPruned         int
	AdvertisementsDeleted int
	RecordsRemoved        int
	TapsDetached          int
	TapsReclaimed         int
	TapsKept              map[string]int
	LeasesRenewed         int
	LeasesReleased        int
	// FilterRebuilt says the pass restored galactic's nftables table;
	// FilterElementsAdded and FilterElementsRemoved count set elements.
	FilterRebuilt         bool
	FilterElementsAdded   int
	FilterElementsRemoved int
	// FilterClassifiersAttached counts the workload interfaces the
	// classifier was put back on.
	FilterClassifiersAttached int
	// Errors counts failures by kind; the pass goes on past each.
	Errors map[string]int
}

// attachmentKey is one identity's attachment: the names and the UID. A
// record, tap or entry of the same names and another UID is another
// identity's (a predecessor's or a successor's), judged by its own rules.
type attachmentKey struct{ vpc, attachment, uid string }

// hintTTL is how long galactic-cni's hint of a VPCAttachment no record
// uses is kept: long enough for a restart or an upgrade in place.
const hintTTL = time.Hour

// pruneHints removes the hints (state.Hints) of attachments no record on
// the node has used for hintTTL.
func (c *Collector) pruneHints(recordedUID map[string]bool, fail func(string, error)) {
	n, err := state.NewHints(c.StateDir).Prune(c.passClock().Now().Add(-hintTTL), func(uid string) bool { return recordedUID[uid] })
	if err != nil {
		fail("hints", err)
	}
	if n > 0 {
		c.Log.Info("pruned attachment hints", "hints", n, "reason", "no record of the attachment for "+hintTTL.String())
	}
}

// Pass runs one GC pass. It returns an error when any step failed; what
// could be done was done.
func (c *Collector) Pass(ctx context.Context) (Report, error) {
	r := Report{TapsKept: map[string]int{}, Errors: map[string]int{}}
	var errs []error
	fail := func(kind string, err error) {
		r.Errors[kind]++
		errs = append(errs, fmt.Errorf("%s: %w", kind, err))
		c.Log.Error("gc step failed", "kind", kind, "error", err.Error())
	}

	mem, err := loadMemory(c.StateDir)
	if err != nil {
		fail("memory", err)
		mem = &memory{Detached: map[string]sighting{}, path: ""}
	}
	mem.Pass++

	store := state.NewStore(c.StateDir)
	records, err := store.List()
	if err != nil {
		fail("records", err)
	}
	liveRecord := map[attachmentKey]bool{}
	recordedUID := map[string]bool{}
	for _, rec := range records {
		recordedUID[rec.AttachmentUID] = true
		if c.Live(rec.Netns) {
			liveRecord[attachmentKey{rec.VPC, rec.Attachment, rec.AttachmentUID}] = true
		}
	}
	if err == nil {
		c.pruneHints(recordedUID, fail)
	}

	// Advertisements: one list, then guarded prunes.
	advertisedHere := map[attachmentKey]bool{}
	advs, err := c.Adverts.List(ctx)
	apiOK := err == nil
	if err != nil {
		fail("list-advertisements", err)
	}
	for i := range advs {
		adv := &advs[i]
		for _, e := range adv.Spec.Containers {
			if c.Live(e.Netns) {
				advertisedHere[attachmentKey{adv.Spec.VPC, adv.Spec.Attachment, e.AttachmentUID}] = true
			}
		}
		res, err := c.Adverts.Prune(ctx, adv)
		if err != nil {
			fail("prune", err)
			continue
		}
		r.EntriesPruned += res.EntriesPruned
		if res.EntriesPruned > 0 {
			c.Log.Info("pruned dead entries", "advertisement", adv.Name, "entries", res.EntriesPruned, "reason", "netns gone")
		}
		if res.Deleted {
			r.AdvertisementsDeleted++
			c.Log.Info("deleted advertisement", "advertisement", adv.Name, "reason", "no live entry")
		}
	}

	c.collectRecords(store, records, &r, fail)
	c.collectTaps(ctx, store, mem, apiOK, liveRecord, advertisedHere, &r, fail)
	c.keepLeases(ctx, records, &r, fail)
	c.syncFilter(&r, fail)

	mem.forgetUnseen()
	if mem.path != "" {
		if err := mem.save(); err != nil {
			fail("memory", err)
		}
	}
	return r, errors.Join(errs...)
}

// collectRecords removes records whose container and host interface are
// both gone, undoing any host-side state they still account for.
func (c *Collector) collectRecords(store state.Store, records []state.Record, r *Report, fail func(string, error)) {
	for _, rec := range records {
		if c.Live(rec.Netns) {
			continue
		}
		l, err := c.Kernel.Link(rec.HostInterface)
		if err != nil {
			fail("links", err)
			continue
		}
		if l.Found && (!l.Galactic || l.UID == rec.AttachmentUID) {
			// A tap outlives its container by design; the tap reclaim
			// decides. An interface of the name carrying another UID is
			// another identity's: this record's own is gone.
			continue
		}
		if err := c.Kernel.Release(rec); err != nil {
			fail("release-record", err)
			continue
		}
		if err := store.Delete(rec.ContainerID, rec.IfName); err != nil {
			fail("records", err)
			continue
		}
		r.RecordsRemoved++
		c.Log.Info("removed record", "containerID", rec.ContainerID, "ifName", rec.IfName, "vpc", rec.VPC, "attachment", rec.Attachment, "reason", "container and host interface gone")
	}
}

func (c *Collector) collectTaps(ctx context.Context, store state.Store, mem *memory, apiOK bool,
	liveRecord, advertisedHere map[attachmentKey]bool, r *Report, fail func(string, error)) {
	taps, err := c.Kernel.Taps()
	if err != nil {
		fail("taps", err)
		return
	}
	keep := func(t Tap, reason string) {
		r.TapsKept[reason]++
		c.Log.Info("kept detached tap", "tap", t.Name, "ifindex", t.Index, "vpc", t.VPC, "attachment", t.Attachment, "reason", reason)
	}
	for _, t := range taps {
		if !t.Detached() {
			continue
		}
		r.TapsDetached++
		key := attachmentKey{t.VPC, t.Attachment, t.UID}
		switch {
		case !mem.see(t.Name, t.Index):
			keep(t, KeptFirstSighting)
			continue
		case !apiOK:
			keep(t, KeptAPIUnavailable)
			continue
		case liveRecord[key]:
			keep(t, KeptLiveRecord)
			continue
		case advertisedHere[key]:
			keep(t, KeptAdvertisedHere)
			continue
		}
		// Re-check everything right before deleting: a VMM or an ADD may
		// have arrived since the pass started.
		reason, recs, err := c.recheck(ctx, store, t)
		if err != nil {
			fail("recheck", err)
			keep(t, KeptAPIUnavailable)
			continue
		}
		if reason != "" {
			keep(t, reason)
			continue
		}
		if err := c.reclaim(t, recs); err != nil {
			fail("reclaim", err)
			continue
		}
		for _, rec := range recs {
			if err := store.Delete(rec.ContainerID, rec.IfName); err != nil {
				fail("records", err)
			}
		}
		delete(mem.Detached, t.Name)
		r.TapsReclaimed++
		c.Log.Info("reclaimed detached tap", "tap", t.Name, "ifindex", t.Index, "vpc", t.VPC, "attachment", t.Attachment,
			"reason", "detached on two passes and not used on this node", "records", len(recs))
	}
}

// recheck returns a reason to keep the tap, or the dead records of its
// attachment that go with it.
func (c *Collector) recheck(ctx context.Context, store state.Store, t Tap) (string, []state.Record, error) {
	now, ok, err := c.Kernel.Tap(t.Name)
	if err != nil {
		return "", nil, err
	}
	if !ok || now.Index != t.Index || !now.Detached() {
		return KeptChanged, nil, nil
	}
	records, err := store.List()
	if err != nil {
		return "", nil, err
	}
	var mine []state.Record
	for _, rec := range records {
		if rec.VPC != t.VPC || rec.Attachment != t.Attachment || rec.AttachmentUID != t.UID {
			continue
		}
		if c.Live(rec.Netns) {
			return KeptLiveRecord, nil, nil
		}
		mine = append(mine, rec)
	}
	adv, err := c.Adverts.Get(ctx, t.VPC, t.Attachment)
	if err != nil {
		return "", nil, err
	}
	if adv != nil {
		for _, e := range adv.Spec.Containers {
			if e.AttachmentUID == t.UID && c.Live(e.Netns) {
				return KeptAdvertisedHere, nil, nil
			}
		}
	}
	return "", mine, nil
}

func (c *Collector) reclaim(t Tap, recs []state.Record) error {
	if len(recs) == 0 {
		return c.Kernel.RemoveTap(t)
	}
	for _, rec := range recs {
		if err := c.Kernel.Release(rec); err != nil {
			return err
		}
	}
	// Records of other interfaces may share the attachment; the tap must go
	// whichever record described it.
	if _, ok, err := c.Kernel.Tap(t.Name); err == nil && ok {
		return c.Kernel.RemoveTap(t)
	}
	return nil
}

// keepLeases renews the leases of live local holders and releases those of
// dead ones.
func (c *Collector) keepLeases(ctx context.Context, records []state.Record, r *Report, fail func(string, error)) {
	if c.Leases == nil {
		return
	}
	for _, rec := range records {
		if rec.Holder == "" {
			continue
		}
		if c.Live(rec.Netns) {
			if err := c.Leases.Renew(ctx, rec); err != nil {
				fail("lease-renew", err)
				continue
			}
			r.LeasesRenewed++
			continue
		}
		err := c.Leases.Release(ctx, rec)
		if errors.Is(err, handoff.ErrLost) {
			// Released on an earlier pass, or another holder has it now.
			continue
		}
		if err != nil {
			fail("lease-release", err)
			continue
		}
		r.LeasesReleased++
		c.Log.Info("released lease of dead holder", "holder", rec.Holder, "containerID", rec.ContainerID, "vpc", rec.VPC, "attachment", rec.Attachment)
	}
}
