package controller

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// problem is why an object is not Ready: a condition reason and a message
// that says what to change.
type problem struct {
	Reason, Message string
}

func (p *problem) Error() string { return p.Reason + ": " + p.Message }

// addressInputs are what an attachment's addresses are decided from, all
// read from the informers' caches (and the controller's own creates not
// yet seen there).
type addressInputs struct {
	// Name and VPC name the attachment and its VPC; UID is its identity.
	Name, VPC string
	UID       types.UID
	// Requests is spec.addresses.
	Requests []v1alpha1.IPAddress
	// Families is spec.ipFamilies; nil means every family of Networks.
	Families []v1alpha1.IPFamily
	// Networks are the VPC's networks.
	Networks []netip.Prefix
	// Bound are the addresses bound to this attachment (its UID).
	Bound []netip.Addr
	// Published is status.addresses: what nodes may already use.
	Published []v1alpha1.Prefix
	// Retained are the VPC's reservations kept for an attachment of this
	// name (state Retained, spec.attachment == Name).
	Retained []*v1alpha1.VPCAddress
	// Holders are the VPCAddresses of the requested addresses that exist
	// (by address), whoever holds them.
	Holders map[netip.Addr]*v1alpha1.VPCAddress
}

// slot is one address an attachment should have: a requested one, or one
// of a family.
type slot struct {
	Family v1alpha1.IPFamily
	// Request is the requested address; invalid for a slot of a family.
	Request netip.Addr
	// Have is the address already bound to the attachment for this slot.
	Have netip.Addr
	// Bind is a reservation of the attachment's name to take over.
	Bind *v1alpha1.VPCAddress
	// Networks are where a slot of a family looks, in order.
	Networks []netip.Prefix
}

// addressPlan is what an attachment's addresses need.
type addressPlan struct {
	Slots []slot
	// Release are addresses bound to the attachment that no slot wants and
	// that were never published: extra claims of a race, safe to free.
	Release []netip.Addr
	// Problem, when set, is found before any write: nothing new is claimed.
	Problem *problem
}

// planAddresses decides, from the caches alone, which addresses an
// attachment keeps, which reservations it binds and which slots need a
// new claim. A request outside the VPC, a reserved address or one the
// cache shows held by another attachment is a Problem; so is a family the
// VPC has no network of.
func planAddresses(in addressInputs) addressPlan {
	var plan addressPlan
	bound := map[netip.Addr]bool{}
	for _, a := range in.Bound {
		bound[a] = true
	}
	published := map[netip.Addr]bool{}
	for _, p := range in.Published {
		if pp, err := netip.ParsePrefix(string(p)); err == nil {
			published[pp.Addr()] = true
		}
	}
	used := map[netip.Addr]bool{}
	retained := map[netip.Addr]*v1alpha1.VPCAddress{}
	for _, r := range in.Retained {
		if a, err := netip.ParseAddr(string(r.Spec.Address)); err == nil {
			retained[a] = r
		}
	}

	if len(in.Requests) > 0 {
		for i, raw := range in.Requests {
			a, err := netip.ParseAddr(string(raw))
			if err != nil || a.Zone() != "" {
				plan.Problem = &problem{v1alpha1.ReasonOutsideVPC, fmt.Sprintf("spec.addresses[%d] %q is not an IP address: create a VPCAttachment with addresses such as 10.20.0.5", i, raw)}
				return plan
			}
			n, ok := networkOf(in.Networks, a)
			if !ok {
				plan.Problem = &problem{v1alpha1.ReasonOutsideVPC, fmt.Sprintf("spec.addresses[%d] %s is outside VPC %s (%s): request an address in one of its networks or add a network to the VPC", i, a, in.VPC, joinPrefixes(in.Networks))}
				return plan
			}
			if why := reserved(n, a); why != "" {
				plan.Problem = &problem{v1alpha1.ReasonAddressInUse, fmt.Sprintf("spec.addresses[%d] %s is %s: request another address", i, a, why)}
				return plan
			}
			s := slot{Family: familyOf(a), Request: a}
			switch h := in.Holders[a]; {
			case bound[a]:
				s.Have = a
			case retained[a] != nil:
				s.Bind = retained[a]
			case h != nil && h.Spec.AttachmentUID != in.UID:
				plan.Problem = &problem{v1alpha1.ReasonAddressInUse, heldMessage(i, a, h, in.Name)}
				return plan
			}
			used[a] = true
			plan.Slots = append(plan.Slots, s)
		}
	} else {
		fams := in.Families
		if fams == nil {
			fams = familiesOf(in.Networks)
		}
		for _, f := range fams {
			nets := networksOf(in.Networks, f)
			if len(nets) == 0 {
				plan.Problem = &problem{v1alpha1.ReasonPoolExhausted, fmt.Sprintf("VPC %s has no %s network (%s): add one to the VPC's spec.networks, or create a VPCAttachment without %s in spec.ipFamilies", in.VPC, f, joinPrefixes(in.Networks), f)}
				return plan
			}
			plan.Slots = append(plan.Slots, slot{Family: f, Networks: nets})
		}
		// A slot keeps an address it has, preferring one nodes may use
		// already, then the lowest; else it binds this name's reservation.
		for i := range plan.Slots {
			s := &plan.Slots[i]
			s.Have = pick(in.Bound, s, used, func(a netip.Addr) bool { return published[a] })
			if !s.Have.IsValid() {
				s.Have = pick(in.Bound, s, used, func(netip.Addr) bool { return true })
			}
			if s.Have.IsValid() {
				used[s.Have] = true
				continue
			}
			if a := pick(slices.Collect(maps.Keys(retained)), s, used, func(netip.Addr) bool { return true }); a.IsValid() {
				s.Bind = retained[a]
				used[a] = true
			}
		}
	}
	for _, a := range in.Bound {
		if !used[a] && !published[a] {
			plan.Release = append(plan.Release, a)
		}
	}
	slices.SortFunc(plan.Release, netip.Addr.Compare)
	return plan
}

// pick is the lowest address of addrs that fits slot s (its family and
// networks), is not used by another slot and satisfies prefer.
func pick(addrs []netip.Addr, s *slot, used map[netip.Addr]bool, prefer func(netip.Addr) bool) netip.Addr {
	var best netip.Addr
	for _, a := range addrs {
		if used[a] || familyOf(a) != s.Family || !prefer(a) {
			continue
		}
		if _, ok := networkOf(s.Networks, a); !ok {
			continue
		}
		if !best.IsValid() || a.Less(best) {
			best = a
		}
	}
	return best
}

// heldMessage says who holds a requested address and what to do.
func heldMessage(i int, a netip.Addr, h *v1alpha1.VPCAddress, name string) string {
	switch {
	case h.Spec.State == v1alpha1.AddressRetained:
		return fmt.Sprintf("spec.addresses[%d] %s is reserved for VPCAttachment %s (Retained): request another address, or delete VPCAddress %s to release it", i, a, h.Spec.Attachment, h.Name)
	case h.Spec.Attachment == name:
		return fmt.Sprintf("spec.addresses[%d] %s is still held by the VPCAttachment %s this one replaces (UID %s); it is released, or kept under Retain, once that one is gone", i, a, name, h.Spec.AttachmentUID)
	}
	return fmt.Sprintf("spec.addresses[%d] %s is held by VPCAttachment %s: request another address", i, a, h.Spec.Attachment)
}

// statusAddresses are the slots' addresses with their network's prefix
// length, in slot order, then any published address kept beyond them.
func statusAddresses(have []netip.Addr, nets []netip.Prefix) []v1alpha1.Prefix {
	out := make([]v1alpha1.Prefix, 0, len(have))
	for _, a := range have {
		bits := a.BitLen()
		if n, ok := networkOf(nets, a); ok {
			bits = n.Bits()
		}
		out = append(out, v1alpha1.Prefix(netip.PrefixFrom(a, bits).String()))
	}
	return out
}

// addressObject is the VPCAddress that binds a to an attachment.
func addressObject(namespace, vpc string, vpcUID types.UID, a netip.Addr, attachment string, uid types.UID) *v1alpha1.VPCAddress {
	return &v1alpha1.VPCAddress{
		ObjectMeta: objectMeta(namespace, names.VPCAddressName(vpc, a), map[string]string{
			v1alpha1.LabelVPCUID:        string(vpcUID),
			v1alpha1.LabelAttachmentUID: string(uid),
		}, v1alpha1.FinalizerAddress),
		Spec: v1alpha1.VPCAddressSpec{
			VPC: vpc, VPCUID: vpcUID, Address: v1alpha1.IPAddress(a.String()),
			Attachment: attachment, AttachmentUID: uid, State: v1alpha1.AddressBound,
		},
	}
}
