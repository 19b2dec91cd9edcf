package router

import (
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/router/speaker"
)

// Availability answers for a whenAvailable advertisement whether its
// current holder reports itself available.
type Availability func(adv *v1alpha1.BGPAdvertisement, e v1alpha1.ContainerEntry) (metav1.ConditionStatus, string, string)

// ExportInput is everything export is computed from.
type ExportInput struct {
	Adverts []*v1alpha1.BGPAdvertisement
	// Live says whether an entry's netns exists.
	Live func(netns string) bool
	// Available judges whenAvailable advertisements; nil means unknown.
	Available Availability
	// VNIs are the VPCs' resolved VNIs (ResolveVNIs of the Granted).
	VNIs map[string]uint32
	// Attachments finds the VPCAttachment of an object-backed
	// advertisement; nil when the router does not watch them, and then
	// no object-backed advertisement is announced.
	Attachments AttachmentLookup
	// RD returns the VPC's route distinguisher.
	RD func(vpc string) speaker.RD
	// RouterMAC returns the MAC of the VPC's VXLAN device, nil when the
	// device does not exist yet.
	RouterMAC func(vpc string) net.HardwareAddr
	Underlay  netip.Addr
	RTASN     uint16
	// Announced is what the speaker holds now: a whenAvailable route that
	// stops being available is re-announced drained instead of vanishing.
	Announced map[speaker.Key]speaker.Route
}

// Verdict is export's judgement of one advertisement.
type Verdict struct {
	// Announced is true when its prefixes are announced undrained.
	Announced bool
	// Reason is Announced's reason when false (PrefixNotOwned, NoVNI,
	// VNIConflict, HolderUnavailable, NoLiveEntry, NoDevice).
	Reason, Message string
	// Holder is the HolderAvailable condition for whenAvailable adverts;
	// empty Status for announce: always.
	Holder metav1.Condition
}

// serving says whether an entry counts for export: this attachment's
// (its attachmentUID the advertisement's label, both empty when inline;
// another is a predecessor's), live, and not a live-migration target
// still on standby.
func serving(adv *v1alpha1.BGPAdvertisement, e v1alpha1.ContainerEntry, live func(string) bool) bool {
	return e.AttachmentUID == AttachmentUID(adv) && !e.Standby && live(e.Netns)
}

// liveEntry is the live entry with the highest holderGeneration: the
// current holder's, when handoff is on.
func liveEntry(adv *v1alpha1.BGPAdvertisement, live func(string) bool) (v1alpha1.ContainerEntry, bool) {
	var best v1alpha1.ContainerEntry
	found := false
	for _, e := range adv.Spec.Containers {
		if !serving(adv, e, live) {
			continue
		}
		if !found || e.HolderGeneration > best.HolderGeneration {
			best, found = e, true
		}
	}
	return best, found
}

// livePrefixes is the union of the live entries' prefixes: spec.prefixes
// may still list those of an entry whose netns is gone.
func livePrefixes(adv *v1alpha1.BGPAdvertisement, live func(string) bool) []v1alpha1.Prefix {
	seen := map[v1alpha1.Prefix]bool{}
	var out []v1alpha1.Prefix
	for _, e := range adv.Spec.Containers {
		if !serving(adv, e, live) {
			continue
		}
		for _, p := range e.Prefixes {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// ResolveVNIs picks each VPC's VNI from this node's advertisements: the one
// the VPC already has (prev) while an advertisement still names it, else
// the oldest advertisement's. A VNI already taken by another VPC is not
// given to a second one.
func ResolveVNIs(adverts []*v1alpha1.BGPAdvertisement, prev map[string]uint32) map[string]uint32 {
	sorted := slices.Clone(adverts)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	out := map[string]uint32{}
	owner := map[uint32]string{}
	named := map[string]map[uint32]bool{}
	for _, a := range sorted {
		if a.Spec.VNI <= 0 {
			continue
		}
		if named[a.Spec.VPC] == nil {
			named[a.Spec.VPC] = map[uint32]bool{}
		}
		named[a.Spec.VPC][uint32(a.Spec.VNI)] = true
	}
	// Keep what is still named first, so a newer conflicting advertisement
	// never takes a VPC's VNI away.
	vpcs := make([]string, 0, len(prev))
	for vpc := range prev {
		vpcs = append(vpcs, vpc)
	}
	sort.Strings(vpcs)
	for _, vpc := range vpcs {
		if v := prev[vpc]; named[vpc][v] && owner[v] == "" {
			out[vpc], owner[v] = v, vpc
		}
	}
	for _, a := range sorted {
		v := uint32(a.Spec.VNI)
		if v == 0 {
			continue
		}
		if _, ok := out[a.Spec.VPC]; ok || owner[v] != "" {
			continue
		}
		out[a.Spec.VPC], owner[v] = v, a.Spec.VPC
	}
	return out
}

// Desired computes the routes this node should announce and a verdict per
// advertisement (by name). It reads nothing but its input.
func Desired(in ExportInput) (map[speaker.Key]speaker.Route, map[string]Verdict) {
	routes := map[speaker.Key]speaker.Route{}
	verdicts := map[string]Verdict{}
	for _, adv := range in.Adverts {
		verdicts[adv.Name] = desire(adv, in, routes)
	}
	return routes, verdicts
}

// desire judges one advertisement and adds the routes it wants to routes.
func desire(adv *v1alpha1.BGPAdvertisement, in ExportInput, routes map[speaker.Key]speaker.Route) Verdict {
	e, live := liveEntry(adv, in.Live)
	prefixes := livePrefixes(adv, in.Live)
	v, avail, kept := judgeHolder(adv, e, live, in)
	mac := in.RouterMAC(adv.Spec.VPC)
	if v.Reason, v.Message = refusal(adv, in, live, prefixes, mac); v.Reason != "" {
		return v
	}
	rd := in.RD(adv.Spec.VPC)
	drained := avail != metav1.ConditionTrue
	for _, p := range prefixes {
		pfx, err := netip.ParsePrefix(string(p))
		if err != nil {
			continue
		}
		r := speaker.Route{
			RD: rd, Prefix: pfx.Masked(), VNI: in.VNIs[adv.Spec.VPC], RTASN: in.RTASN, NextHop: in.Underlay,
			RouterMAC: mac, Generation: uint32(e.HolderGeneration), Drained: drained,
		}
		if drained || kept {
			// Only a route peers already have is re-announced drained
			// (or kept); one never available is simply not announced.
			if _, was := in.Announced[r.Key()]; !was {
				continue
			}
		}
		// Of two claims of one prefix the higher generation wins, then
		// the undrained, so the watch cache's order never decides.
		if cur, dup := routes[r.Key()]; dup && (cur.Generation > r.Generation || cur.Generation == r.Generation && (!cur.Drained || r.Drained)) {
			continue
		}
		routes[r.Key()] = r
	}
	if drained {
		v.Reason, v.Message = v1alpha1.ReasonHolderUnavailable, "the current holder does not report itself available: "+v.Holder.Reason
	} else {
		v.Announced = true
	}
	return v
}

// judgeHolder gives a verdict its HolderAvailable condition where a
// holder can be judged, and says whether the advertisement's routes are
// available and whether they are kept as last announced.
func judgeHolder(adv *v1alpha1.BGPAdvertisement, e v1alpha1.ContainerEntry, live bool, in ExportInput) (v Verdict, avail metav1.ConditionStatus, kept bool) {
	avail = metav1.ConditionTrue
	gated := adv.Spec.Announce == v1alpha1.AnnounceWhenAvailable
	if !gated && (!live || e.HolderGeneration <= 0 || in.Available == nil) {
		return v, avail, false
	}
	status, reason, msg := metav1.ConditionUnknown, "NoHolder", "no live entry holds the attachment"
	if live && in.Available != nil {
		status, reason, msg = in.Available(adv, e)
	}
	v.Holder = metav1.Condition{Type: v1alpha1.ConditionHolderAvailable, Status: status, Reason: reason, Message: msg}
	if gated {
		avail = status
	}
	// A holder's lease leaves this node's watch when a live migration
	// releases it, and when another node takes it: the last answer
	// stands until a higher generation replaces it.
	if gated && live && reason == handoff.ReasonNoLease && e.HolderGeneration > 0 && announcedUndrained(adv, e, in) {
		avail, kept = metav1.ConditionTrue, true
	}
	return v, avail, kept
}

// refusal is why nothing of an advertisement is announced, "" when it
// may be: an object-backed one whose attachment does not grant it (first,
// so nothing else it claims is looked at), no VNI or another VPC's, no
// live entry, or no VXLAN device yet.
func refusal(adv *v1alpha1.BGPAdvertisement, in ExportInput, live bool, prefixes []v1alpha1.Prefix, mac net.HardwareAddr) (string, string) {
	if problem := Owned(adv, in.Attachments, prefixes); problem != "" {
		return v1alpha1.ReasonPrefixNotOwned, problem
	}
	vni, haveVNI := in.VNIs[adv.Spec.VPC]
	switch {
	case adv.Spec.VNI <= 0:
		return v1alpha1.ReasonNoVNI, "spec.vni is not set: the galactic-bgp stanza names no vni"
	case !haveVNI || vni != uint32(adv.Spec.VNI):
		return v1alpha1.ReasonVNIConflict, conflictMessage(adv, in.VNIs)
	case !live:
		return v1alpha1.ReasonNoLiveEntry, "no entry's netns exists on this node"
	case mac == nil:
		return "NoDevice", "the VPC's VXLAN device is not ready yet"
	}
	return "", ""
}

// announcedUndrained says whether e's generation of adv is announced
// undrained now.
func announcedUndrained(adv *v1alpha1.BGPAdvertisement, e v1alpha1.ContainerEntry, in ExportInput) bool {
	rd := in.RD(adv.Spec.VPC)
	for _, p := range e.Prefixes {
		pfx, err := netip.ParsePrefix(string(p))
		if err != nil {
			continue
		}
		k := speaker.Key{RD: rd, Prefix: pfx.Masked()}
		if r, ok := in.Announced[k]; ok && !r.Drained && r.Generation == uint32(e.HolderGeneration) {
			return true
		}
	}
	return false
}

func conflictMessage(adv *v1alpha1.BGPAdvertisement, vnis map[string]uint32) string {
	var b strings.Builder
	b.WriteString("spec.vni ")
	b.WriteString(strconv.Itoa(int(adv.Spec.VNI)))
	if v, ok := vnis[adv.Spec.VPC]; ok {
		b.WriteString(" differs from VPC " + adv.Spec.VPC + "'s VNI " + strconv.FormatUint(uint64(v), 10) + " on this node")
	} else {
		for vpc, v := range vnis {
			if v == uint32(adv.Spec.VNI) {
				b.WriteString(" is already VPC " + vpc + "'s VNI on this node")
			}
		}
	}
	return b.String()
}
