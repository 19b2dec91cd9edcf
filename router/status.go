package router

import (
	"context"
	"fmt"

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
