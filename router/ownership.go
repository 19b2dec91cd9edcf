package router

import (
	"fmt"
	"net/netip"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// AttachmentLookup finds a VPCAttachment by UID in the router's cache,
// nil when there is none.
type AttachmentLookup func(uid string) *v1alpha1.VPCAttachment

// AttachmentUID is the UID of the VPCAttachment an advertisement is
// labelled with: "" for an inline advertisement, whose stanza is its
// only truth. An object-backed one is announced only as far as its
// attachment grants.
func AttachmentUID(adv *v1alpha1.BGPAdvertisement) string {
	return adv.Labels[v1alpha1.LabelAttachmentUID]
}

// Claim checks what an object-backed advertisement claims besides its
// prefixes against the API's attachment: that an attachment of the
// labelled UID exists in the labelled namespace, that its
// status.dataplane names spec.vpc and spec.attachment and that its
// status.vni is spec.vni. It returns the attachment and "", or why the
// claim is not granted. An inline advertisement claims nothing: nil, "".
func Claim(adv *v1alpha1.BGPAdvertisement, lookup AttachmentLookup) (*v1alpha1.VPCAttachment, string) {
	uid := AttachmentUID(adv)
	if uid == "" {
		return nil, ""
	}
	if lookup == nil {
		return nil, "labelled with VPCAttachment UID " + uid + ", but this router does not watch VPCAttachments"
	}
	ns := adv.Labels[v1alpha1.LabelNamespace]
	att := lookup(uid)
	if att == nil || att.Namespace != ns {
		return nil, fmt.Sprintf("no VPCAttachment with UID %s exists in namespace %q (labels %s, %s)",
			uid, ns, v1alpha1.LabelAttachmentUID, v1alpha1.LabelNamespace)
	}
	name := att.Namespace + "/" + att.Name
	dp := att.Status.Dataplane
	switch {
	case dp == nil:
		return nil, "VPCAttachment " + name + " has no status.dataplane yet"
	case dp.VPC != adv.Spec.VPC || dp.Attachment != adv.Spec.Attachment:
		return nil, fmt.Sprintf("spec.vpc/spec.attachment %s/%s are not VPCAttachment %s's status.dataplane %s/%s",
			adv.Spec.VPC, adv.Spec.Attachment, name, dp.VPC, dp.Attachment)
	case att.Status.VNI != adv.Spec.VNI:
		return nil, fmt.Sprintf("spec.vni %d is not VPCAttachment %s's status.vni %d", adv.Spec.VNI, name, att.Status.VNI)
	}
	return att, ""
}

// Owned says why an advertisement must not be announced with these
// prefixes, "" when it may: an inline one always may, an object-backed
// one when Claim grants it and every prefix is a host route of one of
// the attachment's status.addresses.
func Owned(adv *v1alpha1.BGPAdvertisement, lookup AttachmentLookup, prefixes []v1alpha1.Prefix) string {
	att, problem := Claim(adv, lookup)
	if att == nil {
		return problem
	}
	for _, p := range prefixes {
		if !hostRouteOf(att, p) {
			return fmt.Sprintf("prefix %s is not a host route of VPCAttachment %s/%s's status.addresses %v",
				p, att.Namespace, att.Name, att.Status.Addresses)
		}
	}
	return ""
}

// hostRouteOf says whether p is the host route (/32, /128) of one of
// att's addresses.
func hostRouteOf(att *v1alpha1.VPCAttachment, p v1alpha1.Prefix) bool {
	pfx, err := netip.ParsePrefix(string(p))
	if err != nil {
		return false
	}
	for _, a := range att.Status.Addresses {
		addr, err := netip.ParsePrefix(string(a))
		if err != nil {
			continue
		}
		if pfx.Masked() == netip.PrefixFrom(addr.Addr(), addr.Addr().BitLen()) {
			return true
		}
	}
	return false
}

// Granted is adverts without the object-backed ones whose claim the API
// does not grant: only those may give a VPC its VNI on this node.
func Granted(adverts []*v1alpha1.BGPAdvertisement, lookup AttachmentLookup) []*v1alpha1.BGPAdvertisement {
	var out []*v1alpha1.BGPAdvertisement
	for i, adv := range adverts {
		if _, problem := Claim(adv, lookup); problem != "" {
			if out == nil {
				out = append(make([]*v1alpha1.BGPAdvertisement, 0, len(adverts)), adverts[:i]...)
			}
			continue
		}
		if out != nil {
			out = append(out, adv)
		}
	}
	if out == nil {
		return adverts
	}
	return out
}
