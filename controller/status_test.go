package controller

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

func readyVPCObject() *v1alpha1.VPC {
	return &v1alpha1.VPC{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "blue", UID: "vpc-uid"},
		Spec:       v1alpha1.VPCSpec{Networks: []v1alpha1.CIDR{"10.20.0.0/16"}},
		Status:     v1alpha1.VPCStatus{VNI: 100000, DataplaneName: "blue-12345678"},
	}
}

func TestAttachmentStatus(t *testing.T) {
	att := &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web", UID: "att-uid", Generation: 2},
		Spec: v1alpha1.VPCAttachmentSpec{VPC: "blue"}}
	noHolder := projectHolder(holderInputs{Now: t0})
	now := metav1.NewTime(t0)

	st := desiredAttachmentStatus(attachmentStatusInputs{Attachment: att, VPC: readyVPCObject(), Addresses: []v1alpha1.Prefix{"10.20.0.2/16"}, Holder: noHolder, Now: now})
	if st.VNI != 100000 || st.Dataplane == nil || st.Dataplane.VPC != "blue-12345678" || st.Dataplane.Attachment != names.DataplaneName("web", "att-uid") {
		t.Fatalf("allocated status: vni %d, dataplane %+v", st.VNI, st.Dataplane)
	}
	ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != v1alpha1.ReasonAllocated || ready.ObservedGeneration != 2 || ready.Message != "allocated 10.20.0.2/16" {
		t.Fatalf("Ready = %+v", ready)
	}
	if len(st.Conditions) != 3 {
		t.Fatalf("want Ready, Programmed and HolderAvailable, got %+v", st.Conditions)
	}

	// Written once, the same inputs later give the same status: no write.
	att.Status = st
	again := desiredAttachmentStatus(attachmentStatusInputs{Attachment: att, VPC: readyVPCObject(), Addresses: []v1alpha1.Prefix{"10.20.0.2/16"}, Holder: noHolder, Now: metav1.NewTime(t0.Add(time.Hour))})
	if !statusEqual(att.Status, again) {
		t.Errorf("unchanged inputs changed the status:\n%+v\n%+v", att.Status, again)
	}

	// The data-plane names never change, even if the VPC's did.
	other := readyVPCObject()
	other.Status.DataplaneName = "other"
	if s := desiredAttachmentStatus(attachmentStatusInputs{Attachment: att, VPC: other, Addresses: st.Addresses, Holder: noHolder, Now: now}); s.Dataplane.VPC != "blue-12345678" {
		t.Errorf("data-plane names changed to %+v", s.Dataplane)
	}

	// A problem makes Ready False with its reason; the transition time moves.
	later := metav1.NewTime(t0.Add(time.Minute))
	s := desiredAttachmentStatus(attachmentStatusInputs{Attachment: att, Problem: &problem{v1alpha1.ReasonPoolExhausted, "full"}, Holder: noHolder, Now: later})
	ready = meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || ready.Reason != v1alpha1.ReasonPoolExhausted || ready.Message != "full" || !ready.LastTransitionTime.Equal(&later) {
		t.Errorf("Ready with a problem = %+v", ready)
	}
}

func TestVPCStatus(t *testing.T) {
	vpc := readyVPCObject()
	vpc.Status = v1alpha1.VPCStatus{}
	now := metav1.NewTime(t0)
	st := desiredVPCStatus(vpcStatusInputs{VPC: vpc, VNI: 100007, Now: now})
	if st.VNI != 100007 || st.DataplaneName != names.DataplaneName("blue", "vpc-uid") {
		t.Fatalf("status = %+v", st)
	}
	if r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); r == nil || r.Status != metav1.ConditionTrue || r.Message != "VNI 100007" {
		t.Fatalf("Ready = %+v", r)
	}
	vpc.Status = st
	st = desiredVPCStatus(vpcStatusInputs{VPC: vpc, Waiting: []string{"a", "b", "c", "d", "e", "f", "g"}, Now: now})
	r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	if r.Message != "VNI 100007; being deleted, waiting for VPCAttachments a, b, c, d, e and 2 more to be deleted" {
		t.Errorf("deleting message = %q", r.Message)
	}
	st = desiredVPCStatus(vpcStatusInputs{VPC: readyVPCObject(), Problem: &problem{v1alpha1.ReasonVNIConflict, "VNI 5 is held"}, Now: now})
	if r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); r.Status != metav1.ConditionFalse || r.Reason != v1alpha1.ReasonVNIConflict {
		t.Errorf("conflict Ready = %+v", r)
	}
}

func TestDecideVNI(t *testing.T) {
	released := metav1.NewTime(t0)
	hold := 10 * time.Minute
	for _, tc := range []struct {
		name      string
		releaseAt *metav1.Time
		vpcExists bool
		inUse     bool
		now       time.Time
		want      vniAction
		wait      time.Duration
	}{
		{"held by its VPC", nil, true, false, t0, vniKeep, 0},
		{"its VPC went without releasing it", nil, false, false, t0, vniRelease, 0},
		{"released, within the hold", &released, false, false, t0.Add(time.Minute), vniKeep, 9 * time.Minute},
		{"released, hold over, an advertisement still carries it", &released, false, true, t0.Add(hold), vniKeep, 0},
		{"released, hold over, nothing uses it", &released, false, false, t0.Add(hold), vniDelete, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &v1alpha1.VNI{Spec: v1alpha1.VNISpec{ReleasedAt: tc.releaseAt}}
			got, wait := decideVNI(v, tc.vpcExists, tc.inUse, hold, tc.now)
			if got != tc.want || wait != tc.wait {
				t.Errorf("decideVNI = %v, %s; want %v, %s", got, wait, tc.want, tc.wait)
			}
		})
	}
}
