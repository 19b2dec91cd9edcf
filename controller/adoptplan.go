package controller

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// VPCNetworks is the value of adopt's --vpc-networks: the networks of
// each VPC adopt creates, in the order given.
type VPCNetworks struct {
	Names    []string
	Networks map[string][]v1alpha1.CIDR
}

// ParseVPCNetworks reads --vpc-networks values such as
// "blue=10.20.0.0/16,fd20::/48,red=10.30.0.0/16": an item with "=" starts
// a VPC, an item without one adds a network to the VPC before it. The
// flag may be given several times. Errors name the item and the VPC.
func ParseVPCNetworks(values []string) (VPCNetworks, error) {
	out := VPCNetworks{Networks: map[string][]v1alpha1.CIDR{}}
	for _, v := range values {
		cur := ""
		for item := range strings.SplitSeq(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				return out, fmt.Errorf("--vpc-networks %q: an empty item; write blue=10.20.0.0/16,fd20::/48,red=10.30.0.0/16", v)
			}
			if name, cidr, ok := strings.Cut(item, "="); ok {
				if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
					return out, fmt.Errorf("--vpc-networks %q: VPC name %q is not a DNS-1123 label: %s", v, name, strings.Join(errs, "; "))
				}
				if _, dup := out.Networks[name]; dup {
					return out, fmt.Errorf("--vpc-networks: VPC %s is named twice; list all its networks after one %s=", name, name)
				}
				cur, item = name, cidr
				out.Names = append(out.Names, name)
				out.Networks[name] = nil
			}
			if cur == "" {
				return out, fmt.Errorf("--vpc-networks %q: %q names no VPC; write <vpc>=<network>[,<network>...]", v, item)
			}
			out.Networks[cur] = append(out.Networks[cur], v1alpha1.CIDR(item))
		}
	}
	for _, name := range out.Names {
		if _, err := parseNetworks(out.Networks[name]); err != nil {
			return out, fmt.Errorf("--vpc-networks %s: %s", name, strings.Replace(err.Error(), "spec.networks", "networks", 1))
		}
	}
	return out, nil
}

// adoptInputs are what adopt reads before it writes anything.
type adoptInputs struct {
	// Namespace is the tenant's; Networks the --vpc-networks.
	Namespace string
	Networks  VPCNetworks
	// Adverts are every advertisement in galactic's namespace.
	Adverts []v1alpha1.BGPAdvertisement
	// VPCs and Attachments are the tenant namespace's; VNIs the cluster's.
	VPCs        []v1alpha1.VPC
	Attachments []v1alpha1.VPCAttachment
	VNIs        []v1alpha1.VNI
}

// adoptPlan is what adopt makes of the inline attachments.
type adoptPlan struct {
	VPCs []vpcAdoption
	// Skipped describes inline VPCs that no --vpc-networks named.
	Skipped []string
}

// vpcAdoption is one inline VPC: the VPC object to have and its
// attachments. Existing is the object when an earlier run made it.
type vpcAdoption struct {
	Name        string
	VNI         int32
	Networks    []v1alpha1.CIDR
	Existing    *v1alpha1.VPC
	Attachments []attachmentAdoption
}

// attachmentAdoption is one inline attachment: its requested addresses
// (the ones its nodes advertise) and announce policy.
type attachmentAdoption struct {
	Name      string
	Addresses []v1alpha1.IPAddress
	Announce  v1alpha1.Announce
	Existing  *v1alpha1.VPCAttachment
}

// inlineVPC gathers what the inline advertisements say of one VPC.
type inlineVPC struct {
	vnis        map[int32][]string // VNI -> advertisements naming it
	attachments map[string]*inlineAttachment
}

type inlineAttachment struct {
	addresses map[netip.Addr]string // address -> an advertisement naming it
	announce  map[v1alpha1.Announce][]string
}

// planAdoption decides, without writing, which VPCs and attachments adopt
// creates or finds and with what; any error names the advertisement,
// object or --vpc-networks key to change, and means nothing is written.
func planAdoption(in adoptInputs) (*adoptPlan, error) {
	inline, err := gatherInline(in.Adverts)
	if err != nil {
		return nil, err
	}
	vpcs := map[string]*v1alpha1.VPC{}
	for i := range in.VPCs {
		vpcs[in.VPCs[i].Name] = &in.VPCs[i]
	}
	// The VPCs adopted: those --vpc-networks names and those an earlier
	// run made (labelled), so that a run without the flag completes one.
	var selected []string
	selected = append(selected, in.Networks.Names...)
	for _, v := range in.VPCs {
		if adopting(v.Labels) && !slices.Contains(selected, v.Name) {
			selected = append(selected, v.Name)
		}
	}
	plan := &adoptPlan{}
	for _, name := range slices.Sorted(maps.Keys(inline)) {
		if !slices.Contains(selected, name) {
			plan.Skipped = append(plan.Skipped, fmt.Sprintf("%s (%d inline attachments): name it in --vpc-networks to adopt it", name, len(inline[name].attachments)))
		}
	}
	vniHolder := map[int32]*v1alpha1.VNI{}
	for i := range in.VNIs {
		vniHolder[vniValue(&in.VNIs[i])] = &in.VNIs[i]
	}
	claimedVNI := map[int32]string{}
	attachmentVPC := map[string]string{}
	for _, name := range selected {
		va, err := planVPC(in, name, vpcs[name], inline[name], inline, vniHolder)
		if err != nil {
			return nil, err
		}
		if other, dup := claimedVNI[va.VNI]; dup {
			return nil, fmt.Errorf("inline VPCs %s and %s both use VNI %d: their nodes already mix them; adopt cannot separate them", other, name, va.VNI)
		}
		claimedVNI[va.VNI] = name
		for _, a := range va.Attachments {
			if other, dup := attachmentVPC[a.Name]; dup {
				return nil, fmt.Errorf("inline attachments %s/%s and %s/%s have one name, and namespace %s holds one VPCAttachment %s: adopt their VPCs into different namespaces", other, a.Name, name, a.Name, in.Namespace, a.Name)
			}
			attachmentVPC[a.Name] = name
		}
		plan.VPCs = append(plan.VPCs, *va)
	}
	return plan, nil
}

// gatherInline groups the advertisements without an attachment UID by
// VPC and attachment.
func gatherInline(adverts []v1alpha1.BGPAdvertisement) (map[string]*inlineVPC, error) {
	out := map[string]*inlineVPC{}
	for _, a := range adverts {
		if a.Labels[v1alpha1.LabelAttachmentUID] != "" {
			continue
		}
		v := out[a.Spec.VPC]
		if v == nil {
			v = &inlineVPC{vnis: map[int32][]string{}, attachments: map[string]*inlineAttachment{}}
			out[a.Spec.VPC] = v
		}
		if a.Spec.VNI != 0 {
			v.vnis[a.Spec.VNI] = append(v.vnis[a.Spec.VNI], a.Name)
		}
		att := v.attachments[a.Spec.Attachment]
		if att == nil {
			att = &inlineAttachment{addresses: map[netip.Addr]string{}, announce: map[v1alpha1.Announce][]string{}}
			v.attachments[a.Spec.Attachment] = att
		}
		announce := a.Spec.Announce
		if announce == "" {
			announce = v1alpha1.AnnounceAlways
		}
		att.announce[announce] = append(att.announce[announce], a.Name)
		for _, p := range a.Spec.Prefixes {
			pfx, err := netip.ParsePrefix(string(p))
			if err != nil || pfx.Bits() != pfx.Addr().BitLen() {
				return nil, fmt.Errorf("advertisement %s: prefix %q is not a host prefix (/32 or /128): adopt takes addresses only from host prefixes", a.Name, p)
			}
			att.addresses[pfx.Addr()] = a.Name
		}
	}
	return out, nil
}

// planVPC plans one VPC: its networks from --vpc-networks or the object
// an earlier run made, its VNI from the advertisements or that object.
func planVPC(in adoptInputs, name string, existing *v1alpha1.VPC, iv *inlineVPC, all map[string]*inlineVPC, vniHolder map[int32]*v1alpha1.VNI) (*vpcAdoption, error) {
	given, named := in.Networks.Networks[name]
	if iv == nil && (existing == nil || !adopting(existing.Labels)) {
		return nil, fmt.Errorf("--vpc-networks %s: no node advertises an inline attachment of VPC %s (inline VPCs: %s)", name, name, orNone(slices.Sorted(maps.Keys(all))))
	}
	va := &vpcAdoption{Name: name, Networks: given, Existing: existing}
	if iv != nil {
		switch len(iv.vnis) {
		case 0:
			return nil, fmt.Errorf("inline VPC %s: no advertisement of it carries a VNI: its nodes do not route it, so there is nothing to keep", name)
		case 1:
			for n := range iv.vnis {
				va.VNI = n
			}
		default:
			var parts []string
			for _, n := range slices.Sorted(maps.Keys(iv.vnis)) {
				parts = append(parts, fmt.Sprintf("%d (%s)", n, strings.Join(iv.vnis[n], ", ")))
			}
			return nil, fmt.Errorf("inline VPC %s: its advertisements carry different VNIs: %s; make its nodes agree first", name, strings.Join(parts, ", "))
		}
	}
	if existing != nil {
		if !adopting(existing.Labels) {
			return nil, fmt.Errorf("VPC %s/%s exists and was not made by adopt (no label %s=true): delete or rename it, or adopt into another namespace", in.Namespace, name, v1alpha1.LabelAdopted)
		}
		if existing.Spec.VNI == nil || (va.VNI != 0 && *existing.Spec.VNI != va.VNI) {
			return nil, fmt.Errorf("VPC %s/%s exists with spec.vni %s, but its nodes use VNI %d", in.Namespace, name, vniString(existing.Spec.VNI), va.VNI)
		}
		va.VNI = *existing.Spec.VNI
		if dp := existing.Status.DataplaneName; dp != "" && dp != name {
			return nil, fmt.Errorf("VPC %s/%s exists with status.dataplaneName %s, not its inline name %s", in.Namespace, name, dp, name)
		}
		for _, n := range given {
			if !slices.Contains(existing.Spec.Networks, n) {
				return nil, fmt.Errorf("--vpc-networks %s: network %s is not in VPC %s/%s, which exists with %s: add it to the VPC's spec.networks, or leave it out", name, n, in.Namespace, name, joinCIDRs(existing.Spec.Networks))
			}
		}
		va.Networks = existing.Spec.Networks
	} else if !named {
		return nil, fmt.Errorf("inline VPC %s: no networks: name them with --vpc-networks %s=<network>[,<network>...]", name, name)
	}
	if h := vniHolder[va.VNI]; h != nil && (existing == nil || h.Spec.VPCUID != existing.UID) {
		return nil, fmt.Errorf("inline VPC %s: its VNI %d is held by VPC %s/%s (VNI object %s): it cannot be granted to %s/%s", name, va.VNI, h.Spec.Namespace, h.Spec.VPC, h.Name, in.Namespace, name)
	}
	nets, err := parseNetworks(va.Networks)
	if err != nil {
		return nil, fmt.Errorf("VPC %s: %w", name, err)
	}
	atts, err := planAttachments(in, name, iv, nets)
	if err != nil {
		return nil, err
	}
	va.Attachments = atts
	return va, nil
}

// planAttachments plans the attachments of one VPC: its inline ones and
// those an earlier run made.
func planAttachments(in adoptInputs, vpc string, iv *inlineVPC, nets []netip.Prefix) ([]attachmentAdoption, error) {
	existing := map[string]*v1alpha1.VPCAttachment{}
	for i := range in.Attachments {
		existing[in.Attachments[i].Name] = &in.Attachments[i]
	}
	names := map[string]bool{}
	if iv != nil {
		for n := range iv.attachments {
			names[n] = true
		}
	}
	for _, a := range in.Attachments {
		if adopting(a.Labels) && a.Spec.VPC == vpc {
			names[a.Name] = true
		}
	}
	owner := map[netip.Addr]string{}
	var out []attachmentAdoption
	for _, name := range slices.Sorted(maps.Keys(names)) {
		aa := attachmentAdoption{Name: name, Announce: v1alpha1.AnnounceAlways, Existing: existing[name]}
		var addrs []netip.Addr
		if iv != nil && iv.attachments[name] != nil {
			ia := iv.attachments[name]
			if len(ia.announce) > 1 {
				return nil, fmt.Errorf("inline attachment %s/%s: its advertisements disagree on spec.announce (%v): make its nodes agree first", vpc, name, ia.announce)
			}
			for a := range ia.announce {
				aa.Announce = a
			}
			addrs = slices.SortedFunc(maps.Keys(ia.addresses), func(x, y netip.Addr) int { return x.Compare(y) })
			for _, a := range addrs {
				if err := adoptableAddress(vpc, name, a, ia.addresses[a], nets); err != nil {
					return nil, err
				}
			}
			if len(addrs) > 8 {
				return nil, fmt.Errorf("inline attachment %s/%s: %d addresses, a VPCAttachment holds at most 8", vpc, name, len(addrs))
			}
		}
		if cur := aa.Existing; cur != nil {
			if err := checkExistingAttachment(in.Namespace, vpc, cur, addrs); err != nil {
				return nil, err
			}
			addrs = addrs[:0]
			for _, r := range cur.Spec.Addresses {
				if a, err := netip.ParseAddr(string(r)); err == nil {
					addrs = append(addrs, a)
				}
			}
			if cur.Spec.Announce != "" {
				aa.Announce = cur.Spec.Announce
			}
		}
		for _, a := range addrs {
			if other, dup := owner[a]; dup {
				return nil, fmt.Errorf("inline attachments %s/%s and %s/%s both advertise %s: one address cannot be adopted twice in a VPC", vpc, other, vpc, name, a)
			}
			owner[a] = name
			aa.Addresses = append(aa.Addresses, v1alpha1.IPAddress(a.String()))
		}
		out = append(out, aa)
	}
	return out, nil
}

// adoptableAddress says whether a, advertised by advert, can be a
// requested address of the VPC's networks.
func adoptableAddress(vpc, att string, a netip.Addr, advert string, nets []netip.Prefix) error {
	n, ok := networkOf(nets, a)
	if !ok {
		return fmt.Errorf("inline attachment %s/%s: address %s (advertisement %s) is outside VPC %s's networks %s: add its network to --vpc-networks %s", vpc, att, a, advert, vpc, joinPrefixes(nets), vpc)
	}
	if why := reserved(n, a); why != "" {
		return fmt.Errorf("inline attachment %s/%s: address %s (advertisement %s) is %s, which the controller never gives: choose another network in --vpc-networks %s", vpc, att, a, advert, why, vpc)
	}
	return nil
}

// checkExistingAttachment accepts an attachment an earlier run made for
// inline vpc/name whose nodes advertise addrs.
func checkExistingAttachment(ns, vpc string, cur *v1alpha1.VPCAttachment, addrs []netip.Addr) error {
	id := ns + "/" + cur.Name
	if !adopting(cur.Labels) {
		return fmt.Errorf("VPCAttachment %s exists and was not made by adopt (no label %s=true): delete or rename it, or adopt into another namespace", id, v1alpha1.LabelAdopted)
	}
	if cur.Spec.VPC != vpc {
		return fmt.Errorf("VPCAttachment %s exists in VPC %s, but its nodes advertise it in VPC %s", id, cur.Spec.VPC, vpc)
	}
	for _, a := range addrs {
		if !slices.Contains(cur.Spec.Addresses, v1alpha1.IPAddress(a.String())) {
			return fmt.Errorf("VPCAttachment %s exists with spec.addresses %v, but its nodes also advertise %s", id, cur.Spec.Addresses, a)
		}
	}
	if dp := cur.Status.Dataplane; dp != nil && (dp.VPC != vpc || dp.Attachment != cur.Name) {
		return fmt.Errorf("VPCAttachment %s exists with status.dataplane %s/%s, not its inline names %s/%s", id, dp.VPC, dp.Attachment, vpc, cur.Name)
	}
	return nil
}

// adoptedUID is the UID the labels of a lease or advertisement name.
func adoptedUID(labels map[string]string) types.UID {
	return types.UID(labels[v1alpha1.LabelAttachmentUID])
}

func vniString(v *int32) string {
	if v == nil {
		return "absent"
	}
	return fmt.Sprint(*v)
}

func joinCIDRs(c []v1alpha1.CIDR) string {
	s := make([]string, len(c))
	for i, n := range c {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
