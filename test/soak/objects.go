package soak

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// The tenant's attachments that the object step kinds make and delete:
// cycled under Delete (made, maybe used, deleted by each
// attachment-create-delete), and the keeper under Retain (deleted and made
// again by each retain-rebind). Both get allocated addresses.
var (
	cycled = Attachment{VPC: "green", Name: "cycled", Namespace: TenantNamespace, Announce: "always"}
	keeper = Attachment{VPC: "green", Name: "keeper", Namespace: TenantNamespace, Announce: "always"}
)

// objectWorkloadNode is where the object step kinds run their workloads:
// node-c is never crashed or cut off from the API, so a step's DEL and the
// controller's reclaim never wait for a node to come back.
const objectWorkloadNode = "node-c"

// objectBound is how long the controller may take to make an attachment
// Ready or let a deleted one go.
const objectBound = 30 * time.Second

// setupTenant starts galactic-controller and makes the tenant's VPC green
// and the attachments the workloads name.
func (r *runner) setupTenant() error {
	if _, err := r.env.EnsureController(); err != nil {
		return err
	}
	tn, err := r.env.CreateTenant(r.ctx, TenantNamespace, "green", tenantNetwork)
	if err != nil {
		return err
	}
	r.tenant = tn
	r.undo = append(r.undo, r.deleteTenant)
	r.dpVPC["green"] = tn.VPC.Status.DataplaneName
	for _, a := range append(slices.Clone(statics), r.topo.Attachments...) {
		if a.Namespace == "" {
			continue
		}
		if _, err := r.createObject(a, v1alpha1.ReclaimDelete, addrOf(a).String()); err != nil {
			return err
		}
	}
	_, err = r.createObject(keeper, v1alpha1.ReclaimRetain)
	return err
}

// createObject makes a's VPCAttachment and waits until it is Ready.
func (r *runner) createObject(a Attachment, policy v1alpha1.ReclaimPolicy, addrs ...string) (*v1alpha1.VPCAttachment, error) {
	obj, err := r.tenant.CreateAttachment(r.ctx, a.Name, policy, addrs...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.objs[a.Key()] = obj
	r.mu.Unlock()
	return obj, nil
}

// deleteObject deletes obj (not a successor of its name) and waits until
// the controller let it go.
func (r *runner) deleteObject(obj *v1alpha1.VPCAttachment) error {
	uid := obj.UID
	api := r.env.API.VPCAttachments(obj.Namespace)
	err := api.Delete(r.ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return harness.Poll(r.ctx, objectBound, "VPCAttachment "+obj.Namespace+"/"+obj.Name+" gone", func() error {
		a, err := api.Get(r.ctx, obj.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case a.UID != uid:
			return nil
		}
		return fmt.Errorf("still there: %+v", a.Status)
	})
}

// deleteTenant deletes the tenant's attachments and VPC, once: after the
// empty check nothing uses them.
func (r *runner) deleteTenant() {
	if r.tenant == nil {
		return
	}
	var objs []*v1alpha1.VPCAttachment
	for _, key := range sortedKeys(r.objs) {
		objs = append(objs, r.objs[key])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := r.tenant.Delete(ctx, objs...); err != nil {
		r.say("deleting the tenant: %v", err)
		if r.checker != nil {
			r.checker.Fail(time.Now(), "cleanup", "deleting the tenant: %v", err)
		}
	}
	r.tenant = nil
}

// dataplane are the names a node gives attachment key: the object's
// data-plane names for an object-backed one.
func (r *runner) dataplane(a Attachment) (vpc, att string) {
	if a.Namespace == "" {
		return a.VPC, a.Name
	}
	r.mu.Lock()
	obj := r.objs[a.Key()]
	r.mu.Unlock()
	return obj.Status.Dataplane.VPC, obj.Status.Dataplane.Attachment
}

// leftOf lists what is labelled with an attachment UID: its leases and
// advertisements.
func (r *runner) leftOf(uid string) ([]string, error) {
	sel := metav1.ListOptions{LabelSelector: v1alpha1.LabelAttachmentUID + "=" + uid}
	leases, err := r.env.API.Leases(harness.Namespace).List(r.ctx, sel)
	if err != nil {
		return nil, err
	}
	ads, err := r.env.API.BGPAdvertisements(harness.Namespace).List(r.ctx, sel)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range leases.Items {
		out = append(out, "lease "+l.Name)
	}
	for _, a := range ads.Items {
		out = append(out, "advertisement "+a.Name)
	}
	return out, nil
}

// nothingLeftOf waits until nothing is labelled with uid any more.
func (r *runner) nothingLeftOf(obj *v1alpha1.VPCAttachment) error {
	return harness.Poll(r.ctx, objectBound, "nothing left of "+obj.Name+" "+string(obj.UID), func() error {
		left, err := r.leftOf(string(obj.UID))
		if err == nil && len(left) > 0 {
			err = errors.New(fmt.Sprint(left))
		}
		return err
	})
}

// addressesOf are the addresses of an attachment's status.
func addressesOf(obj *v1alpha1.VPCAttachment) []netip.Addr {
	var out []netip.Addr
	for _, p := range obj.Status.Addresses {
		if pp, err := netip.ParsePrefix(string(p)); err == nil {
			out = append(out, pp.Addr())
		}
	}
	return out
}

// addressObjects waits until each of addrs' VPCAddresses in VPC green
// satisfies ok (nil when it does not exist).
func (r *runner) addressObjects(addrs []netip.Addr, what string, ok func(*v1alpha1.VPCAddress) error) error {
	api := r.env.API.VPCAddresses(TenantNamespace)
	return harness.Poll(r.ctx, objectBound, what, func() error {
		for _, a := range addrs {
			obj, err := api.Get(r.ctx, names.VPCAddressName("green", a), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				obj, err = nil, nil
			}
			if err != nil {
				return err
			}
			if err := ok(obj); err != nil {
				return fmt.Errorf("%s: %w", a, err)
			}
		}
		return nil
	})
}

// CycleAttachment makes the cycled attachment (Delete, allocated
// addresses), runs a workload of it on node (unless "") and stops it,
// deletes it, and checks that its addresses went back to the VPC and that
// nothing of its UID is left.
func (r *runner) CycleAttachment(key, node string) error {
	a := objectAttachment(key)
	r.mu.Lock()
	left := r.objs[key]
	r.mu.Unlock()
	if left != nil {
		// A failed cycle's attachment goes first: its name is the next's.
		if err := r.deleteObject(left); err != nil {
			return err
		}
	}
	obj, err := r.createObject(a, v1alpha1.ReclaimDelete)
	if err != nil {
		return err
	}
	addrs := addressesOf(obj)
	if node != "" {
		in, err := r.addAttachment(a, node)
		if err != nil {
			return err
		}
		if err := r.del(in); err != nil {
			return err
		}
	}
	if err := r.deleteObject(obj); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.objs, key)
	r.mu.Unlock()
	if err := r.addressObjects(addrs, "the deleted "+a.Name+"'s addresses freed", func(o *v1alpha1.VPCAddress) error {
		if o != nil && (o.Spec.AttachmentUID == obj.UID || o.Spec.State == v1alpha1.AddressRetained) {
			return fmt.Errorf("%s %s %s", o.Name, o.Spec.State, o.Spec.AttachmentUID)
		}
		return nil
	}); err != nil {
		return err
	}
	return r.nothingLeftOf(obj)
}

// RebindRetained stops the keeper's workload if it runs, deletes the
// keeper (Retain) and makes it again by the same name: the successor must
// get the same addresses under a new UID. With node set, a workload of the
// successor runs there afterwards: its lease and advertisement entry must
// be the new UID's, a fresh lease history, and nothing of the old UID may
// be left.
func (r *runner) RebindRetained(key, node string) error {
	a := objectAttachment(key)
	r.mu.Lock()
	old, in := r.objs[key], r.extra[key]
	delete(r.extra, key)
	r.mu.Unlock()
	if in != nil {
		if err := r.del(in); err != nil {
			return err
		}
	}
	if err := r.deleteObject(old); err != nil {
		return err
	}
	addrs := addressesOf(old)
	if err := r.addressObjects(addrs, "the deleted "+a.Name+"'s addresses retained", func(o *v1alpha1.VPCAddress) error {
		if o == nil || o.Spec.State != v1alpha1.AddressRetained || o.Spec.AttachmentUID != "" {
			return fmt.Errorf("not retained: %+v", o)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := r.nothingLeftOf(old); err != nil {
		return err
	}
	obj, err := r.createObject(a, v1alpha1.ReclaimRetain)
	if err != nil {
		return err
	}
	if obj.UID == old.UID || !slices.Equal(addressesOf(obj), addrs) {
		return fmt.Errorf("the rebound %s: UID %s and addresses %v, its predecessor's %s and %v", a.Name, obj.UID, addressesOf(obj), old.UID, addrs)
	}
	if node == "" {
		return nil
	}
	in, err = r.addAttachment(a, node)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.extra[key] = in
	r.mu.Unlock()
	return r.freshIdentity(obj, old, in)
}

// freshIdentity checks that the holder in of obj holds obj's own lease,
// from its first token, and its own advertisement entry, and that nothing
// of old is left.
func (r *runner) freshIdentity(obj, old *v1alpha1.VPCAttachment, in *instance) error {
	vpc, att := obj.Status.Dataplane.VPC, obj.Status.Dataplane.Attachment
	holder := names.Holder(in.node, harness.ContainerID(in.netns.Path))
	l, err := r.env.API.Leases(harness.Namespace).Get(r.ctx, names.Lease(vpc, att), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the rebound %s's lease: %w", obj.Name, err)
	}
	if rec := handoff.RecordFromLease(l); rec.Identity.UID != string(obj.UID) || rec.HolderIdentity != holder || rec.LeaseTransitions != 1 {
		return fmt.Errorf("the rebound %s's lease %s: %+v, want %s holding token 1 for UID %s", obj.Name, l.Name, rec, holder, obj.UID)
	}
	adv, err := r.env.API.BGPAdvertisements(harness.Namespace).Get(r.ctx, names.Advertisement(vpc, att, in.node), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the rebound %s's advertisement: %w", obj.Name, err)
	}
	if c := adv.Spec.Containers; len(c) != 1 || c[0].AttachmentUID != string(obj.UID) || c[0].ContainerID != harness.ContainerID(in.netns.Path) {
		return fmt.Errorf("the rebound %s's advertisement %s: %+v", obj.Name, adv.Name, c)
	}
	if left, err := r.leftOf(string(old.UID)); err != nil || len(left) > 0 {
		return fmt.Errorf("the predecessor %s of the rebound %s: left %v %v", old.UID, obj.Name, left, err)
	}
	return nil
}

// objectAttachment is the object step kinds' attachment of key.
func objectAttachment(key string) Attachment {
	if key == keeper.Key() {
		return keeper
	}
	return cycled
}

// startObjectInformers watches the tenant's VPCs, attachments and
// addresses, from which the address claims are sampled.
func (r *runner) startObjectInformers(ctx context.Context) []cache.InformerSynced {
	vpcs := r.env.API.VPCs(TenantNamespace)
	atts := r.env.API.VPCAttachments(TenantNamespace)
	addrs := r.env.API.VPCAddresses(TenantNamespace)
	r.vpcInf = cache.NewSharedIndexInformer(listWatch(vpcs.List, vpcs.Watch), &v1alpha1.VPC{}, 0, cache.Indexers{})
	r.attInf = cache.NewSharedIndexInformer(listWatch(atts.List, atts.Watch), &v1alpha1.VPCAttachment{}, 0, cache.Indexers{})
	r.addrInf = cache.NewSharedIndexInformer(listWatch(addrs.List, addrs.Watch), &v1alpha1.VPCAddress{}, 0, cache.Indexers{})
	for _, inf := range []cache.SharedIndexInformer{r.vpcInf, r.attInf, r.addrInf} {
		go inf.RunWithContext(ctx)
	}
	return []cache.InformerSynced{r.vpcInf.HasSynced, r.attInf.HasSynced, r.addrInf.HasSynced}
}

// claims are the signs that an attachment holds an address: Bound
// VPCAddresses, attachments' statuses, and advertisement entries of
// object-backed attachments. Leases name no address; the lease checkers
// judge them.
func (r *runner) claims(ads []any) []AddressClaim {
	byName, byDataplane := map[string]string{}, map[string]string{}
	for _, obj := range r.vpcInf.GetStore().List() {
		v := obj.(*v1alpha1.VPC)
		byName[v.Name] = string(v.UID)
		if v.Status.DataplaneName != "" {
			byDataplane[v.Status.DataplaneName] = string(v.UID)
		}
	}
	var out []AddressClaim
	for _, obj := range r.addrInf.GetStore().List() {
		a := obj.(*v1alpha1.VPCAddress)
		if a.Spec.State == v1alpha1.AddressBound && a.Spec.AttachmentUID != "" {
			out = append(out, AddressClaim{VPC: string(a.Spec.VPCUID), Address: string(a.Spec.Address), UID: string(a.Spec.AttachmentUID), Source: "VPCAddress " + a.Name})
		}
	}
	for _, obj := range r.attInf.GetStore().List() {
		a := obj.(*v1alpha1.VPCAttachment)
		for _, addr := range addressesOf(a) {
			out = append(out, AddressClaim{VPC: byName[a.Spec.VPC], Address: addr.String(), UID: string(a.UID), Source: "the status of VPCAttachment " + a.Name})
		}
	}
	for _, obj := range ads {
		adv := obj.(*v1alpha1.BGPAdvertisement)
		vpc, ok := byDataplane[adv.Spec.VPC]
		if !ok {
			continue
		}
		for _, e := range adv.Spec.Containers {
			if e.AttachmentUID == "" {
				continue
			}
			for _, p := range e.Prefixes {
				if pp, err := netip.ParsePrefix(string(p)); err == nil {
					out = append(out, AddressClaim{VPC: vpc, Address: pp.Addr().String(), UID: e.AttachmentUID, Source: "advertisement " + adv.Name + " entry " + e.ContainerID})
				}
			}
		}
	}
	return out
}

// isHandoffLease tells a handoff lease from galactic-controller's leader
// election lease in the same namespace.
func isHandoffLease(l *coordinationv1.Lease) bool { return l.Name != "galactic-controller" }
