package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
)

// holderInputs are what an attachment's holder, Programmed and
// HolderAvailable are derived from on every pass.
type holderInputs struct {
	// Deleting is set once the attachment has a deletion timestamp.
	Deleting bool
	// Lease is the attachment's handoff lease, nil when there is none.
	Lease *coordinationv1.Lease
	// LeaseSeen is when this controller first saw the lease's current
	// version: a holder that has not renewed for its lease duration
	// since is expired. Remote timestamps are never read as a clock.
	LeaseSeen time.Time
	// Adverts are the advertisements labelled with the attachment's UID.
	Adverts []*v1alpha1.BGPAdvertisement
	Now     time.Time
}

// holderState is the derived part of an attachment's status.
type holderState struct {
	Holder          *v1alpha1.Holder
	Programmed      metav1.Condition
	HolderAvailable metav1.Condition
	// InUse: the lease has a holder that has not expired, or an
	// advertisement has an entry; a deleted attachment waits for neither.
	InUse bool
	// InUseBy says what keeps it in use, for messages.
	InUseBy string
	// ExpiresIn is how long until the holder expires by this controller's
	// observation (0 without a holder): the projection changes then.
	ExpiresIn time.Duration
}

// projectHolder derives the holder state from the lease and the
// advertisements. Availability is judged by pkg/handoff from the current
// holder and its token, so no earlier holder's report is ever shown.
func projectHolder(in holderInputs) holderState {
	var st holderState
	var rec handoff.Record
	if in.Lease != nil {
		rec = handoff.RecordFromLease(in.Lease)
	}
	if rec.HolderIdentity != "" {
		d := time.Duration(rec.LeaseDurationSeconds) * time.Second
		if left := in.LeaseSeen.Add(d).Sub(in.Now); left > 0 {
			node, _, ok := names.ParseHolder(rec.HolderIdentity)
			if !ok {
				node = rec.HolderIdentity
			}
			st.Holder = &v1alpha1.Holder{Node: node, Generation: int64(rec.LeaseTransitions)}
			st.ExpiresIn = left
			st.InUse = true
			st.InUseBy = fmt.Sprintf("lease %s is held by %s", in.Lease.Name, rec.HolderIdentity)
		}
	}
	for _, a := range in.Adverts {
		if len(a.Spec.Containers) > 0 && !st.InUse {
			st.InUse = true
			st.InUseBy = fmt.Sprintf("advertisement %s has %d entries", a.Name, len(a.Spec.Containers))
		}
	}

	st.HolderAvailable = metav1.Condition{Type: v1alpha1.ConditionHolderAvailable, Status: metav1.ConditionFalse}
	switch {
	case in.Deleting:
		st.HolderAvailable.Reason = v1alpha1.ReasonHolderTerminating
		st.HolderAvailable.Message = "the attachment is being deleted"
		if st.InUse {
			st.HolderAvailable.Message += "; it stays until its holder lets go: " + st.InUseBy
		}
	case st.Holder == nil:
		st.HolderAvailable.Reason = v1alpha1.ReasonNoHolder
		st.HolderAvailable.Message = "no runtime holds the attachment"
	default:
		status, reason, msg := handoff.Availability(in.Lease, rec.HolderIdentity, int64(rec.LeaseTransitions))
		if status != metav1.ConditionTrue {
			status = metav1.ConditionFalse
		}
		st.HolderAvailable.Status, st.HolderAvailable.Reason, st.HolderAvailable.Message = status, reason, msg
	}

	st.Programmed = programmed(st.Holder, in.Adverts)
	return st
}

// programmed is the holder node's advertisement's Programmed condition;
// without a holder, that of the one advertisement with entries that are
// not standby.
func programmed(h *v1alpha1.Holder, adverts []*v1alpha1.BGPAdvertisement) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionProgrammed}
	var from *v1alpha1.BGPAdvertisement
	if h != nil {
		for _, a := range adverts {
			if a.Spec.Node == h.Node {
				from = a
			}
		}
		if from == nil {
			c.Status, c.Reason = metav1.ConditionUnknown, v1alpha1.ReasonPending
			c.Message = fmt.Sprintf("node %s holds the attachment and has not advertised it yet", h.Node)
			return c
		}
	} else {
		var serving []*v1alpha1.BGPAdvertisement
		for _, a := range adverts {
			if slices.ContainsFunc(a.Spec.Containers, func(e v1alpha1.ContainerEntry) bool { return !e.Standby }) {
				serving = append(serving, a)
			}
		}
		switch len(serving) {
		case 0:
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1alpha1.ReasonNotAttached, "no node holds or advertises the attachment"
			return c
		case 1:
			from = serving[0]
		default:
			nodes := make([]string, len(serving))
			for i, a := range serving {
				nodes[i] = a.Spec.Node
			}
			slices.Sort(nodes)
			c.Status, c.Reason = metav1.ConditionUnknown, v1alpha1.ReasonPending
			c.Message = fmt.Sprintf("nodes %s advertise the attachment and none holds its lease", strings.Join(nodes, ", "))
			return c
		}
	}
	p := meta.FindStatusCondition(from.Status.Conditions, v1alpha1.ConditionProgrammed)
	if p == nil {
		c.Status, c.Reason = metav1.ConditionUnknown, v1alpha1.ReasonPending
		c.Message = fmt.Sprintf("the advertisement of node %s has no Programmed condition yet", from.Spec.Node)
		return c
	}
	c.Status, c.Reason, c.Message = p.Status, p.Reason, p.Message
	return c
}
