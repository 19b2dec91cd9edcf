package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// attachment is the newest known version of an attachment: the cache's,
// or this process's own write the cache has not shown yet.
func (c *Controller) attachment(k string) *v1alpha1.VPCAttachment {
	a := cached[v1alpha1.VPCAttachment](c.attInf, k)
	if a == nil {
		return nil
	}
	return c.attWrites.resolve(k, a)
}

// syncAttachment reconciles one attachment: its addresses, its finalizer
// and its status; once it is deleted and free, its reclaim policy. It
// returns when to look again (a holder's expiry), 0 for never.
func (c *Controller) syncAttachment(ctx context.Context, k string) (time.Duration, error) {
	att := c.attachment(k)
	if att == nil {
		return 0, nil
	}
	now := c.clock.Now()
	hs := c.holderOf(att, now)
	if att.DeletionTimestamp != nil {
		return c.reclaim(ctx, att, hs)
	}
	if adopting(att.Labels) && att.Status.Dataplane == nil {
		// adopt names it after its inline host interface first.
		return 0, nil
	}
	vpcKey := key(att.Namespace, att.Spec.VPC)
	vpc, nets, prob := c.readyVPC(att)
	var addrs []v1alpha1.Prefix
	if prob == nil {
		var err error
		addrs, prob, err = c.allocate(ctx, &att, vpc, nets)
		if err != nil {
			return 0, err
		}
	} else {
		// Without a usable VPC nothing new is claimed; what is bound
		// stays published.
		addrs = att.Status.Addresses
	}
	waiting := prob != nil && (prob.Reason == v1alpha1.ReasonPoolExhausted || prob.Reason == v1alpha1.ReasonAddressInUse)
	c.poolWait.set(vpcKey, k, waiting)
	if prob != nil {
		vpc = nil
	}
	desired := desiredAttachmentStatus(attachmentStatusInputs{Attachment: att, VPC: vpc, Problem: prob, Addresses: addrs, Holder: hs, Now: metav1.NewTime(now)})
	if err := c.writeAttachmentStatus(ctx, att, desired); err != nil {
		return 0, err
	}
	return hs.ExpiresIn, nil
}

// adopting says whether an object is adopt's; until adopt has written
// its inline data-plane names the controller leaves it alone, so no other
// name is ever published for it.
func adopting(labels map[string]string) bool {
	return labels[v1alpha1.LabelAdopted] == "true"
}

// readyVPC is the attachment's VPC and its networks when it is Ready;
// otherwise the problem that says why the attachment waits.
func (c *Controller) readyVPC(att *v1alpha1.VPCAttachment) (*v1alpha1.VPC, []netip.Prefix, *problem) {
	vpc := cached[v1alpha1.VPC](c.vpcInf, key(att.Namespace, att.Spec.VPC))
	if vpc == nil {
		return nil, nil, &problem{v1alpha1.ReasonVPCNotFound, fmt.Sprintf("VPC %s does not exist in namespace %s: create it, or create a VPCAttachment naming an existing VPC", att.Spec.VPC, att.Namespace)}
	}
	vpc = c.vpcWrites.resolve(key(vpc.Namespace, vpc.Name), vpc)
	if vpc.DeletionTimestamp != nil {
		return nil, nil, &problem{v1alpha1.ReasonVPCNotReady, fmt.Sprintf("VPC %s is being deleted", vpc.Name)}
	}
	ready := meta.FindStatusCondition(vpc.Status.Conditions, v1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || vpc.Status.VNI == 0 || vpc.Status.DataplaneName == "" {
		why := "it has no VNI yet"
		if ready != nil && ready.Status == metav1.ConditionFalse {
			why = ready.Reason + ": " + ready.Message
		}
		return nil, nil, &problem{v1alpha1.ReasonVPCNotReady, fmt.Sprintf("VPC %s is not ready (%s)", vpc.Name, why)}
	}
	nets, err := parseNetworks(vpc.Spec.Networks)
	if err != nil {
		return nil, nil, &problem{v1alpha1.ReasonVPCNotReady, fmt.Sprintf("VPC %s is not ready (%s)", vpc.Name, err)}
	}
	return vpc, nets, nil
}

// boundTo are the VPCAddresses bound to an attachment: the cache's and
// those this process created that the cache has not shown.
func (c *Controller) boundTo(uid types.UID) []*v1alpha1.VPCAddress {
	out := byIndex[*v1alpha1.VPCAddress](c.addrInf, byAttachmentUID, string(uid))
	for _, a := range c.addrClaim.owned(uid) {
		if !slices.ContainsFunc(out, func(b *v1alpha1.VPCAddress) bool { return b.Name == a.Name }) {
			out = append(out, a)
		}
	}
	return out
}

// allocate carries out the attachment's address plan: the finalizer first
// (nothing is claimed for an attachment that could vanish without its
// reclaim), then reservations bound, requests and families claimed. It
// returns the addresses for the status and the problem, if any.
func (c *Controller) allocate(ctx context.Context, attp **v1alpha1.VPCAttachment, vpc *v1alpha1.VPC, nets []netip.Prefix) ([]v1alpha1.Prefix, *problem, error) {
	att := *attp
	bound := c.boundTo(att.UID)
	var boundAddrs []netip.Addr
	for _, b := range bound {
		if b.Spec.VPCUID != vpc.UID {
			continue
		}
		if a, err := netip.ParseAddr(string(b.Spec.Address)); err == nil {
			boundAddrs = append(boundAddrs, a)
		}
	}
	in := addressInputs{
		Name: att.Name, VPC: vpc.Name, UID: att.UID,
		Requests: att.Spec.Addresses, Families: att.Spec.IPFamilies, Networks: nets,
		Bound: boundAddrs, Published: att.Status.Addresses,
		Retained: byIndex[*v1alpha1.VPCAddress](c.addrInf, byRetained, string(vpc.UID)+"/"+att.Name),
		Holders:  map[netip.Addr]*v1alpha1.VPCAddress{},
	}
	for _, r := range att.Spec.Addresses {
		if a, err := netip.ParseAddr(string(r)); err == nil {
			if h := cached[v1alpha1.VPCAddress](c.addrInf, key(att.Namespace, names.VPCAddressName(vpc.Name, a))); h != nil {
				in.Holders[a] = h
			}
		}
	}
	plan := planAddresses(in)
	for _, a := range plan.Release {
		if err := c.releaseAddress(ctx, att.Namespace, names.VPCAddressName(vpc.Name, a), bound); err != nil {
			return nil, nil, err
		}
	}
	have := func() []netip.Addr {
		var out []netip.Addr
		for _, s := range plan.Slots {
			if s.Have.IsValid() {
				out = append(out, s.Have)
			}
		}
		return out
	}
	if plan.Problem != nil {
		return statusAddresses(have(), nets), plan.Problem, nil
	}
	// installer/manifests/attachment-admission.yaml puts the finalizer on
	// at creation; without that policy it costs a write here.
	if !slices.Contains(att.Finalizers, v1alpha1.FinalizerAttachment) {
		out, err := c.o.Clients.VPCAttachments(att.Namespace).Patch(ctx, att.Name, types.MergePatchType,
			finalizerPatch(att.ResourceVersion, append(slices.Clone(att.Finalizers), v1alpha1.FinalizerAttachment)), metav1.PatchOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("adding the finalizer to VPCAttachment %s/%s: %w", att.Namespace, att.Name, err)
		}
		c.attWrites.wrote(key(att.Namespace, att.Name), att.ResourceVersion, out)
		att, *attp = out, out
	}
	var prob *problem
	for i := range plan.Slots {
		s := &plan.Slots[i]
		if s.Have.IsValid() {
			continue
		}
		var err error
		switch {
		case s.Bind != nil:
			err = c.bindReservation(ctx, att, s.Bind)
			if err == nil {
				s.Have, _ = netip.ParseAddr(string(s.Bind.Spec.Address))
			}
		case s.Request.IsValid():
			var p *problem
			p, err = c.claimRequest(ctx, att, vpc, i, s.Request)
			if p != nil && prob == nil {
				prob = p
			}
			if p == nil && err == nil {
				s.Have = s.Request
			}
		default:
			var a netip.Addr
			a, err = c.claimFree(ctx, att, vpc, s.Networks)
			if err == nil && !a.IsValid() && prob == nil {
				prob = &problem{v1alpha1.ReasonPoolExhausted, fmt.Sprintf("no free %s address left in VPC %s (%s): delete an attachment of the VPC, or add a network to it", s.Family, vpc.Name, poolSizes(s.Networks))}
			}
			s.Have = a
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return statusAddresses(have(), nets), prob, nil
}

func poolSizes(nets []netip.Prefix) string {
	out := ""
	for i, n := range nets {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s has %s usable", n, usableCount(n))
	}
	return out
}

// claimRequest creates the VPCAddress of a requested address. When the
// API server says it exists, the live object decides: ours already, a
// reservation of this name to bind, or another's (AddressInUse).
func (c *Controller) claimRequest(ctx context.Context, att *v1alpha1.VPCAttachment, vpc *v1alpha1.VPC, i int, a netip.Addr) (*problem, error) {
	name := names.VPCAddressName(vpc.Name, a)
	k := key(att.Namespace, name)
	cl := c.o.Clients.VPCAddresses(att.Namespace)
	if !c.addrClaim.reserve(k, att.UID) {
		// Another worker is claiming it: look again once it is done.
		return nil, fmt.Errorf("%s is being claimed by another attachment", a)
	}
	obj, err := cl.Create(ctx, addressObject(att.Namespace, vpc.Name, vpc.UID, a, att.Name, att.UID), metav1.CreateOptions{})
	if err == nil {
		c.addrClaim.created(k, att.UID, obj)
		c.m.allocated("address")
		return nil, nil
	}
	c.addrClaim.drop(k)
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("claiming %s for VPCAttachment %s/%s: %w", a, att.Namespace, att.Name, err)
	}
	c.m.conflict("address")
	cur, err := cl.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading VPCAddress %s/%s: %w", att.Namespace, name, err)
	}
	switch {
	case cur.Spec.AttachmentUID == att.UID:
		return nil, nil
	case cur.Spec.State == v1alpha1.AddressRetained && cur.Spec.Attachment == att.Name && cur.Spec.VPCUID == vpc.UID:
		return nil, c.bindReservation(ctx, att, cur)
	}
	return &problem{v1alpha1.ReasonAddressInUse, heldMessage(i, a, cur, att.Name)}, nil
}

// claimFree claims the lowest free address of the first network that has
// one: the candidate is chosen under the VPC's pool lock from the cache
// and this process's claims, then created; a candidate the API server
// says exists (another controller's claim) is skipped. It returns the
// zero address when every network is full.
func (c *Controller) claimFree(ctx context.Context, att *v1alpha1.VPCAttachment, vpc *v1alpha1.VPC, nets []netip.Prefix) (netip.Addr, error) {
	p := c.pools.get(vpc.UID)
	cl := c.o.Clients.VPCAddresses(att.Namespace)
	for _, n := range nets {
		for {
			var k string
			p.mu.Lock()
			a, ok := nextFree(n, p.hints[n], func(a netip.Addr) bool {
				ak := key(att.Namespace, names.VPCAddressName(vpc.Name, a))
				if c.addrClaim.has(ak) {
					return true
				}
				_, exists, _ := c.addrInf.GetIndexer().GetByKey(ak)
				return exists
			})
			if ok {
				k = key(att.Namespace, names.VPCAddressName(vpc.Name, a))
				p.hints[n] = a.Next()
			}
			p.mu.Unlock()
			if !ok {
				break
			}
			if !c.addrClaim.reserve(k, att.UID) {
				// A request took it since: try the next.
				continue
			}
			obj, err := cl.Create(ctx, addressObject(att.Namespace, vpc.Name, vpc.UID, a, att.Name, att.UID), metav1.CreateOptions{})
			switch {
			case err == nil:
				c.addrClaim.created(k, att.UID, obj)
				c.m.allocated("address")
				return a, nil
			case apierrors.IsAlreadyExists(err):
				c.addrClaim.taken(k)
				c.m.conflict("address")
			default:
				c.addrClaim.drop(k)
				c.pools.reset(vpc.UID)
				return netip.Addr{}, fmt.Errorf("claiming %s for VPCAttachment %s/%s: %w", a, att.Namespace, att.Name, err)
			}
		}
	}
	return netip.Addr{}, nil
}

// bindReservation hands a Retained reservation of the attachment's name
// to it (resourceVersion-guarded).
func (c *Controller) bindReservation(ctx context.Context, att *v1alpha1.VPCAttachment, r *v1alpha1.VPCAddress) error {
	finalizers := r.Finalizers
	if !slices.Contains(finalizers, v1alpha1.FinalizerAddress) {
		finalizers = append(slices.Clone(finalizers), v1alpha1.FinalizerAddress)
	}
	out, err := c.o.Clients.VPCAddresses(r.Namespace).Patch(ctx, r.Name, types.MergePatchType, mergePatch(r.ResourceVersion, finalizers,
		map[string]any{v1alpha1.LabelAttachmentUID: string(att.UID)},
		map[string]any{"state": v1alpha1.AddressBound, "attachmentUID": att.UID}), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("binding reservation %s/%s to VPCAttachment %s (UID %s): %w", r.Namespace, r.Name, att.Name, att.UID, err)
	}
	c.addrClaim.created(key(r.Namespace, r.Name), att.UID, out)
	c.m.allocated("address")
	return nil
}

// releaseAddress frees a bound address (finalizer off, then deleted with
// UID and resourceVersion preconditions). bound holds the objects known.
func (c *Controller) releaseAddress(ctx context.Context, namespace, name string, bound []*v1alpha1.VPCAddress) error {
	for _, b := range bound {
		if b.Name == name {
			return c.deleteAddress(ctx, b)
		}
	}
	return nil
}

// deleteAddress removes a VPCAddress: its protection finalizer first
// (guarded by the version read), then the object, guarded by UID and the
// version the first write returned.
func (c *Controller) deleteAddress(ctx context.Context, a *v1alpha1.VPCAddress) error {
	cl := c.o.Clients.VPCAddresses(a.Namespace)
	if i := slices.Index(a.Finalizers, v1alpha1.FinalizerAddress); i >= 0 {
		out, err := cl.Patch(ctx, a.Name, types.MergePatchType, finalizerPatch(a.ResourceVersion, slices.Delete(slices.Clone(a.Finalizers), i, i+1)), metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("releasing VPCAddress %s/%s: %w", a.Namespace, a.Name, err)
		}
		a = out
	}
	if a.DeletionTimestamp != nil && len(a.Finalizers) == 0 {
		return nil
	}
	err := cl.Delete(ctx, a.Name, preconditions(a.UID, a.ResourceVersion))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting VPCAddress %s/%s: %w", a.Namespace, a.Name, err)
	}
	c.addrClaim.drop(key(a.Namespace, a.Name))
	return nil
}

// finalizerPatch sets an object's finalizers, guarded by the
// resourceVersion read: a merge patch, so the rest of the object (a spec
// the typed client would round-trip imperfectly, what the cache does not
// keep) is not written.
func finalizerPatch(rv string, finalizers []string) []byte {
	return mergePatch(rv, finalizers, nil, nil)
}

// mergePatch is a JSON merge patch guarded by rv that sets the finalizers,
// the labels given (nil removes one) and the spec fields given.
func mergePatch(rv string, finalizers []string, labels, spec map[string]any) []byte {
	if finalizers == nil {
		finalizers = []string{}
	}
	meta := map[string]any{"resourceVersion": rv, "finalizers": finalizers}
	if labels != nil {
		meta["labels"] = labels
	}
	patch := map[string]any{"metadata": meta}
	if spec != nil {
		patch["spec"] = spec
	}
	b, _ := json.Marshal(patch)
	return b
}

func without(list []string, s string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(x string) bool { return x == s })
}

func preconditions(uid types.UID, rv string) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}
}

// writeAttachmentStatus writes the status when it differs from what the
// attachment shows (resourceVersion-guarded).
func (c *Controller) writeAttachmentStatus(ctx context.Context, att *v1alpha1.VPCAttachment, desired v1alpha1.VPCAttachmentStatus) error {
	if statusEqual(att.Status, desired) {
		return nil
	}
	upd := att.DeepCopy()
	upd.Status = desired
	out, err := c.o.Clients.VPCAttachments(att.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("writing the status of VPCAttachment %s/%s: %w", att.Namespace, att.Name, err)
	}
	c.attWrites.wrote(key(att.Namespace, att.Name), att.ResourceVersion, out)
	return nil
}

// holderOf derives the attachment's holder state from the cached lease
// and advertisements of its UID.
func (c *Controller) holderOf(att *v1alpha1.VPCAttachment, now time.Time) holderState {
	in := holderInputs{Deleting: att.DeletionTimestamp != nil, Now: now,
		Adverts: byIndex[*v1alpha1.BGPAdvertisement](c.advInf, byAttachmentUID, string(att.UID))}
	leases := byIndex[*coordinationv1.Lease](c.leaseInf, byAttachmentUID, string(att.UID))
	want := leaseName(att.Status.Dataplane)
	for _, l := range leases {
		if in.Lease == nil || l.Name == want {
			in.Lease = l
		}
	}
	if in.Lease != nil {
		k, _ := cache.MetaNamespaceKeyFunc(in.Lease)
		in.LeaseSeen = c.leaseSeen.seen(k, in.Lease.ResourceVersion, now)
	}
	return projectHolder(in)
}

// reclaim is the life's end of an attachment: it waits while the
// attachment is in use, then applies the reclaim policy to its addresses,
// deletes its leases and leftover advertisements (UID and
// resourceVersion preconditions) and lets it go.
func (c *Controller) reclaim(ctx context.Context, att *v1alpha1.VPCAttachment, hs holderState) (time.Duration, error) {
	if !slices.Contains(att.Finalizers, v1alpha1.FinalizerAttachment) {
		return 0, nil
	}
	if hs.InUse {
		desired := desiredAttachmentStatus(attachmentStatusInputs{Attachment: att, VPC: nil, Problem: readyProblem(att),
			Addresses: att.Status.Addresses, Holder: hs, Now: metav1.NewTime(c.clock.Now())})
		return hs.ExpiresIn, c.writeAttachmentStatus(ctx, att, desired)
	}
	for _, a := range c.boundTo(att.UID) {
		var err error
		if att.Spec.ReclaimPolicy == v1alpha1.ReclaimRetain {
			err = c.retainAddress(ctx, a)
		} else {
			err = c.deleteAddress(ctx, a)
		}
		if err != nil {
			return 0, err
		}
	}
	for _, l := range byIndex[*coordinationv1.Lease](c.leaseInf, byAttachmentUID, string(att.UID)) {
		err := c.o.Clients.Leases(l.Namespace).Delete(ctx, l.Name, preconditions(l.UID, l.ResourceVersion))
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("deleting lease %s/%s of VPCAttachment %s/%s: %w", l.Namespace, l.Name, att.Namespace, att.Name, err)
		}
	}
	for _, a := range byIndex[*v1alpha1.BGPAdvertisement](c.advInf, byAttachmentUID, string(att.UID)) {
		err := c.o.Clients.BGPAdvertisements(a.Namespace).Delete(ctx, a.Name, preconditions(a.UID, a.ResourceVersion))
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("deleting advertisement %s/%s of VPCAttachment %s/%s: %w", a.Namespace, a.Name, att.Namespace, att.Name, err)
		}
	}
	out, err := c.o.Clients.VPCAttachments(att.Namespace).Patch(ctx, att.Name, types.MergePatchType,
		finalizerPatch(att.ResourceVersion, without(att.Finalizers, v1alpha1.FinalizerAttachment)), metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("removing the finalizer of VPCAttachment %s/%s: %w", att.Namespace, att.Name, err)
	}
	c.attWrites.wrote(key(att.Namespace, att.Name), att.ResourceVersion, out)
	c.log.Info("attachment reclaimed", "namespace", att.Namespace, "name", att.Name, "uid", att.UID, "reclaimPolicy", att.Spec.ReclaimPolicy)
	return 0, nil
}

// readyProblem keeps a deleted attachment's Ready condition as it was.
func readyProblem(att *v1alpha1.VPCAttachment) *problem {
	r := meta.FindStatusCondition(att.Status.Conditions, v1alpha1.ConditionReady)
	if r == nil || r.Status == metav1.ConditionTrue {
		return nil
	}
	return &problem{r.Reason, r.Message}
}

// retainAddress turns a bound address into a reservation of the
// attachment's name: no UID, no protection (a tenant may delete it).
func (c *Controller) retainAddress(ctx context.Context, a *v1alpha1.VPCAddress) error {
	_, err := c.o.Clients.VPCAddresses(a.Namespace).Patch(ctx, a.Name, types.MergePatchType, mergePatch(a.ResourceVersion,
		without(a.Finalizers, v1alpha1.FinalizerAddress), map[string]any{v1alpha1.LabelAttachmentUID: nil},
		map[string]any{"state": v1alpha1.AddressRetained, "attachmentUID": nil}), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("retaining VPCAddress %s/%s: %w", a.Namespace, a.Name, err)
	}
	c.addrClaim.drop(key(a.Namespace, a.Name))
	return nil
}
