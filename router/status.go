package router

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// StatusWriter is the part of the BGPAdvertisement client that writes status.
type StatusWriter interface {
	UpdateStatus(ctx context.Context, obj *v1alpha1.BGPAdvertisement, opts metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error)
}

// Conditions are the conditions a verdict gives an advertisement: Programmed
// always, HolderAvailable where a holder can be judged.
func Conditions(v Verdict, peerEstablished bool) []metav1.Condition {
	prog := metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionFalse, Reason: v.Reason, Message: v.Message}
	switch {
	case v.Announced && peerEstablished:
		prog.Status, prog.Reason, prog.Message = metav1.ConditionTrue, v1alpha1.ReasonAnnounced, "announced to at least one established peer"
	case v.Announced:
		prog.Reason, prog.Message = v1alpha1.ReasonNoEstablishedPeer, "announced, but no BGP session is established"
	}
	out := []metav1.Condition{prog}
	if v.Holder.Status != "" {
		out = append(out, v.Holder)
	}
	return out
}

// withConditions returns a copy of adv's status with want applied, and
// whether anything changed. A condition's transition time moves only when
// its status does; a HolderAvailable condition not wanted is removed.
func withConditions(adv *v1alpha1.BGPAdvertisement, want []metav1.Condition, now metav1.Time) (*v1alpha1.BGPAdvertisement, bool) {
	if !conditionsDiffer(adv, want) {
		return adv, false
	}
	next := adv.DeepCopy()
	changed := false
	for _, c := range want {
		c.ObservedGeneration = adv.Generation
		old := meta.FindStatusCondition(next.Status.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration {
			continue
		}
		c.LastTransitionTime = now
		if old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		meta.SetStatusCondition(&next.Status.Conditions, c)
		changed = true
	}
	// HolderAvailable is derived afresh: where no holder is judged any more
	// a report left from before would be stale.
	if meta.FindStatusCondition(want, v1alpha1.ConditionHolderAvailable) == nil &&
		meta.RemoveStatusCondition(&next.Status.Conditions, v1alpha1.ConditionHolderAvailable) {
		changed = true
	}
	return next, changed
}

// conditionsDiffer says whether adv's status lacks a wanted condition as
// wanted, or holds a HolderAvailable no longer wanted: withConditions
// without the copy.
func conditionsDiffer(adv *v1alpha1.BGPAdvertisement, want []metav1.Condition) bool {
	for _, c := range want {
		old := meta.FindStatusCondition(adv.Status.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason || old.Message != c.Message || old.ObservedGeneration != adv.Generation {
			return true
		}
	}
	return meta.FindStatusCondition(want, v1alpha1.ConditionHolderAvailable) == nil &&
		meta.FindStatusCondition(adv.Status.Conditions, v1alpha1.ConditionHolderAvailable) != nil
}

// WriteStatus writes the conditions that changed, each write guarded by
// the resourceVersion of the cached object; a conflict is left for the
// next pass, which sees the newer object.
func WriteStatus(ctx context.Context, w StatusWriter, adv *v1alpha1.BGPAdvertisement, want []metav1.Condition, now metav1.Time) (bool, error) {
	next, changed := withConditions(adv, want, now)
	if !changed {
		return false, nil
	}
	if _, err := w.UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("writing status of %s: %w", adv.Name, err)
	}
	return true, nil
}

// statusItem is the conditions one advertisement should have, with the
// cached object whose resourceVersion guards the write.
type statusItem struct {
	adv  *v1alpha1.BGPAdvertisement
	want []metav1.Condition
}

// statusQueue hands the loop's verdicts to the status writer, latest
// first: status writes are rate-limited by the API client and must never
// hold up routing.
type statusQueue struct {
	mu      sync.Mutex
	pending map[string]statusItem
	kick    chan struct{}
}

// queue hands the writer the conditions of the verdicts that the cached
// advertisements do not say yet.
func (q *statusQueue) queue(adverts []*v1alpha1.BGPAdvertisement, verdicts map[string]Verdict, anyPeer bool) {
	q.mu.Lock()
	for _, adv := range adverts {
		if v, ok := verdicts[adv.Name]; ok {
			// The cached object is the last status written (or one whose
			// write failed): queue only what it does not say yet.
			if want := Conditions(v, anyPeer); conditionsDiffer(adv, want) {
				q.pending[adv.Name] = statusItem{adv: adv, want: want}
			} else {
				delete(q.pending, adv.Name)
			}
		}
	}
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// writeStatus writes the conditions that changed until ctx ends. A write
// that fails (a conflict, an outage) is not retried here: the next pass
// queues the advertisement again from a newer cached object.
func (e *exportStage) writeStatus(ctx context.Context, w StatusWriter) {
	superseded := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.status.kick:
		}
		e.status.mu.Lock()
		batch := e.status.pending
		e.status.pending = map[string]statusItem{}
		e.status.mu.Unlock()
		now := metav1.NewTime(e.clock.Now())
		for name, it := range batch {
			// An object this writer already wrote over: its own write has
			// not reached the watch yet, and the next pass brings it.
			if superseded[name] == it.adv.ResourceVersion {
				continue
			}
			delete(superseded, name)
			wrote, err := WriteStatus(ctx, w, it.adv, it.want, now)
			if err != nil {
				e.log.Warn("status", "advertisement", name, "error", err)
				continue
			}
			if wrote {
				e.metrics.statusWrites.Inc()
				superseded[name] = it.adv.ResourceVersion
			}
		}
	}
}
