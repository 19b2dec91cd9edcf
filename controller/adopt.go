package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/names"
)

// AdoptOptions say what Adopt adopts and where.
type AdoptOptions struct {
	Clients *client.Clients
	// Namespace is the tenant namespace the VPCs and VPCAttachments are
	// made in; GalacticNamespace holds the nodes' leases and
	// advertisements.
	Namespace, GalacticNamespace string
	// Networks are the networks of the VPCs to adopt (--vpc-networks).
	Networks VPCNetworks
	// DryRun prints the plan and writes nothing.
	DryRun bool
	// Wait bounds the wait for the controller to make each attachment
	// Ready.
	Wait time.Duration
	// Out receives what was done, one line per object.
	Out io.Writer
}

// maxAdoptConflicts bounds the retries of one guarded write that a node
// or the controller keeps changing under it.
const maxAdoptConflicts = 10

// Adopt turns the inline attachments that nodes advertise into VPCs and
// VPCAttachments of the tenant namespace with the names, VNIs and
// addresses the nodes already use: it creates the objects (labelled
// adopted), writes their inline data-plane names into their status, waits
// until the controller made every attachment Ready, and then labels the
// attachments' leases and advertisements with their namespace and UID.
// Leases keep their holder and token; nothing on the nodes changes. Run
// again, it completes what an interrupted run left and changes nothing
// else.
func Adopt(ctx context.Context, o AdoptOptions) error {
	in, err := readAdoptInputs(ctx, o)
	if err != nil {
		return err
	}
	plan, err := planAdoption(in)
	if err != nil {
		return err
	}
	say := func(format string, args ...any) { fmt.Fprintf(o.Out, format+"\n", args...) }
	for _, s := range plan.Skipped {
		say("inline VPC %s: skipped", s)
	}
	if len(plan.VPCs) == 0 {
		return fmt.Errorf("nothing to adopt into namespace %s: name inline VPCs with --vpc-networks <vpc>=<network>,...", o.Namespace)
	}
	if o.DryRun {
		for _, v := range plan.VPCs {
			say("VPC %s/%s: VNI %d, networks %s, data-plane name %s%s", o.Namespace, v.Name, v.VNI, joinCIDRs(v.Networks), v.Name, existing(v.Existing != nil))
			for _, a := range v.Attachments {
				say("VPCAttachment %s/%s: VPC %s, addresses %v, announce %s, data-plane names %s/%s%s", o.Namespace, a.Name, v.Name, a.Addresses, a.Announce, v.Name, a.Name, existing(a.Existing != nil))
			}
		}
		say("dry run: nothing written")
		return nil
	}
	type made struct {
		vpc string
		att *v1alpha1.VPCAttachment
	}
	var atts []made
	for _, v := range plan.VPCs {
		if _, err := ensureAdoptedVPC(ctx, o, v, say); err != nil {
			return err
		}
		for _, a := range v.Attachments {
			att, err := ensureAdoptedAttachment(ctx, o, v.Name, a, say)
			if err != nil {
				return err
			}
			atts = append(atts, made{v.Name, att})
		}
	}
	// Labelled, a node's lease and advertisements are the object's: only
	// once the object is Ready with their addresses does galactic-router
	// keep routing them.
	want := map[string]int{}
	for _, v := range plan.VPCs {
		for _, a := range v.Attachments {
			want[a.Name] = len(a.Addresses)
		}
	}
	if err := waitAdoptedReady(ctx, o, want); err != nil {
		return err
	}
	for _, m := range atts {
		if err := labelAdopted(ctx, o, m.vpc, m.att, say); err != nil {
			return err
		}
	}
	say("adopted %d VPCs and %d attachments into namespace %s", len(plan.VPCs), len(atts), o.Namespace)
	return nil
}

func existing(b bool) string {
	if b {
		return " (exists)"
	}
	return ""
}

func readAdoptInputs(ctx context.Context, o AdoptOptions) (adoptInputs, error) {
	in := adoptInputs{Namespace: o.Namespace, Networks: o.Networks}
	adverts, err := o.Clients.BGPAdvertisements(o.GalacticNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing the advertisements in %s: %w", o.GalacticNamespace, err)
	}
	in.Adverts = adverts.Items
	vpcs, err := o.Clients.VPCs(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing the VPCs in %s: %w", o.Namespace, err)
	}
	in.VPCs = vpcs.Items
	atts, err := o.Clients.VPCAttachments(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing the VPCAttachments in %s: %w", o.Namespace, err)
	}
	in.Attachments = atts.Items
	vnis, err := o.Clients.VNIs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing the VNIs: %w", err)
	}
	in.VNIs = vnis.Items
	return in, nil
}

// ensureAdoptedVPC creates the VPC unless an earlier run did, and writes
// its inline data-plane name into its status (resourceVersion-guarded).
func ensureAdoptedVPC(ctx context.Context, o AdoptOptions, v vpcAdoption, say func(string, ...any)) (*v1alpha1.VPC, error) {
	cl := o.Clients.VPCs(o.Namespace)
	id := o.Namespace + "/" + v.Name
	vpc := v.Existing
	if vpc == nil {
		vni := v.VNI
		obj := &v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: v.Name, Labels: map[string]string{v1alpha1.LabelAdopted: "true"}},
			Spec: v1alpha1.VPCSpec{Networks: v.Networks, VNI: &vni}}
		out, err := cl.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating VPC %s: %w", id, err)
		}
		say("VPC %s: created (VNI %d, networks %s)", id, v.VNI, joinCIDRs(v.Networks))
		vpc = out
	}
	for conflicts := 0; vpc.Status.DataplaneName != v.Name; {
		if vpc.Status.DataplaneName != "" {
			return nil, fmt.Errorf("VPC %s has status.dataplaneName %s, not its inline name %s", id, vpc.Status.DataplaneName, v.Name)
		}
		upd := vpc.DeepCopy()
		upd.Status.DataplaneName = v.Name
		out, err := cl.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && conflicts < maxAdoptConflicts {
			conflicts++
			if vpc, err = cl.Get(ctx, v.Name, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("reading VPC %s: %w", id, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("writing the data-plane name of VPC %s: %w", id, err)
		}
		say("VPC %s: status.dataplaneName %s", id, v.Name)
		vpc = out
	}
	return vpc, nil
}

// ensureAdoptedAttachment creates the attachment unless an earlier run
// did, and writes its inline data-plane names into its status.
func ensureAdoptedAttachment(ctx context.Context, o AdoptOptions, vpc string, a attachmentAdoption, say func(string, ...any)) (*v1alpha1.VPCAttachment, error) {
	cl := o.Clients.VPCAttachments(o.Namespace)
	id := o.Namespace + "/" + a.Name
	att := a.Existing
	if att == nil {
		obj := &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: a.Name, Labels: map[string]string{v1alpha1.LabelAdopted: "true"}},
			Spec: v1alpha1.VPCAttachmentSpec{VPC: vpc, Addresses: a.Addresses, Announce: a.Announce}}
		if len(a.Addresses) == 0 {
			// It had none inline: the workload manages its own.
			obj.Spec.IPFamilies = []v1alpha1.IPFamily{}
		}
		out, err := cl.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating VPCAttachment %s: %w", id, err)
		}
		say("VPCAttachment %s: created (VPC %s, addresses %v)", id, vpc, a.Addresses)
		att = out
	}
	want := v1alpha1.Dataplane{VPC: vpc, Attachment: a.Name}
	for conflicts := 0; att.Status.Dataplane == nil || *att.Status.Dataplane != want; {
		if dp := att.Status.Dataplane; dp != nil {
			return nil, fmt.Errorf("VPCAttachment %s has status.dataplane %s/%s, not its inline names %s/%s", id, dp.VPC, dp.Attachment, vpc, a.Name)
		}
		upd := att.DeepCopy()
		upd.Status.Dataplane = &want
		out, err := cl.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && conflicts < maxAdoptConflicts {
			conflicts++
			if att, err = cl.Get(ctx, a.Name, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("reading VPCAttachment %s: %w", id, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("writing the data-plane names of VPCAttachment %s: %w", id, err)
		}
		say("VPCAttachment %s: status.dataplane %s/%s", id, vpc, a.Name)
		att = out
	}
	return att, nil
}

// waitAdoptedReady waits until each attachment (name -> addresses) is
// Ready with its addresses, as galactic-controller makes it.
func waitAdoptedReady(ctx context.Context, o AdoptOptions, want map[string]int) error {
	deadline := time.Now().Add(o.Wait)
	for {
		list, err := o.Clients.VPCAttachments(o.Namespace).List(ctx, metav1.ListOptions{})
		var waiting []string
		if err == nil {
			byName := map[string]*v1alpha1.VPCAttachment{}
			for i := range list.Items {
				byName[list.Items[i].Name] = &list.Items[i]
			}
			for _, name := range slices.Sorted(maps.Keys(want)) {
				if why := adoptedNotReady(byName[name], want[name]); why != "" {
					waiting = append(waiting, fmt.Sprintf("%s/%s: %s", o.Namespace, name, why))
				}
			}
			if len(waiting) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("listing the VPCAttachments in %s: %w", o.Namespace, err)
			}
			return fmt.Errorf("not Ready after %s (is galactic-controller running?); nothing is labelled yet, run adopt again once they are:\n  %s", o.Wait, strings.Join(waiting, "\n  "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// adoptedNotReady says why an adopted attachment is not Ready yet, ""
// when it is.
func adoptedNotReady(a *v1alpha1.VPCAttachment, addresses int) string {
	if a == nil {
		return "gone"
	}
	c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionReady)
	switch {
	case c == nil:
		return "no Ready condition yet"
	case c.Status != metav1.ConditionTrue:
		return fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
	case len(a.Status.Addresses) != addresses:
		return fmt.Sprintf("status.addresses %v, want %d", a.Status.Addresses, addresses)
	}
	return ""
}

// labelAdopted labels the attachment's lease and its advertisements with
// its namespace and UID (merge patches guarded by the resourceVersion
// read); a lease or advertisement already labelled with another UID is
// another attachment's, and an error.
func labelAdopted(ctx context.Context, o AdoptOptions, vpc string, att *v1alpha1.VPCAttachment, say func(string, ...any)) error {
	identity := map[string]any{v1alpha1.LabelNamespace: att.Namespace, v1alpha1.LabelAttachmentUID: string(att.UID)}
	// Advertisements first: galactic-router judges an advertisement's
	// holder by the lease only while both carry the same UID, so the two
	// writes follow each other at once.
	if err := labelAdverts(ctx, o, vpc, att, say); err != nil {
		return err
	}
	return labelLease(ctx, o, vpc, att, identity, say)
}

func labelLease(ctx context.Context, o AdoptOptions, vpc string, att *v1alpha1.VPCAttachment, identity map[string]any, say func(string, ...any)) error {
	leases := o.Clients.Leases(o.GalacticNamespace)
	name := names.Lease(vpc, att.Name)
	id := "lease " + o.GalacticNamespace + "/" + name
	for conflicts := 0; ; conflicts++ {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", id, err)
		}
		if done, err := labelTarget(id, l.Labels, att); done || err != nil {
			return err
		}
		_, err = leases.Patch(ctx, name, types.MergePatchType, labelPatch(l.ResourceVersion, identity), metav1.PatchOptions{})
		if apierrors.IsConflict(err) && conflicts < maxAdoptConflicts {
			continue
		}
		if err != nil {
			return fmt.Errorf("labelling %s: %w", id, err)
		}
		say("%s: labelled with UID %s (holder %q, token %d kept)", id, att.UID, deref(l.Spec.HolderIdentity), deref(l.Spec.LeaseTransitions))
		return nil
	}
}

func labelAdverts(ctx context.Context, o AdoptOptions, vpc string, att *v1alpha1.VPCAttachment, say func(string, ...any)) error {
	cl := o.Clients.BGPAdvertisements(o.GalacticNamespace)
	for conflicts := 0; ; conflicts++ {
		list, err := cl.List(ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, att.Name)})
		if err != nil {
			return fmt.Errorf("listing the advertisements of %s/%s: %w", vpc, att.Name, err)
		}
		retry := false
		for _, a := range list.Items {
			if a.Spec.VPC != vpc || a.Spec.Attachment != att.Name {
				continue
			}
			id := "advertisement " + o.GalacticNamespace + "/" + a.Name
			patch, done, err := adoptAdvertPatch(id, &a, att)
			if err != nil {
				return err
			}
			if done {
				continue
			}
			_, err = cl.Patch(ctx, a.Name, types.MergePatchType, patch, metav1.PatchOptions{})
			if apierrors.IsConflict(err) && conflicts < maxAdoptConflicts {
				retry = true
				continue
			}
			if err != nil {
				return fmt.Errorf("labelling %s: %w", id, err)
			}
			say("%s: labelled with UID %s", id, att.UID)
		}
		if !retry {
			return nil
		}
	}
}

// adoptAdvertPatch is the merge patch (guarded by the resourceVersion
// read) that makes an inline advertisement att's: its labels and every
// entry's attachmentUID, since galactic-router counts only entries of the
// advertisement's UID. done says it is att's already.
func adoptAdvertPatch(id string, a *v1alpha1.BGPAdvertisement, att *v1alpha1.VPCAttachment) (patch []byte, done bool, err error) {
	labelled, err := labelTarget(id, a.Labels, att)
	if err != nil {
		return nil, false, err
	}
	entries := slices.Clone(a.Spec.Containers)
	changed := false
	for i, e := range entries {
		switch types.UID(e.AttachmentUID) {
		case att.UID:
		case "":
			entries[i].AttachmentUID, changed = string(att.UID), true
		default:
			return nil, false, fmt.Errorf("%s: entry %s/%s belongs to attachment UID %s, not %s/%s's %s; adopt leaves it alone", id, e.ContainerID, e.IfName, e.AttachmentUID, att.Namespace, att.Name, att.UID)
		}
	}
	if labelled && !changed {
		return nil, true, nil
	}
	p := map[string]any{"metadata": map[string]any{"resourceVersion": a.ResourceVersion,
		"labels": map[string]any{v1alpha1.LabelNamespace: att.Namespace, v1alpha1.LabelAttachmentUID: string(att.UID)}}}
	if changed {
		p["spec"] = map[string]any{"containers": entries}
	}
	patch, err = json.Marshal(p)
	return patch, false, err
}

// labelTarget says whether an object is already labelled for att (done),
// or an error when it is another attachment's.
func labelTarget(id string, l map[string]string, att *v1alpha1.VPCAttachment) (done bool, err error) {
	switch uid := adoptedUID(l); uid {
	case "":
		return false, nil
	case att.UID:
		return true, nil
	default:
		return false, fmt.Errorf("%s is labelled with attachment UID %s (namespace %q), not %s's %s: it is another attachment's; adopt leaves it alone", id, uid, l[v1alpha1.LabelNamespace], att.Namespace+"/"+att.Name, att.UID)
	}
}

func labelPatch(rv string, identity map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": rv, "labels": identity}})
	return b
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
