package controller

import (
	"unique"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// slim is the informers' transform: it drops from a cached object what
// the controller never reads (managed fields, the type, annotations but a
// lease's) and makes the strings thousands of objects repeat (namespaces,
// finalizers, label keys, VPC names and UIDs, condition types and
// reasons) share one copy, so that a cache of many attachments stays
// small. Nothing is written back from a cached object but through the
// status subresource (which takes only the status) or a merge patch.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1alpha1.VPCAttachment:
		o.TypeMeta = metav1.TypeMeta{}
		slimMeta(&o.ObjectMeta, false)
		o.Spec.VPC = intern(o.Spec.VPC)
		o.Spec.ReclaimPolicy = v1alpha1.ReclaimPolicy(intern(string(o.Spec.ReclaimPolicy)))
		o.Spec.Announce = v1alpha1.Announce(intern(string(o.Spec.Announce)))
		for i, f := range o.Spec.IPFamilies {
			o.Spec.IPFamilies[i] = v1alpha1.IPFamily(intern(string(f)))
		}
		if d := o.Status.Dataplane; d != nil {
			d.VPC = intern(d.VPC)
		}
		if h := o.Status.Holder; h != nil {
			h.Node = intern(h.Node)
		}
		slimConditions(o.Status.Conditions)
	case *v1alpha1.VPCAddress:
		o.TypeMeta = metav1.TypeMeta{}
		slimMeta(&o.ObjectMeta, false)
		o.Spec.VPC = intern(o.Spec.VPC)
		o.Spec.VPCUID = types.UID(intern(string(o.Spec.VPCUID)))
		o.Spec.State = v1alpha1.AddressState(intern(string(o.Spec.State)))
	case *v1alpha1.VPC:
		o.TypeMeta = metav1.TypeMeta{}
		slimMeta(&o.ObjectMeta, false)
		slimConditions(o.Status.Conditions)
	case *v1alpha1.VNI:
		o.TypeMeta = metav1.TypeMeta{}
		slimMeta(&o.ObjectMeta, false)
	case *v1alpha1.BGPAdvertisement:
		o.TypeMeta = metav1.TypeMeta{}
		slimMeta(&o.ObjectMeta, false)
	case *coordinationv1.Lease:
		// The availability report is in the lease's annotations.
		o.TypeMeta = metav1.TypeMeta{}
		slimMeta(&o.ObjectMeta, true)
	}
	return obj, nil
}

func slimMeta(m *metav1.ObjectMeta, keepAnnotations bool) {
	m.ManagedFields = nil
	if !keepAnnotations {
		m.Annotations = nil
	}
	m.Namespace = intern(m.Namespace)
	for i, f := range m.Finalizers {
		m.Finalizers[i] = intern(f)
	}
	if len(m.Labels) > 0 {
		labels := make(map[string]string, len(m.Labels))
		for k, v := range m.Labels {
			if k == v1alpha1.LabelAttachmentUID {
				labels[intern(k)] = v
			} else {
				labels[intern(k)] = intern(v)
			}
		}
		m.Labels = labels
	}
}

// constantMessages are the reasons whose message is the same for every
// attachment.
var constantMessages = map[string]bool{v1alpha1.ReasonNotAttached: true, v1alpha1.ReasonNoHolder: true}

func slimConditions(cs []metav1.Condition) {
	for i := range cs {
		c := &cs[i]
		c.Type, c.Reason = intern(c.Type), intern(c.Reason)
		c.Status = metav1.ConditionStatus(intern(string(c.Status)))
		if constantMessages[c.Reason] {
			c.Message = intern(c.Message)
		}
	}
}

// intern returns the one shared copy of s; copies nothing references any
// more are collected.
func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
