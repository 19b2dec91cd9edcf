package router

import (
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
)

const webUID = "0b5e7c1a-0000-4000-8000-000000000001"

// webAttachment is tenant-a's attachment web-0 as the controller writes
// it: its data-plane names blue/web-0, VNI 10100 and two addresses.
func webAttachment() *v1alpha1.VPCAttachment {
	return &v1alpha1.VPCAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "tenant-a", UID: types.UID(webUID)},
		Spec:       v1alpha1.VPCAttachmentSpec{VPC: "blue"},
		Status: v1alpha1.VPCAttachmentStatus{
			VNI: 10100, Addresses: []v1alpha1.Prefix{"10.20.0.5/16", "fd20::5/48"},
			Dataplane: &v1alpha1.Dataplane{VPC: "blue", Attachment: "web-0"},
		},
	}
}

// objectBacked labels adv as galactic-bgp labels an object-backed
// advertisement, and gives its entries the UID.
func objectBacked(adv *v1alpha1.BGPAdvertisement, ns, uid string) *v1alpha1.BGPAdvertisement {
	adv.Labels = map[string]string{v1alpha1.LabelNamespace: ns, v1alpha1.LabelAttachmentUID: uid}
	for i := range adv.Spec.Containers {
		adv.Spec.Containers[i].AttachmentUID = uid
	}
	return adv
}

func lookupOf(atts ...*v1alpha1.VPCAttachment) AttachmentLookup {
	return func(uid string) *v1alpha1.VPCAttachment {
		for _, a := range atts {
			if string(a.UID) == uid {
				return a
			}
		}
		return nil
	}
}

func TestAnObjectBackedAdvertisementIsOwnedOnlyAsItsAttachmentGrants(t *testing.T) {
	other := func(change func(*v1alpha1.VPCAttachment)) AttachmentLookup {
		a := webAttachment()
		change(a)
		return lookupOf(a)
	}
	cases := []struct {
		name     string
		adv      *v1alpha1.BGPAdvertisement
		lookup   AttachmentLookup
		prefixes []v1alpha1.Prefix
		// mentions is what the problem must name; "" means owned.
		mentions string
	}{
		{"an inline advertisement claims nothing", advert("web-0", "blue", 10100, 0, "", web), nil, []v1alpha1.Prefix{"10.99.0.1/32"}, ""},
		{"the attachment's host routes", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			[]v1alpha1.Prefix{"10.20.0.5/32", "fd20::5/128"}, ""},
		{"no prefix live yet", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()), nil, ""},
		{"another address", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			[]v1alpha1.Prefix{"10.20.0.5/32", "10.20.0.9/32"}, "prefix 10.20.0.9/32"},
		{"the attachment's network", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			[]v1alpha1.Prefix{"10.20.0.0/16"}, "prefix 10.20.0.0/16"},
		{"its address with the network's length", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			[]v1alpha1.Prefix{"fd20::5/48"}, "prefix fd20::5/48"},
		{"no attachment of the UID", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", "another-uid"), lookupOf(webAttachment()),
			nil, "no VPCAttachment with UID another-uid"},
		{"the UID in another namespace", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "mallory", webUID), lookupOf(webAttachment()),
			nil, `namespace "mallory"`},
		{"no data-plane names yet", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID),
			other(func(a *v1alpha1.VPCAttachment) { a.Status.Dataplane = nil }), nil, "no status.dataplane"},
		{"another VPC's name", objectBacked(advert("web-0", "red", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			nil, "spec.vpc/spec.attachment red/web-0"},
		{"another attachment's name", objectBacked(advert("web-1", "blue", 10100, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			nil, "spec.vpc/spec.attachment blue/web-1"},
		{"another VNI", objectBacked(advert("web-0", "blue", 10200, 0, "", web), "tenant-a", webUID), lookupOf(webAttachment()),
			nil, "spec.vni 10200 is not VPCAttachment tenant-a/web-0's status.vni 10100"},
		{"a router that does not watch attachments", objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID), nil,
			nil, "does not watch VPCAttachments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Owned(tc.adv, tc.lookup, tc.prefixes)
			switch {
			case tc.mentions == "" && got != "":
				t.Errorf("not owned (%s), want owned", got)
			case tc.mentions != "" && !strings.Contains(got, tc.mentions):
				t.Errorf("problem %q, want one naming %q", got, tc.mentions)
			}
		})
	}
}

func TestAnAdvertisementItsAttachmentDoesNotGrantIsNotAnnounced(t *testing.T) {
	owned := objectBacked(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, web, entry("c", "/live/c", 0)), "tenant-a", webUID)
	greedy := objectBacked(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, append(web, "10.20.0.9/32"), entry("c", "/live/c", 0)), "tenant-a", webUID)
	in := exportInput(owned)
	in.Attachments = lookupOf(webAttachment())
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 0, false), want("blue", "fd20::5/128", 10100, 0, false)))
	if v := verdicts["web-0"]; !v.Announced {
		t.Fatalf("verdict %+v, want its own addresses announced", v)
	}
	// Claiming one more address withdraws every path of it, not only the
	// one it was not given.
	in.Adverts, in.Announced = []*v1alpha1.BGPAdvertisement{greedy}, got
	got, verdicts = Desired(in)
	sameRoutes(t, got, routeSet())
	if v := verdicts["web-0"]; v.Announced || v.Reason != v1alpha1.ReasonPrefixNotOwned || !strings.Contains(v.Message, "10.20.0.9/32") {
		t.Errorf("verdict %+v, want PrefixNotOwned naming 10.20.0.9/32", v)
	}
	// Gone from the cache: the attachment was deleted.
	in.Adverts, in.Attachments = []*v1alpha1.BGPAdvertisement{owned}, lookupOf()
	got, verdicts = Desired(in)
	sameRoutes(t, got, routeSet())
	if v := verdicts["web-0"]; v.Reason != v1alpha1.ReasonPrefixNotOwned || !strings.Contains(v.Message, webUID) {
		t.Errorf("verdict %+v, want PrefixNotOwned naming the missing UID", v)
	}
}

func TestAWhenAvailableAdvertisementNotGrantedIsNotEvenDrained(t *testing.T) {
	adv := objectBacked(advert("web-0", "blue", 10200, 0, v1alpha1.AnnounceWhenAvailable, web, entry("c", "/live/c", 3)), "tenant-a", webUID)
	in := exportInput(adv)
	in.Attachments, in.Available = lookupOf(webAttachment()), judge(metav1.ConditionFalse, "Stopping")
	in.Announced = routeSet(want("blue", "10.20.0.5/32", 10200, 3, false))
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet())
	if v := verdicts["web-0"]; v.Reason != v1alpha1.ReasonPrefixNotOwned || !strings.Contains(v.Message, "spec.vni 10200") {
		t.Errorf("verdict %+v, want PrefixNotOwned naming the VNI", v)
	}
}

func TestAnEntryOfAnotherUIDIsNeverLive(t *testing.T) {
	mine := entry("c-new", "/live/new", 2)
	mine.Prefixes = []v1alpha1.Prefix{"10.20.0.5/32"}
	predecessor := entry("c-old", "/live/old", 7)
	predecessor.Prefixes = []v1alpha1.Prefix{"10.20.0.5/32", "10.20.0.6/32"}
	adv := objectBacked(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, nil, mine), "tenant-a", webUID)
	predecessor.AttachmentUID = "predecessor-uid"
	adv.Spec.Containers = append(adv.Spec.Containers, predecessor)
	in := exportInput(adv)
	in.Attachments = lookupOf(webAttachment())
	// The predecessor's prefix and generation count for nothing: its
	// 10.20.0.6/32 does not make the advertisement PrefixNotOwned.
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 2, false)))
	if v := verdicts["web-0"]; !v.Announced {
		t.Errorf("verdict %+v, want announced", v)
	}
	// Its entry alone: no live entry at all.
	adv.Spec.Containers = adv.Spec.Containers[1:]
	got, verdicts = Desired(in)
	sameRoutes(t, got, routeSet())
	if v := verdicts["web-0"]; v.Reason != v1alpha1.ReasonNoLiveEntry {
		t.Errorf("verdict %+v, want NoLiveEntry", v)
	}
	// An inline advertisement's entries carry no UID: one that does is
	// not of it either.
	inline := advert("web-1", "red", 10200, 0, v1alpha1.AnnounceAlways, web, entry("c", "/live/c", 0))
	inline.Spec.Containers[0].AttachmentUID = webUID
	if _, verdicts := Desired(exportInput(inline)); verdicts["web-1"].Reason != v1alpha1.ReasonNoLiveEntry {
		t.Errorf("verdict %+v, want NoLiveEntry", verdicts["web-1"])
	}
}

func TestOnlyGrantedAdvertisementsGiveAVPCItsVNI(t *testing.T) {
	// An older advertisement claims VPC blue with another VNI: granted, it
	// would be blue's VNI on this node and make the newer one a conflict.
	squatter := objectBacked(advert("web-0", "blue", 10200, 0, "", web), "tenant-a", webUID)
	legit := advert("web-1", "blue", 10100, 5, "", web)
	lookup := lookupOf(webAttachment())
	granted := Granted([]*v1alpha1.BGPAdvertisement{squatter, legit}, lookup)
	if len(granted) != 1 || granted[0] != legit {
		t.Fatalf("granted %v, want only the inline one", granted)
	}
	if vnis := ResolveVNIs(granted, nil); vnis["blue"] != 10100 {
		t.Errorf("VNIs %v, want blue 10100", vnis)
	}
	// A prefix the attachment was not given leaves the VNI granted: the
	// device and the VPC's received routes stay.
	greedy := objectBacked(advert("web-0", "blue", 10100, 0, "", []string{"10.99.0.1/32"}), "tenant-a", webUID)
	all := []*v1alpha1.BGPAdvertisement{greedy}
	if got := Granted(all, lookup); len(got) != 1 {
		t.Errorf("granted %v, want the advertisement whose VNI its attachment grants", got)
	}
}

func TestALeaseOfAnotherAttachmentIsNoLeaseAtAll(t *testing.T) {
	lease := func(uid string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "blue.web-0"}}
		if uid != "" {
			l.Labels = map[string]string{v1alpha1.LabelAttachmentUID: uid}
		}
		return l
	}
	var judged *coordinationv1.Lease
	j := func(l *coordinationv1.Lease, _ string, _ int64) (metav1.ConditionStatus, string, string) {
		judged = l
		if l == nil {
			return handoff.Availability(nil, "", 0)
		}
		return metav1.ConditionTrue, handoff.ReasonAvailable, "available"
	}
	backed := objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID)
	inline := advert("web-0", "blue", 10100, 0, "", web)
	cases := []struct {
		name  string
		adv   *v1alpha1.BGPAdvertisement
		lease *coordinationv1.Lease
		judge bool
	}{
		{"the attachment's own lease", backed, lease(webUID), true},
		{"a predecessor's lease", backed, lease("predecessor-uid"), false},
		{"an unlabelled lease", backed, lease(""), false},
		{"an inline attachment's lease", inline, lease(""), true},
		{"an object's lease for an inline advertisement", inline, lease(webUID), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			judged = nil
			status, reason, msg := judgeLease(j, tc.lease, tc.adv, "node-a/c", 3)
			switch {
			case tc.judge && (judged != tc.lease || status != metav1.ConditionTrue):
				t.Errorf("judged %v as %s, want the lease judged", judged, status)
			case !tc.judge && (judged != nil || status != metav1.ConditionUnknown || reason != handoff.ReasonNoLease || !strings.Contains(msg, "blue.web-0")):
				t.Errorf("judged %v as %s %s %q, want Unknown NoLease naming the lease", judged, status, reason, msg)
			}
		})
	}
}
