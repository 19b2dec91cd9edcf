package controller

import (
	"maps"
	"strconv"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// handle maps every informer event to the keys it may change. Events
// queue keys whether or not this process leads, so a standby that takes
// over has them queued already.
func (c *Controller) handle() error {
	on := func(inf cache.SharedIndexInformer, add func(any), update func(old, cur any), del func(any)) error {
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.events.Add(1); add(obj) },
			UpdateFunc: func(old, cur any) { c.events.Add(1); update(old, cur) },
			DeleteFunc: func(obj any) {
				c.events.Add(1)
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				del(obj)
			},
		})
		return err
	}
	errs := []error{
		on(c.vpcInf, func(o any) { c.vpcChanged(nil, o.(*v1alpha1.VPC)) },
			func(old, cur any) { c.vpcChanged(old.(*v1alpha1.VPC), cur.(*v1alpha1.VPC)) },
			func(o any) { c.vpcGone(o.(*v1alpha1.VPC)) }),
		on(c.attInf, func(o any) { c.attChanged(o.(*v1alpha1.VPCAttachment)) },
			func(_, cur any) { c.attChanged(cur.(*v1alpha1.VPCAttachment)) },
			func(o any) { c.attGone(o.(*v1alpha1.VPCAttachment)) }),
		on(c.addrInf, func(o any) { c.addrChanged(o.(*v1alpha1.VPCAddress), false) },
			func(_, cur any) { c.addrChanged(cur.(*v1alpha1.VPCAddress), false) },
			func(o any) { c.addrChanged(o.(*v1alpha1.VPCAddress), true) }),
		on(c.vniInf, func(o any) { c.vniChanged(o.(*v1alpha1.VNI), false) },
			func(_, cur any) { c.vniChanged(cur.(*v1alpha1.VNI), false) },
			func(o any) { c.vniChanged(o.(*v1alpha1.VNI), true) }),
		on(c.leaseInf, func(o any) { c.leaseChanged(nil, o.(*coordinationv1.Lease), false) },
			func(old, cur any) { c.leaseChanged(old.(*coordinationv1.Lease), cur.(*coordinationv1.Lease), false) },
			func(o any) { c.leaseChanged(nil, o.(*coordinationv1.Lease), true) }),
		on(c.advInf, func(o any) { c.advChanged(o.(*v1alpha1.BGPAdvertisement), false) },
			func(_, cur any) { c.advChanged(cur.(*v1alpha1.BGPAdvertisement), false) },
			func(o any) { c.advChanged(o.(*v1alpha1.BGPAdvertisement), true) }),
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// vpcChanged queues the VPC, and its attachments when what they read of
// it changed (readiness, VNI, names, networks, deletion).
func (c *Controller) vpcChanged(old, cur *v1alpha1.VPC) {
	k := key(cur.Namespace, cur.Name)
	c.vpcQ.Add(k)
	if old != nil && old.ResourceVersion == cur.ResourceVersion {
		return
	}
	if old == nil || !sameForAttachments(old, cur) {
		c.queueAttachmentsOf(k)
	}
}

func sameForAttachments(a, b *v1alpha1.VPC) bool {
	ready := func(v *v1alpha1.VPC) bool {
		return meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.ConditionReady)
	}
	return a.UID == b.UID && ready(a) == ready(b) && a.Status.VNI == b.Status.VNI && a.Status.DataplaneName == b.Status.DataplaneName &&
		(a.DeletionTimestamp == nil) == (b.DeletionTimestamp == nil) && equality.Semantic.DeepEqual(a.Spec.Networks, b.Spec.Networks)
}

func (c *Controller) vpcGone(v *v1alpha1.VPC) {
	k := key(v.Namespace, v.Name)
	c.vpcWrites.forget(k)
	c.pools.forget(v.UID)
	c.vniWait.set("", k, false)
	c.vpcQ.Add(k)
	c.queueAttachmentsOf(k)
}

func (c *Controller) queueAttachmentsOf(vpcKey string) {
	for _, k := range byIndexKeys(c.attInf, byVPC, vpcKey) {
		c.attQ.Add(k)
	}
}

func byIndexKeys(inf cache.SharedIndexInformer, index, value string) []string {
	keys, _ := inf.GetIndexer().IndexKeys(index, value)
	return keys
}

func (c *Controller) attChanged(a *v1alpha1.VPCAttachment) {
	k := key(a.Namespace, a.Name)
	c.attUIDs.set(a.UID, k)
	c.attQ.Add(k)
}

// attGone lets a deleted VPC that waited for the attachment go on.
func (c *Controller) attGone(a *v1alpha1.VPCAttachment) {
	k := key(a.Namespace, a.Name)
	c.attUIDs.drop(a.UID)
	c.attWrites.forget(k)
	c.poolWait.set(key(a.Namespace, a.Spec.VPC), k, false)
	c.attQ.Add(k)
	c.vpcQ.Add(key(a.Namespace, a.Spec.VPC))
}

// addrChanged queues the address, the attachment it is bound to, and an
// attachment of its name (which may bind a reservation). A deleted
// address frees a value of its VPC: the attachments waiting for one are
// queued.
func (c *Controller) addrChanged(a *v1alpha1.VPCAddress, gone bool) {
	k := key(a.Namespace, a.Name)
	c.addrClaim.drop(k)
	c.addrQ.Add(k)
	if uid := a.Labels[v1alpha1.LabelAttachmentUID]; uid != "" {
		if att := c.attachmentByUID(types.UID(uid)); att != nil {
			c.attQ.Add(key(att.Namespace, att.Name))
		}
	}
	if a.Spec.Attachment != "" {
		c.attQ.Add(key(a.Namespace, a.Spec.Attachment))
	}
	if gone || a.Spec.State == v1alpha1.AddressRetained {
		vpc := key(a.Namespace, a.Spec.VPC)
		if gone {
			c.pools.reset(a.Spec.VPCUID)
		}
		for _, w := range c.poolWait.take(vpc) {
			c.attQ.Add(w)
		}
		c.vpcQ.Add(vpc)
	}
}

// vniChanged queues the VNI and its VPC; a deleted VNI may be what a VPC
// requesting it waits for.
func (c *Controller) vniChanged(v *v1alpha1.VNI, gone bool) {
	c.vniClaim.drop(v.Name)
	c.vniQ.Add(v.Name)
	c.vpcQ.Add(key(v.Spec.Namespace, v.Spec.VPC))
	if gone {
		for _, w := range c.vniWait.take("") {
			c.vpcQ.Add(w)
		}
	}
}

// leaseChanged records when this process saw the lease's version (a
// holder expires by that) and queues its attachment when what the status
// shows of it changed: holder, token, availability report, labels. A
// renewal changes none of them.
func (c *Controller) leaseChanged(old, cur *coordinationv1.Lease, gone bool) {
	k := key(cur.Namespace, cur.Name)
	if gone {
		c.leaseSeen.forget(k)
	} else {
		c.leaseSeen.observe(k, cur.ResourceVersion, c.clock.Now())
	}
	if old != nil && sameForStatus(old, cur) {
		return
	}
	for _, l := range []*coordinationv1.Lease{old, cur} {
		if l != nil {
			c.projectAttachmentUID(l.Labels[v1alpha1.LabelAttachmentUID])
		}
	}
}

func sameForStatus(a, b *coordinationv1.Lease) bool {
	p := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	n := func(i *int32) int32 {
		if i == nil {
			return 0
		}
		return *i
	}
	return p(a.Spec.HolderIdentity) == p(b.Spec.HolderIdentity) && n(a.Spec.LeaseTransitions) == n(b.Spec.LeaseTransitions) &&
		n(a.Spec.LeaseDurationSeconds) == n(b.Spec.LeaseDurationSeconds) &&
		maps.Equal(a.Annotations, b.Annotations) && maps.Equal(a.Labels, b.Labels)
}

// projectAttachmentUID queues the attachment of a lease or advertisement
// that changed, after the status batch period unless it is being deleted
// (its finalizer waits for the holder's release). A key already waiting
// keeps its earlier time, so the batch delays a projection by at most
// the period.
func (c *Controller) projectAttachmentUID(uid string) {
	if uid == "" {
		return
	}
	att := c.attachmentByUID(types.UID(uid))
	if att == nil {
		return
	}
	k := key(att.Namespace, att.Name)
	if c.o.StatusBatch <= 0 || att.DeletionTimestamp != nil {
		c.attQ.Add(k)
		return
	}
	c.attQ.AddAfter(k, c.o.StatusBatch)
}

// advChanged queues the attachment an advertisement is labelled with and,
// when it goes, the VNI it used (a released VNI waits for its last one).
func (c *Controller) advChanged(a *v1alpha1.BGPAdvertisement, gone bool) {
	c.projectAttachmentUID(a.Labels[v1alpha1.LabelAttachmentUID])
	if gone && a.Spec.VNI != 0 {
		c.vniQ.Add(strconv.Itoa(int(a.Spec.VNI)))
	}
}

// leaseName is the handoff lease name of an attachment with data-plane
// names.
func leaseName(dp *v1alpha1.Dataplane) string {
	if dp == nil {
		return ""
	}
	return names.Lease(dp.VPC, dp.Attachment)
}
