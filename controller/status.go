package controller

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// attachmentStatusInputs are what an attachment's status is made of.
type attachmentStatusInputs struct {
	Attachment *v1alpha1.VPCAttachment
	// VPC is the attachment's VPC once it is Ready, nil before.
	VPC *v1alpha1.VPC
	// Problem is why the attachment is not Ready; nil when its addresses
	// are all allocated.
	Problem *problem
	// Addresses are the allocated ones, with their prefix length.
	Addresses []v1alpha1.Prefix
	Holder    holderState
	Now       metav1.Time
}

// desiredAttachmentStatus is the attachment's status from its inputs.
// Conditions keep their transition time while their status stays; the
// data-plane names, once set, never change.
func desiredAttachmentStatus(in attachmentStatusInputs) v1alpha1.VPCAttachmentStatus {
	att := in.Attachment
	st := *att.Status.DeepCopy()
	st.ObservedGeneration = att.Generation
	st.Holder = in.Holder.Holder
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllocated}
	if in.Problem != nil {
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, in.Problem.Reason, in.Problem.Message
	} else {
		ready.Message = allocatedMessage(in.Addresses)
	}
	if in.VPC != nil {
		st.VNI = in.VPC.Status.VNI
		if st.Dataplane == nil && in.Problem == nil {
			st.Dataplane = &v1alpha1.Dataplane{VPC: in.VPC.Status.DataplaneName, Attachment: names.DataplaneName(att.Name, string(att.UID))}
		}
	}
	// Addresses stay published while they are allocated, Ready or not: a
	// node that uses them keeps what it was given.
	st.Addresses = in.Addresses
	for _, c := range []metav1.Condition{ready, in.Holder.Programmed, in.Holder.HolderAvailable} {
		c.ObservedGeneration = att.Generation
		c.LastTransitionTime = in.Now
		meta.SetStatusCondition(&st.Conditions, c)
	}
	return st
}

func allocatedMessage(addrs []v1alpha1.Prefix) string {
	if len(addrs) == 0 {
		return "no address requested: the workload manages its own addressing"
	}
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = string(a)
	}
	return "allocated " + strings.Join(s, ", ")
}

// vpcStatusInputs are what a VPC's status is made of.
type vpcStatusInputs struct {
	VPC *v1alpha1.VPC
	// VNI is the VPC's VNI, 0 while it has none.
	VNI int32
	// Problem is why it is not Ready.
	Problem *problem
	// Waiting are the attachments a deleted VPC waits for.
	Waiting []string
	Now     metav1.Time
}

// desiredVPCStatus is the VPC's status from its inputs.
func desiredVPCStatus(in vpcStatusInputs) v1alpha1.VPCStatus {
	vpc := in.VPC
	st := *vpc.Status.DeepCopy()
	st.ObservedGeneration = vpc.Generation
	if in.VNI != 0 {
		st.VNI = in.VNI
	}
	if st.DataplaneName == "" {
		st.DataplaneName = names.DataplaneName(vpc.Name, string(vpc.UID))
	}
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllocated,
		Message: fmt.Sprintf("VNI %d", st.VNI)}
	switch {
	case in.Problem != nil:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, in.Problem.Reason, in.Problem.Message
	case len(in.Waiting) > 0:
		ready.Message = fmt.Sprintf("VNI %d; being deleted, waiting for %s", st.VNI, waitingFor(in.Waiting))
	}
	ready.ObservedGeneration = vpc.Generation
	ready.LastTransitionTime = in.Now
	meta.SetStatusCondition(&st.Conditions, ready)
	return st
}

// waitingFor names up to five attachments and counts the rest.
func waitingFor(atts []string) string {
	const show = 5
	s := "VPCAttachment"
	if len(atts) > 1 {
		s += "s"
	}
	s += " " + strings.Join(atts[:min(show, len(atts))], ", ")
	if len(atts) > show {
		s += fmt.Sprintf(" and %d more", len(atts)-show)
	}
	return s + " to be deleted"
}

// statusEqual reports whether two statuses are the same for the API.
func statusEqual(a, b any) bool { return equality.Semantic.DeepEqual(a, b) }
