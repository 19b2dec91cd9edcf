package controller

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// vniAction is what becomes of a VNI object.
type vniAction int

const (
	vniKeep vniAction = iota
	// vniRelease: its VPC is gone without releasing it; mark it released.
	vniRelease
	// vniDelete: released, held long enough, and no advertisement uses it.
	vniDelete
)

// decideVNI is the fate of a VNI object. vpcExists says whether the VPC
// of its UID exists; inUse whether an advertisement carries the VNI. It
// returns how long to wait before the hold ends, when that is what
// keeps it.
func decideVNI(v *v1alpha1.VNI, vpcExists, inUse bool, hold time.Duration, now time.Time) (vniAction, time.Duration) {
	if v.Spec.ReleasedAt == nil {
		if vpcExists {
			return vniKeep, 0
		}
		return vniRelease, 0
	}
	if left := v.Spec.ReleasedAt.Add(hold).Sub(now); left > 0 {
		return vniKeep, left
	}
	if inUse {
		return vniKeep, 0
	}
	return vniDelete, 0
}

// syncVNI releases the VNI of a VPC that went without releasing it and
// deletes released VNIs once the hold time has passed and no
// advertisement uses them, so nothing of the old VPC meets a new one.
func (c *Controller) syncVNI(ctx context.Context, name string) (time.Duration, error) {
	v := cached[v1alpha1.VNI](c.vniInf, name)
	if v == nil {
		return 0, nil
	}
	uses, _ := c.advInf.GetIndexer().IndexKeys(byVNI, name)
	exists := v.Spec.ReleasedAt != nil || c.vpcExists(ctx, v.Spec.Namespace, v.Spec.VPC, v.Spec.VPCUID)
	now := c.clock.Now()
	action, wait := decideVNI(v, exists, len(uses) > 0, c.o.VNIHold, now)
	switch action {
	case vniRelease:
		if err := c.releaseVNI(ctx, v, metav1.NewTime(now)); err != nil {
			return 0, fmt.Errorf("releasing VNI %s of the deleted VPC %s/%s: %w", name, v.Spec.Namespace, v.Spec.VPC, err)
		}
		return c.o.VNIHold, nil
	case vniDelete:
		err := c.o.Clients.VNIs().Delete(ctx, name, preconditions(v.UID, v.ResourceVersion))
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("deleting the released VNI %s: %w", name, err)
		}
		c.log.Info("VNI free again", "vni", name, "vpc", v.Spec.Namespace+"/"+v.Spec.VPC)
	}
	return wait, nil
}

// vpcExists reports whether the VPC of a UID exists. The cache answers
// yes; a no is confirmed by a read, since a VPC is never released on a
// guess.
func (c *Controller) vpcExists(ctx context.Context, namespace, name string, uid types.UID) bool {
	if vs := byIndex[*v1alpha1.VPC](c.vpcInf, byUID, string(uid)); len(vs) > 0 {
		return true
	}
	cur, err := c.o.Clients.VPCs(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return !apierrors.IsNotFound(err)
	}
	return cur.UID == uid
}

// attachmentExists is vpcExists for attachments.
func (c *Controller) attachmentExists(ctx context.Context, namespace, name string, uid types.UID) bool {
	if c.attachmentByUID(uid) != nil {
		return true
	}
	cur, err := c.o.Clients.VPCAttachments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return !apierrors.IsNotFound(err)
	}
	return cur.UID == uid
}

// syncAddress releases a VPCAddress left behind: one bound to an
// attachment that no longer exists (a claim that raced the attachment's
// deletion), or a reservation of a VPC that no longer exists.
func (c *Controller) syncAddress(ctx context.Context, k string) (time.Duration, error) {
	a := cached[v1alpha1.VPCAddress](c.addrInf, k)
	if a == nil {
		return 0, nil
	}
	switch a.Spec.State {
	case v1alpha1.AddressBound:
		if c.addrClaim.has(k) || c.attachmentExists(ctx, a.Namespace, a.Spec.Attachment, a.Spec.AttachmentUID) {
			return 0, nil
		}
	default:
		if c.vpcExists(ctx, a.Namespace, a.Spec.VPC, a.Spec.VPCUID) {
			return 0, nil
		}
	}
	c.log.Info("releasing a VPCAddress whose owner is gone", "namespace", a.Namespace, "name", a.Name,
		"attachment", a.Spec.Attachment, "attachmentUID", a.Spec.AttachmentUID, "vpc", a.Spec.VPC)
	return 0, c.deleteAddress(ctx, a)
}
