package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// maxVNIAttempts bounds the candidates one pass tries when the API server
// keeps saying they exist (another controller allocating at once); the
// next pass goes on.
const maxVNIAttempts = 64

// syncVPC reconciles one VPC: its finalizer, its VNI and its status; once
// it is deleted and no attachment names it, its reservations and VNI are
// released and it goes.
func (c *Controller) syncVPC(ctx context.Context, k string) (time.Duration, error) {
	vpc := cached[v1alpha1.VPC](c.vpcInf, k)
	if vpc == nil {
		return 0, nil
	}
	vpc = c.vpcWrites.resolve(k, vpc)
	if vpc.DeletionTimestamp != nil {
		return 0, c.releaseVPC(ctx, vpc)
	}
	if adopting(vpc.Labels) && vpc.Status.DataplaneName == "" {
		// adopt names it after its inline routing domain first.
		return 0, nil
	}
	now := metav1.NewTime(c.clock.Now())
	if _, err := parseNetworks(vpc.Spec.Networks); err != nil {
		return 0, c.writeVPCStatus(ctx, vpc, desiredVPCStatus(vpcStatusInputs{VPC: vpc,
			Problem: &problem{v1alpha1.ReasonInvalidNetworks, err.Error()}, Now: now}))
	}
	if !slices.Contains(vpc.Finalizers, v1alpha1.FinalizerVPC) {
		out, err := c.o.Clients.VPCs(vpc.Namespace).Patch(ctx, vpc.Name, types.MergePatchType,
			finalizerPatch(vpc.ResourceVersion, append(slices.Clone(vpc.Finalizers), v1alpha1.FinalizerVPC)), metav1.PatchOptions{})
		if err != nil {
			return 0, fmt.Errorf("adding the finalizer to VPC %s: %w", k, err)
		}
		c.vpcWrites.wrote(k, vpc.ResourceVersion, out)
		vpc = out
	}
	vni, prob, err := c.vniFor(ctx, vpc)
	if err != nil {
		return 0, err
	}
	c.vniWait.set("", k, prob != nil && prob.Reason == v1alpha1.ReasonVNIConflict)
	return 0, c.writeVPCStatus(ctx, vpc, desiredVPCStatus(vpcStatusInputs{VPC: vpc, VNI: vni, Problem: prob, Now: now}))
}

// heldVNIs are the VNI objects that name the VPC's UID: the cache's and
// this process's creates the cache has not shown.
func (c *Controller) heldVNIs(vpc *v1alpha1.VPC) []*v1alpha1.VNI {
	held := byIndex[*v1alpha1.VNI](c.vniInf, byVPCUID, string(vpc.UID))
	for _, v := range c.vniClaim.owned(vpc.UID) {
		if !slices.ContainsFunc(held, func(h *v1alpha1.VNI) bool { return h.Name == v.Name }) {
			held = append(held, v)
		}
	}
	return held
}

// vniFor returns the VPC's VNI, claiming one when it has none: the
// requested one (VNIConflict when another VPC holds it), else the lowest
// free one of the range that no VNI object and no advertisement uses.
// Extra VNIs a race left the VPC holding, never published, are released.
func (c *Controller) vniFor(ctx context.Context, vpc *v1alpha1.VPC) (int32, *problem, error) {
	held := c.heldVNIs(vpc)
	want := vpc.Status.VNI
	if vpc.Spec.VNI != nil {
		want = *vpc.Spec.VNI
	}
	var have int32
	for _, v := range held {
		n := vniValue(v)
		if n == want || (want == 0 && (have == 0 || n < have)) {
			have = n
		}
	}
	for _, v := range held {
		if n := vniValue(v); n != have && n != vpc.Status.VNI && v.Spec.ReleasedAt == nil {
			err := c.o.Clients.VNIs().Delete(ctx, v.Name, preconditions(v.UID, v.ResourceVersion))
			if err != nil && !apierrors.IsNotFound(err) {
				return 0, nil, fmt.Errorf("releasing VNI %s that VPC %s/%s does not use: %w", v.Name, vpc.Namespace, vpc.Name, err)
			}
		}
	}
	if have != 0 {
		return have, nil, nil
	}
	if vpc.Spec.VNI != nil {
		return c.claimRequestedVNI(ctx, vpc, *vpc.Spec.VNI)
	}
	return c.claimFreeVNI(ctx, vpc)
}

func vniValue(v *v1alpha1.VNI) int32 {
	var n int32
	_, _ = fmt.Sscan(v.Name, &n)
	return n
}

func vniObject(vpc *v1alpha1.VPC, n int32) *v1alpha1.VNI {
	return &v1alpha1.VNI{
		ObjectMeta: objectMeta("", names.VNIName(n), nil, ""),
		Spec:       v1alpha1.VNISpec{Namespace: vpc.Namespace, VPC: vpc.Name, VPCUID: vpc.UID},
	}
}

func (c *Controller) claimRequestedVNI(ctx context.Context, vpc *v1alpha1.VPC, n int32) (int32, *problem, error) {
	name := names.VNIName(n)
	if cur := cached[v1alpha1.VNI](c.vniInf, name); cur != nil && cur.Spec.VPCUID != vpc.UID {
		return 0, vniConflict(n, cur), nil
	}
	obj, err := c.o.Clients.VNIs().Create(ctx, vniObject(vpc, n), metav1.CreateOptions{})
	if err == nil {
		c.vniClaim.created(name, vpc.UID, obj)
		c.m.allocated("vni")
		return n, nil, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return 0, nil, fmt.Errorf("claiming VNI %d for VPC %s/%s: %w", n, vpc.Namespace, vpc.Name, err)
	}
	c.m.conflict("vni")
	cur, err := c.o.Clients.VNIs().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, nil, fmt.Errorf("reading VNI %s: %w", name, err)
	}
	if cur.Spec.VPCUID == vpc.UID {
		return n, nil, nil
	}
	return 0, vniConflict(n, cur), nil
}

func vniConflict(n int32, holder *v1alpha1.VNI) *problem {
	msg := fmt.Sprintf("VNI %d is held by VPC %s/%s", n, holder.Spec.Namespace, holder.Spec.VPC)
	if holder.Spec.ReleasedAt != nil {
		msg = fmt.Sprintf("VNI %d was released by VPC %s/%s at %s and is held until nothing of it remains", n, holder.Spec.Namespace, holder.Spec.VPC, holder.Spec.ReleasedAt.UTC().Format(time.RFC3339))
	}
	return &problem{v1alpha1.ReasonVNIConflict, msg + ": create a VPC without spec.vni, or with another one"}
}

// claimFreeVNI creates the VNI object of the lowest value of the range
// that no VNI object, claim or advertisement uses.
func (c *Controller) claimFreeVNI(ctx context.Context, vpc *v1alpha1.VPC) (int32, *problem, error) {
	n := c.o.VNIMin
	for attempts := 0; attempts < maxVNIAttempts; n++ {
		if n > c.o.VNIMax || n < c.o.VNIMin {
			return 0, &problem{v1alpha1.ReasonVNIConflict, fmt.Sprintf("every VNI of the controller's range %d-%d is in use: delete a VPC, or widen --vni-range", c.o.VNIMin, c.o.VNIMax)}, nil
		}
		name := names.VNIName(n)
		if _, exists, _ := c.vniInf.GetIndexer().GetByKey(name); exists || c.vniClaim.has(name) {
			continue
		}
		if uses, _ := c.advInf.GetIndexer().IndexKeys(byVNI, name); len(uses) > 0 {
			continue
		}
		if !c.vniClaim.reserve(name, vpc.UID) {
			continue
		}
		attempts++
		obj, err := c.o.Clients.VNIs().Create(ctx, vniObject(vpc, n), metav1.CreateOptions{})
		switch {
		case err == nil:
			c.vniClaim.created(name, vpc.UID, obj)
			c.m.allocated("vni")
			return n, nil, nil
		case apierrors.IsAlreadyExists(err):
			c.vniClaim.taken(name)
			c.m.conflict("vni")
		default:
			c.vniClaim.drop(name)
			return 0, nil, fmt.Errorf("claiming VNI %d for VPC %s/%s: %w", n, vpc.Namespace, vpc.Name, err)
		}
	}
	return 0, nil, fmt.Errorf("claiming a VNI for VPC %s/%s: %d candidates were taken meanwhile", vpc.Namespace, vpc.Name, maxVNIAttempts)
}

func (c *Controller) writeVPCStatus(ctx context.Context, vpc *v1alpha1.VPC, desired v1alpha1.VPCStatus) error {
	if statusEqual(vpc.Status, desired) {
		return nil
	}
	upd := vpc.DeepCopy()
	upd.Status = desired
	out, err := c.o.Clients.VPCs(vpc.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("writing the status of VPC %s/%s: %w", vpc.Namespace, vpc.Name, err)
	}
	c.vpcWrites.wrote(key(vpc.Namespace, vpc.Name), vpc.ResourceVersion, out)
	return nil
}

// releaseVPC ends a deleted VPC: it waits while attachments name it, then
// deletes its addresses (reservations included), marks its VNI released
// (the VNI object stays for the hold time) and removes its finalizer.
func (c *Controller) releaseVPC(ctx context.Context, vpc *v1alpha1.VPC) error {
	if !slices.Contains(vpc.Finalizers, v1alpha1.FinalizerVPC) {
		return nil
	}
	k := key(vpc.Namespace, vpc.Name)
	if atts := byIndexKeys(c.attInf, byVPC, k); len(atts) > 0 {
		waiting := make([]string, len(atts))
		for i, a := range atts {
			_, waiting[i], _ = cutKey(a)
		}
		sort.Strings(waiting)
		return c.writeVPCStatus(ctx, vpc, desiredVPCStatus(vpcStatusInputs{VPC: vpc, Waiting: waiting, Now: metav1.NewTime(c.clock.Now())}))
	}
	for _, a := range byIndex[*v1alpha1.VPCAddress](c.addrInf, byVPCUID, string(vpc.UID)) {
		if err := c.deleteAddress(ctx, a); err != nil {
			return err
		}
	}
	now := metav1.NewTime(c.clock.Now())
	for _, v := range c.heldVNIs(vpc) {
		if v.Spec.ReleasedAt != nil {
			continue
		}
		if err := c.releaseVNI(ctx, v, now); err != nil {
			return fmt.Errorf("releasing VNI %s of VPC %s: %w", v.Name, k, err)
		}
	}
	out, err := c.o.Clients.VPCs(vpc.Namespace).Patch(ctx, vpc.Name, types.MergePatchType,
		finalizerPatch(vpc.ResourceVersion, without(vpc.Finalizers, v1alpha1.FinalizerVPC)), metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing the finalizer of VPC %s: %w", k, err)
	}
	c.vpcWrites.wrote(k, vpc.ResourceVersion, out)
	c.log.Info("VPC released", "namespace", vpc.Namespace, "name", vpc.Name, "uid", vpc.UID, "vni", vpc.Status.VNI)
	return nil
}

// releaseVNI marks a VNI released at now (resourceVersion-guarded).
func (c *Controller) releaseVNI(ctx context.Context, v *v1alpha1.VNI, now metav1.Time) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": v.ResourceVersion},
		"spec": map[string]any{"releasedAt": now}})
	_, err := c.o.Clients.VNIs().Patch(ctx, v.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func cutKey(k string) (namespace, name string, ok bool) {
	for i := range len(k) {
		if k[i] == '/' {
			return k[:i], k[i+1:], true
		}
	}
	return "", k, false
}

// objectMeta is the metadata of an object the controller creates.
func objectMeta(namespace, name string, labels map[string]string, finalizer string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels}
	if finalizer != "" {
		m.Finalizers = []string{finalizer}
	}
	return m
}
