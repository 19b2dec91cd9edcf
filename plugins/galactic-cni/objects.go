package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/state"
)

// target is one attachment of an ADD: its Config and container interface,
// and its lease when it was read beside the attachment.
type target struct {
	conf   *Config
	ifName string
	lease  *leaseRead
}

// attached is a target once set up.
type attached struct {
	target
	att *hostif.Attached
}

// targets are the attachments an ADD makes: the inline one on CNI_IFNAME,
// or each VPCAttachment the config names, read once from the API server,
// the first on CNI_IFNAME and the next on net1, net2, ... Every refusal
// comes before anything is written: a missing attachment is code 7 naming
// namespace and name, one that is not Ready code 11.
func (p *plugin) targets(inv *invocation, c *Config, args *skel.CmdArgs) ([]target, *types.Error) {
	if c.Names.Inline != nil {
		return []target{{conf: c, ifName: args.IfName}}, nil
	}
	get, terr := p.attachmentReader(inv)
	if terr != nil {
		return nil, terr
	}
	reads := p.readHintedLeases(inv, c)
	var ts []target
	for i, name := range c.Names.Objects {
		ifName := args.IfName
		if i > 0 {
			ifName = names.SecondaryIfName(i)
			if ifName == args.IfName {
				return nil, netconf.InvalidConfig(fmt.Sprintf("CNI_IFNAME %s is the interface of the pod's attachment number %d: use another CNI_IFNAME (such as eth0)", args.IfName, i+1))
			}
		}
		a, terr := readAttachment(get, c.Names, name)
		if terr != nil {
			return nil, terr
		}
		oc, terr := c.forObject(a)
		if terr != nil {
			return nil, terr
		}
		ts = append(ts, target{conf: oc, ifName: ifName, lease: reads[i].of(oc)})
	}
	return ts, nil
}

// attachmentGetter reads a VPCAttachment, from the API server's watch
// cache when cached is true.
type attachmentGetter func(ctx context.Context, namespace, name string, cached bool) (*v1alpha1.VPCAttachment, error)

// attachmentReader reads VPCAttachments: the plugin's own in tests, else
// the API server through the node's kubeconfig.
func (p *plugin) attachmentReader(inv *invocation) (attachmentGetter, *types.Error) {
	if p.getAttachment != nil {
		return p.getAttachment, nil
	}
	cs, terr := inv.api()
	if terr != nil {
		return nil, terr
	}
	return func(ctx context.Context, namespace, name string, cached bool) (*v1alpha1.VPCAttachment, error) {
		var opts metav1.GetOptions
		if cached {
			opts.ResourceVersion = "0"
		}
		return cs.VPCAttachments(namespace).Get(ctx, name, opts)
	}, nil
}

// readAttachment reads the VPCAttachment name an ADD may use. It reads
// the API server's watch cache, which spares the ADD a read of etcd: the
// kubelet named the attachment from its own cached copy of the pod, and a
// change that lands within the cache's lag is taken as if it had landed
// just after the ADD. Before refusing an attachment (missing, not Ready,
// being deleted) it reads etcd, so a cache a moment behind never refuses
// one that was just made ready.
func readAttachment(get attachmentGetter, n netconf.Names, name string) (*v1alpha1.VPCAttachment, *types.Error) {
	var terr *types.Error
	for _, cached := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		a, err := get(ctx, n.Namespace, name, cached)
		cancel()
		if terr = attachmentError(n, name, err); terr != nil && !apierrors.IsNotFound(err) {
			// The API server did not answer about the object: etcd
			// would not either.
			return nil, terr
		}
		if terr == nil {
			if terr = usable(a); terr == nil {
				return a, nil
			}
		}
	}
	return nil, terr
}

// attachmentError maps the read of a VPCAttachment to a CNI error.
func attachmentError(n netconf.Names, name string, err error) *types.Error {
	if err == nil {
		return nil
	}
	where := "the network config"
	if n.FromPod {
		where = "the pod's annotations"
	}
	switch {
	case apierrors.IsNotFound(err):
		return netconf.InvalidConfig(fmt.Sprintf("VPCAttachment %s/%s, named by %s, does not exist in namespace %s: create it, or name one of that namespace", n.Namespace, name, where, n.Namespace))
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("reading VPCAttachment %s/%s: %v (the node's credential must read vpcattachments)", n.Namespace, name, err), "")
	}
	return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("reading VPCAttachment %s/%s: %v", n.Namespace, name, err), "")
}

// usable refuses, with code 11 (the runtime retries), an attachment the
// controller has not made ready or is deleting.
func usable(a *v1alpha1.VPCAttachment) *types.Error {
	id := a.Namespace + "/" + a.Name
	if a.DeletionTimestamp != nil {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("VPCAttachment %s is being deleted: no new holder attaches to it", id), "")
	}
	ready := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue {
		why := "it has no Ready condition yet"
		if ready != nil {
			why = fmt.Sprintf("Ready is %s, reason %s: %s", ready.Status, ready.Reason, ready.Message)
		}
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("VPCAttachment %s is not Ready (%s); retry once galactic-controller has allocated it", id, why), "")
	}
	if dp := a.Status.Dataplane; dp == nil || names.ValidateLabel("vpc", dp.VPC) != nil || names.ValidateLabel("attachment", dp.Attachment) != nil {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("VPCAttachment %s is Ready but its status.dataplane names are not set yet; retry", id), "")
	}
	if a.UID == "" {
		return types.NewError(types.ErrInternal, fmt.Sprintf("VPCAttachment %s has no UID", id), "")
	}
	return nil
}

// addTargets attaches every target of an ADD and returns what is in
// place. For VPCAttachments a repeated ADD of the same container keeps
// each attachment it still names as it is (hostif.Keep) and removes those
// it no longer names, with their lease and advertisement entry. A failure
// undoes what this call created and gives back the leases it took.
func (p *plugin) addTargets(inv *invocation, args *skel.CmdArgs, ts []target) ([]attached, *types.Error) {
	leases := make([]lease, 0, len(ts))
	giveBack := func() {
		for i, l := range leases {
			p.releaseHandoff(inv, ts[i].conf, args.ContainerID, ts[i].ifName, l)
		}
	}
	for _, t := range ts {
		l, terr := p.acquireHandoff(inv, t.conf, args, t.lease)
		if terr != nil {
			giveBack()
			return nil, terr
		}
		leases = append(leases, l)
	}
	if ts[0].conf.Object != nil {
		if terr := p.dropUnnamed(inv, args, ts); terr != nil {
			giveBack()
			return nil, terr
		}
	}
	var done []attached
	var made []state.Record
	for i, t := range ts {
		spec := t.conf.spec(args, t.ifName)
		spec.Holder, spec.HolderGeneration, spec.LeaseSeconds = leases[i].holder, leases[i].generation, leases[i].seconds
		var att *hostif.Attached
		var err error
		kept := false
		if t.conf.Object != nil {
			att, kept, err = inv.host.Keep(spec)
		}
		if err == nil && !kept {
			att, err = inv.host.Setup(spec)
		}
		if err != nil {
			for _, rec := range made {
				if terr := inv.host.Teardown(rec); terr != nil {
					inv.log.Warn("rolling back an attachment of this ADD", "hostInterface", rec.HostInterface, "error", terr.Error())
				}
			}
			giveBack()
			return nil, setupError(err)
		}
		if !kept {
			made = append(made, att.Record)
		}
		done = append(done, attached{target: t, att: att})
	}
	return done, nil
}

// dropUnnamed removes what an earlier ADD of this container attached and
// this one no longer names (an interface now of another attachment
// included): its advertisement entry first, so that no route is left to an
// interface that is going, then the interface and the lease.
func (p *plugin) dropUnnamed(inv *invocation, args *skel.CmdArgs, ts []target) *types.Error {
	recs, err := inv.host.Store().Invocation(args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "reading the node records: "+err.Error(), "")
	}
	want := map[string]string{}
	for _, t := range ts {
		want[t.ifName] = t.conf.Object.UID
	}
	for _, rec := range recs {
		if uid, ok := want[rec.IfName]; ok && uid == rec.AttachmentUID && rec.AttachmentUID != "" {
			continue
		}
		if terr := p.releaseEntry(inv, rec); terr != nil {
			return terr
		}
		errs := []error{inv.host.Teardown(rec), p.releaseRecordHandoff(inv, rec, nil)}
		if err := errors.Join(errs...); err != nil {
			return types.NewError(types.ErrInternal, fmt.Sprintf("removing %s (%s), which the pod no longer names: %v", rec.IfName, recordName(rec), err), "")
		}
		inv.log.Info("removed an attachment the pod no longer names", "removedIfName", rec.IfName, "attachment", recordName(rec), "hostInterface", rec.HostInterface)
	}
	return nil
}

// releaseEntry removes a record's entry from this node's advertisement.
func (p *plugin) releaseEntry(inv *invocation, rec state.Record) *types.Error {
	cs, terr := inv.api()
	if terr != nil {
		return terr
	}
	if err := inv.node.RequireNodeName(); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	adv := &advert.Advertiser{API: cs.BGPAdvertisements(inv.node.Namespace), Live: p.live}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if _, err := adv.Release(ctx, recordKey(rec, inv.node.NodeName), rec.ContainerID, rec.IfName); err != nil {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("releasing the advertisement entry of %s (%s): %v", rec.IfName, recordName(rec), err), "")
	}
	return nil
}

// recordKey is the advertisement of a record's attachment on node.
func recordKey(rec state.Record, node string) advert.Key {
	return advert.Key{VPC: rec.VPC, Attachment: rec.Attachment, Node: node, Namespace: rec.Namespace, UID: rec.AttachmentUID}
}

// recordName names a record's attachment for people: the VPCAttachment,
// else the inline names.
func recordName(rec state.Record) string {
	if rec.AttachmentUID != "" {
		return fmt.Sprintf("VPCAttachment %s/%s", rec.Namespace, rec.AttachmentName)
	}
	return rec.VPC + "/" + rec.Attachment
}
