package gc

import (
	"fmt"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/state"
)

// FilterSync makes the node's packet filter match its records: it restores
// galactic's table when another agent removed or changed it, puts back the
// elements of every attachment whose host interface exists and removes all
// others. Nil skips the step.
type FilterSync func() (filter.SyncResult, error)

// SyncFilter is the FilterSync of the node: under the node lock, so the
// records it reads are those every ADD and DEL has finished writing.
func (k NodeKernel) SyncFilter() (filter.SyncResult, error) {
	unlock, err := state.Lock(k.Host.StateDir)
	if err != nil {
		return filter.SyncResult{}, fmt.Errorf("taking the node lock: %w", err)
	}
	defer unlock()
	f := filter.New()
	recs, err := k.Host.Store().List()
	if err != nil {
		// Without every record, removing elements could cut off a live
		// attachment; restoring the rules is still safe.
		if _, eerr := f.Ensure(); eerr != nil {
			return filter.SyncResult{}, eerr
		}
		return filter.SyncResult{}, fmt.Errorf("reading the node records: %w", err)
	}
	var atts []filter.Attachment
	for _, r := range recs {
		a := hostif.RecordFilter(r)
		// Only the interface's own identity's elements: a record of a
		// predecessor of the same names allows nothing on a successor's.
		if l, err := k.Link(a.Interface); err != nil {
			return filter.SyncResult{}, err
		} else if l.Found && (!l.Galactic || l.UID == r.AttachmentUID) {
			atts = append(atts, a)
		}
	}
	return f.Sync(atts)
}

func (c *Collector) syncFilter(r *Report, fail func(string, error)) {
	if c.Filter == nil {
		return
	}
	res, err := c.Filter()
	if err != nil {
		fail("filter", err)
		return
	}
	r.FilterRebuilt, r.FilterElementsAdded, r.FilterElementsRemoved, r.FilterClassifiersAttached = res.Rebuilt, res.Added, res.Removed, res.Attached
	if res.Rebuilt || res.Added > 0 || res.Removed > 0 || res.Attached > 0 {
		c.Log.Info("packet filter synced", "rebuilt", res.Rebuilt, "elementsAdded", res.Added, "elementsRemoved", res.Removed, "classifiersAttached", res.Attached)
	}
}
