package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/state"
)

// VPCAttachments need no API read here: galactic-cni read each once and
// recorded what galactic-bgp needs (data-plane names, UID, namespace, VNI,
// announce, addresses) in its node record of the interface.

// recordKey is the advertisement of a record's VPCAttachment on node.
func recordKey(rec state.Record, node string) advert.Key {
	return advert.Key{VPC: rec.VPC, Attachment: rec.Attachment, Node: node, Namespace: rec.Namespace, UID: rec.AttachmentUID}
}

// recordName names a record's attachment for people.
func recordName(rec state.Record) string {
	if rec.AttachmentUID == "" {
		return "inline attachment " + rec.VPC + "/" + rec.Attachment
	}
	return fmt.Sprintf("VPCAttachment %s/%s", rec.Namespace, rec.AttachmentName)
}

// recordPrefixes are the host prefixes of a record's addresses.
func recordPrefixes(rec state.Record) []v1alpha1.Prefix {
	var out []v1alpha1.Prefix
	for _, s := range rec.Addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, v1alpha1.Prefix(netip.PrefixFrom(p.Addr(), p.Addr().BitLen()).String()))
		}
	}
	return advert.SortPrefixes(out)
}

// objectRecords are galactic-cni's records of the ADD of args, checked
// against the VPCAttachments the config names (the same, in the same
// order) and, with prevResult, against its addresses: galactic-bgp
// publishes an attachment's own addresses only, and only those galactic-cni
// configured.
func objectRecords(stateDir string, args *skel.CmdArgs, conf *Config) ([]state.Record, *types.Error) {
	recs, err := state.NewStore(stateDir).Invocation(args.ContainerID, args.IfName)
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "cannot read galactic-cni's records of this container: "+err.Error(), "")
	}
	var got []string
	for _, r := range recs {
		got = append(got, recordName(r))
	}
	var want []string
	for _, n := range conf.Names.Objects {
		want = append(want, fmt.Sprintf("VPCAttachment %s/%s", conf.Names.Namespace, n))
	}
	if len(recs) == 0 {
		return nil, netconf.InvalidConfig(fmt.Sprintf("galactic-cni recorded no attachment of container %s interface %s: galactic-bgp must follow galactic-cni in the network's plugins list", args.ContainerID, args.IfName))
	}
	if !slices.Equal(got, want) {
		return nil, netconf.InvalidConfig(fmt.Sprintf("galactic-bgp names %v but galactic-cni attached %v: both stanzas must name the same attachments", want, got))
	}
	have := map[v1alpha1.Prefix]bool{}
	for _, p := range advert.HostPrefixes(conf.IPs) {
		have[p] = true
	}
	for _, r := range recs {
		for _, p := range recordPrefixes(r) {
			if !have[p] {
				return nil, netconf.InvalidConfig(fmt.Sprintf("prevResult lacks %s, which galactic-cni configured for %s on %s: galactic-bgp must follow galactic-cni, and any plugin between them must pass the IPs on", p, recordName(r), r.IfName))
			}
		}
		if r.Announce == string(v1alpha1.AnnounceWhenAvailable) && r.Holder == "" && !r.Standby {
			return nil, netconf.InvalidConfig(fmt.Sprintf(`%s has announce "whenAvailable", which needs the handoff lease: enable "handoff" in the galactic-cni stanza`, recordName(r)))
		}
	}
	return recs, nil
}

// addObjects publishes one entry per VPCAttachment of the ADD, each in its
// own attachment's advertisement of this node, and deletes each one's
// leftovers on other nodes.
func (p *plugin) addObjects(inv *invocation, conf *Config, args *skel.CmdArgs) error {
	recs, terr := objectRecords(inv.node.StateDir, args, conf)
	if terr != nil {
		return terr
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	var published, deletedOthers []string
	for _, rec := range recs {
		key := recordKey(rec, inv.node.NodeName)
		prefixes := recordPrefixes(rec)
		if len(prefixes) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.add)
			res, err := publisher(adv, rec)(ctx, key, v1alpha1.ContainerEntry{
				ContainerID: args.ContainerID, IfName: rec.IfName, Netns: args.Netns, Prefixes: prefixes,
				HolderGeneration: rec.HolderGeneration, Standby: rec.Standby, AttachmentUID: rec.AttachmentUID,
			}, advert.Routing{VNI: rec.VNI, Announce: v1alpha1.Announce(rec.Announce)})
			cancel()
			if err != nil {
				inv.set("published", published, "conflicts", res.Conflicts)
				return apiError(err, "publishing the advertisement entry of "+recordName(rec))
			}
			published = append(published, key.Name()+":"+string(res.Outcome))
		}
		if rec.Standby {
			// A live-migration target: the source keeps its
			// advertisement until its own DEL.
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.cleanup)
		deleted, err := adv.DeleteOthers(ctx, key)
		cancel()
		deletedOthers = append(deletedOthers, deleted...)
		if err != nil {
			inv.warn = true
			inv.set("deleteOthersError", err.Error())
		}
	}
	inv.set("advertisements", published, "deletedOthers", deletedOthers)
	return conf.Prev.PrintTo(p.stdout)
}

// delObjects releases the entry of each VPCAttachment of the DEL's ADD;
// like every DEL it succeeds, leaving what it cannot release to the node
// GC.
func (p *plugin) delObjects(inv *invocation, args *skel.CmdArgs, recs []state.Record) error {
	adv, terr := inv.advertiser()
	if terr != nil {
		inv.warn = true
		inv.set("outcome", "not released; left for the node GC", "reason", terr.Msg)
		return nil
	}
	var released []string
	var errs []error
	for _, rec := range recs {
		key := recordKey(rec, inv.node.NodeName)
		ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.del)
		res, err := adv.Release(ctx, key, args.ContainerID, rec.IfName)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		released = append(released, key.Name()+":"+string(res.Outcome))
	}
	inv.set("released", released)
	if err := errors.Join(errs...); err != nil {
		inv.warn = true
		inv.set("outcome", "not all released; left for the node GC", "reason", err.Error())
		return nil
	}
	inv.set("outcome", "released")
	return nil
}

// checkObjects checks each VPCAttachment's entry of the ADD.
func (p *plugin) checkObjects(inv *invocation, conf *Config, args *skel.CmdArgs) error {
	recs, terr := objectRecords(inv.node.StateDir, args, conf)
	if terr != nil {
		return terr
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	for _, rec := range recs {
		want := recordPrefixes(rec)
		if len(want) == 0 {
			continue
		}
		key := recordKey(rec, inv.node.NodeName)
		ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.check)
		obj, err := adv.API.Get(ctx, key.Name(), metav1.GetOptions{})
		cancel()
		if apierrors.IsNotFound(err) {
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s of %s does not exist: this node does not advertise %v", key.Name(), recordName(rec), want), "")
		}
		if err != nil {
			return apiError(err, "reading advertisement "+key.Name())
		}
		if uid := obj.Labels[v1alpha1.LabelAttachmentUID]; uid != rec.AttachmentUID {
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s is labelled with attachment UID %q, not %s's %q", key.Name(), uid, recordName(rec), rec.AttachmentUID), "")
		}
		i := slices.IndexFunc(obj.Spec.Containers, func(e v1alpha1.ContainerEntry) bool {
			return e.ContainerID == args.ContainerID && e.IfName == rec.IfName
		})
		if i < 0 {
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s has no entry for container %s interface %s", key.Name(), args.ContainerID, rec.IfName), "")
		}
		e := obj.Spec.Containers[i]
		switch {
		case !slices.Equal(advert.SortPrefixes(e.Prefixes), want):
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s lists %v for %s, galactic-cni configured %v", key.Name(), e.Prefixes, rec.IfName, want), "")
		case e.AttachmentUID != rec.AttachmentUID:
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s's entry for %s has attachment UID %q, not %q", key.Name(), rec.IfName, e.AttachmentUID, rec.AttachmentUID), "")
		case e.Netns != args.Netns:
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s records netns %q for %s, not %q", key.Name(), e.Netns, rec.IfName, args.Netns), "")
		}
	}
	inv.set("outcome", "published")
	return nil
}

// gcObjects removes, from this node's advertisements of a VMM stanza's
// VPCAttachment, the entries whose ADD is not in cni.dev/valid-attachments.
// The node's records say which advertisements are the attachment's (its
// data-plane names) and which ADD each entry belongs to; with no record of
// it here, nothing of it is known on this node and galactic-gc prunes the
// dead entries.
func (p *plugin) gcObjects(inv *invocation, conf *Config) error {
	recs, err := state.NewStore(inv.node.StateDir).List()
	if err != nil {
		inv.set("recordsError", err.Error())
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	chain := map[types.GCAttachment]string{}
	keys := map[string]advert.Key{}
	for _, r := range recs {
		chain[types.GCAttachment{ContainerID: r.ContainerID, IfName: r.IfName}] = r.Chain()
		if r.AttachmentUID != "" && r.Namespace == conf.Names.Namespace && slices.Contains(conf.Names.Objects, r.AttachmentName) {
			k := recordKey(r, inv.node.NodeName)
			keys[k.Name()] = k
		}
	}
	if len(keys) == 0 {
		inv.set("outcome", "no record of the attachment on this node; left to galactic-gc")
		return nil
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	var errs []error
	var removed []string
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.gc)
		res, err := adv.Remove(ctx, k, func(e v1alpha1.ContainerEntry) bool {
			id := types.GCAttachment{ContainerID: e.ContainerID, IfName: e.IfName}
			if c, ok := chain[id]; ok {
				id.IfName = c
			}
			return !valid[id]
		})
		cancel()
		removed = append(removed, entryIDs(res.Removed)...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	inv.set("removed", removed)
	if err := errors.Join(errs...); err != nil {
		return apiError(err, "removing entries not in cni.dev/valid-attachments")
	}
	inv.set("outcome", "collected")
	return nil
}
