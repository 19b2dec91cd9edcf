package router

import (
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/router/speaker"
)

var (
	underlay = netip.MustParseAddr("192.0.2.11")
	epoch    = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	macs     = map[string]net.HardwareAddr{
		"blue": {0x02, 0, 0, 0, 0, 0x01},
		"red":  {0x02, 0, 0, 0, 0, 0x02},
	}
	rdNumbers = map[string]uint16{"blue": 1, "red": 2}
)

// entry is a container entry; a netns under /live/ exists, any other not.
func entry(id, netns string, gen int64) v1alpha1.ContainerEntry {
	return v1alpha1.ContainerEntry{ContainerID: id, IfName: "net0", Netns: netns, HolderGeneration: gen}
}

// advert is an advertisement created age minutes after epoch.
func advert(name, vpc string, vni int32, age int, announce v1alpha1.Announce, prefixes []string, entries ...v1alpha1.ContainerEntry) *v1alpha1.BGPAdvertisement {
	a := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(age) * time.Minute))},
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: vpc, Attachment: name, Node: "node-a", VNI: vni, Announce: announce, Containers: entries},
	}
	for _, p := range prefixes {
		a.Spec.Prefixes = append(a.Spec.Prefixes, v1alpha1.Prefix(p))
	}
	// As galactic-bgp publishes them: each entry with the attachment's prefixes.
	for i := range a.Spec.Containers {
		if a.Spec.Containers[i].Prefixes == nil {
			a.Spec.Containers[i].Prefixes = a.Spec.Prefixes
		}
	}
	return a
}

func TestOnlyTheLiveEntriesPrefixesAreAnnounced(t *testing.T) {
	live := entry("c2", "/live/c2", 1)
	live.Prefixes = []v1alpha1.Prefix{"10.20.0.6/32"}
	dead := entry("c1", "/dead/c1", 0)
	dead.Prefixes = []v1alpha1.Prefix{"10.20.0.5/32"}
	a := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32", "10.20.0.6/32"}, dead, live)
	routes, _ := Desired(exportInput(a))
	if len(routes) != 1 {
		t.Fatalf("routes %v, want only the live entry's 10.20.0.6/32", routes)
	}
	for k := range routes {
		if k.Prefix.String() != "10.20.0.6/32" {
			t.Fatalf("announced %s, a prefix only a dead entry has", k.Prefix)
		}
	}
}

func exportInput(adverts ...*v1alpha1.BGPAdvertisement) ExportInput {
	return ExportInput{
		Adverts:   adverts,
		Live:      func(netns string) bool { return strings.HasPrefix(netns, "/live/") },
		VNIs:      ResolveVNIs(adverts, nil),
		RD:        func(vpc string) speaker.RD { return speaker.RD{Admin: underlay, Assigned: rdNumbers[vpc]} },
		RouterMAC: func(vpc string) net.HardwareAddr { return macs[vpc] },
		Underlay:  underlay,
		RTASN:     65000,
		Announced: map[speaker.Key]speaker.Route{},
	}
}

// judge answers every availability question with status.
func judge(status metav1.ConditionStatus, reason string) Availability {
	return func(*v1alpha1.BGPAdvertisement, v1alpha1.ContainerEntry) (metav1.ConditionStatus, string, string) {
		return status, reason, "the holder says so"
	}
}

func want(vpc, prefix string, vni uint32, gen uint32, drained bool) speaker.Route {
	return speaker.Route{
		RD: speaker.RD{Admin: underlay, Assigned: rdNumbers[vpc]}, Prefix: netip.MustParsePrefix(prefix),
		VNI: vni, RTASN: 65000, NextHop: underlay, RouterMAC: macs[vpc], Generation: gen, Drained: drained,
	}
}

func routeSet(rs ...speaker.Route) map[speaker.Key]speaker.Route {
	out := map[speaker.Key]speaker.Route{}
	for _, r := range rs {
		out[r.Key()] = r
	}
	return out
}

func sameRoutes(t *testing.T, got, want map[speaker.Key]speaker.Route) {
	t.Helper()
	if !maps.EqualFunc(got, want, speaker.Route.Equal) {
		t.Errorf("routes\n got  %v\n want %v", got, want)
	}
}

var web = []string{"10.20.0.5/32", "fd20::5/128"}

func TestEveryPrefixIsAnnouncedOnceWithTheNewestLiveEntrysGeneration(t *testing.T) {
	a := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, append(web, "10.20.0.0/24", "not-a-prefix"),
		entry("old", "/live/old", 2), entry("new", "/live/new", 5), entry("gone", "/dead/gone", 9))
	got, verdicts := Desired(exportInput(a))
	sameRoutes(t, got, routeSet(
		want("blue", "10.20.0.5/32", 10100, 5, false),
		want("blue", "fd20::5/128", 10100, 5, false),
		want("blue", "10.20.0.0/24", 10100, 5, false),
	))
	if v := verdicts["web-0"]; !v.Announced || v.Reason != "" || v.Holder.Status != "" {
		t.Errorf("verdict %+v, want announced without a holder condition", v)
	}
}

func TestAPrefixWithHostBitsIsAnnouncedMasked(t *testing.T) {
	a := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/24"}, entry("c", "/live/c", 0))
	got, _ := Desired(exportInput(a))
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.0/24", 10100, 0, false)))
}

func TestAnAdvertisementThatCannotBeRoutedAnnouncesNothingAndSaysWhy(t *testing.T) {
	cases := []struct {
		name   string
		adv    *v1alpha1.BGPAdvertisement
		reason string
	}{
		{"no VNI", advert("web-0", "blue", 0, 0, v1alpha1.AnnounceAlways, web, entry("c", "/live/c", 0)), v1alpha1.ReasonNoVNI},
		{"no live entry", advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, web, entry("c", "/dead/c", 0)), v1alpha1.ReasonNoLiveEntry},
		{"no entry at all", advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, web), v1alpha1.ReasonNoLiveEntry},
		{"no VXLAN device yet", advert("web-0", "green", 10300, 0, v1alpha1.AnnounceAlways, web, entry("c", "/live/c", 0)), "NoDevice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, verdicts := Desired(exportInput(tc.adv))
			sameRoutes(t, got, routeSet())
			if v := verdicts["web-0"]; v.Announced || v.Reason != tc.reason || v.Message == "" {
				t.Errorf("verdict %+v, want reason %s with a message", v, tc.reason)
			}
		})
	}
}

func TestAConflictingVNIAnnouncesNothingWhileTheOlderClaimKeepsAnnouncing(t *testing.T) {
	older := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, entry("a", "/live/a", 0))
	cases := []struct {
		name  string
		newer *v1alpha1.BGPAdvertisement
	}{
		{"the same VPC with another VNI", advert("web-1", "blue", 10200, 1, v1alpha1.AnnounceAlways, []string{"10.20.0.6/32"}, entry("b", "/live/b", 0))},
		{"another VPC with the same VNI", advert("web-1", "red", 10100, 1, v1alpha1.AnnounceAlways, []string{"10.30.0.6/32"}, entry("b", "/live/b", 0))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Listed newest first: age decides, not order.
			got, verdicts := Desired(exportInput(tc.newer, older))
			sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 0, false)))
			if v := verdicts["web-0"]; !v.Announced {
				t.Errorf("older verdict %+v, want announced", v)
			}
			if v := verdicts["web-1"]; v.Announced || v.Reason != v1alpha1.ReasonVNIConflict || !strings.Contains(v.Message, "10100") {
				t.Errorf("newer verdict %+v, want VNIConflict naming 10100", v)
			}
		})
	}
}

func TestAWhenAvailableAttachmentNeverAvailableIsNotAnnounced(t *testing.T) {
	cases := []struct {
		name      string
		available Availability
		status    metav1.ConditionStatus
	}{
		{"no availability judge", nil, metav1.ConditionUnknown},
		{"the holder has not reported", judge(metav1.ConditionUnknown, "NotReported"), metav1.ConditionUnknown},
		{"the holder reports unavailable", judge(metav1.ConditionFalse, "SuccessorNotReady"), metav1.ConditionFalse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := exportInput(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceWhenAvailable, web, entry("c", "/live/c", 3)))
			in.Available = tc.available
			got, verdicts := Desired(in)
			sameRoutes(t, got, routeSet())
			v := verdicts["web-0"]
			if v.Announced || v.Reason != v1alpha1.ReasonHolderUnavailable {
				t.Errorf("verdict %+v, want HolderUnavailable", v)
			}
			if v.Holder.Type != v1alpha1.ConditionHolderAvailable || v.Holder.Status != tc.status || v.Holder.Reason == "" {
				t.Errorf("holder condition %+v, want HolderAvailable %s", v.Holder, tc.status)
			}
		})
	}
}

func TestAWhenAvailableAttachmentAnnouncedBeforeIsReannouncedDrained(t *testing.T) {
	in := exportInput(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceWhenAvailable, web, entry("c", "/live/c", 3)))
	in.Available = judge(metav1.ConditionFalse, "Stopping")
	// Only the IPv4 prefix reached the peers: the IPv6 one is not sent
	// now just to be drained.
	in.Announced = routeSet(want("blue", "10.20.0.5/32", 10100, 3, false))
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 3, true)))
	if v := verdicts["web-0"]; v.Announced || v.Reason != v1alpha1.ReasonHolderUnavailable || !strings.Contains(v.Message, "Stopping") {
		t.Errorf("verdict %+v, want HolderUnavailable with the holder's reason", v)
	}
	// A drained route already announced stays drained.
	in.Announced = got
	again, _ := Desired(in)
	sameRoutes(t, again, got)
}

func TestAWhenAvailableAttachmentWithAnAvailableHolderIsAnnouncedUndrained(t *testing.T) {
	in := exportInput(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceWhenAvailable, web, entry("c", "/live/c", 3)))
	in.Available = judge(metav1.ConditionTrue, "Serving")
	in.Announced = routeSet(want("blue", "10.20.0.5/32", 10100, 3, true))
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 3, false), want("blue", "fd20::5/128", 10100, 3, false)))
	if v := verdicts["web-0"]; !v.Announced || v.Holder.Status != metav1.ConditionTrue || v.Holder.Reason != "Serving" {
		t.Errorf("verdict %+v, want announced with HolderAvailable True", v)
	}
}

func TestAWhenAvailableAttachmentWithoutALiveEntryHasNoHolder(t *testing.T) {
	in := exportInput(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceWhenAvailable, web, entry("c", "/dead/c", 3)))
	called := false
	in.Available = func(*v1alpha1.BGPAdvertisement, v1alpha1.ContainerEntry) (metav1.ConditionStatus, string, string) {
		called = true
		return metav1.ConditionTrue, "Serving", ""
	}
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet())
	v := verdicts["web-0"]
	if called || v.Reason != v1alpha1.ReasonNoLiveEntry || v.Holder.Status != metav1.ConditionUnknown || v.Holder.Reason != "NoHolder" {
		t.Errorf("judge called %v, verdict %+v: want NoLiveEntry and HolderAvailable Unknown/NoHolder", called, v)
	}
}

func TestAnAlwaysAttachmentIsAnnouncedWhateverItsHolderReports(t *testing.T) {
	in := exportInput(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, web, entry("c", "/live/c", 3)))
	in.Available = judge(metav1.ConditionFalse, "SuccessorNotReady")
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 3, false), want("blue", "fd20::5/128", 10100, 3, false)))
	// The holder's report is shown, not obeyed.
	if v := verdicts["web-0"]; !v.Announced || v.Holder.Status != metav1.ConditionFalse {
		t.Errorf("verdict %+v, want announced with HolderAvailable False", v)
	}
}

func TestTwoAdvertisementsOfOnePrefixAnnounceTheHigherGeneration(t *testing.T) {
	// The handoff's successor publishes its own attachment while the
	// predecessor's entry still lives.
	pred := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, entry("p", "/live/p", 7))
	succ := advert("web-0b", "blue", 10100, 1, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, entry("s", "/live/s", 8))
	for _, order := range [][]*v1alpha1.BGPAdvertisement{{pred, succ}, {succ, pred}} {
		got, _ := Desired(exportInput(order...))
		sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 8, false)))
	}
}

func TestAVPCKeepsItsVNIWhileAnAdvertisementStillNamesIt(t *testing.T) {
	older := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, nil)
	newer := advert("web-1", "blue", 10200, 1, v1alpha1.AnnounceAlways, nil)
	red := advert("db-0", "red", 10100, 2, v1alpha1.AnnounceAlways, nil)
	unrouted := advert("x-0", "green", 0, 0, v1alpha1.AnnounceAlways, nil)
	cases := []struct {
		name    string
		adverts []*v1alpha1.BGPAdvertisement
		prev    map[string]uint32
		want    map[string]uint32
	}{
		{"the oldest advertisement decides", []*v1alpha1.BGPAdvertisement{newer, older}, nil, map[string]uint32{"blue": 10100}},
		{"the previous VNI stays while named", []*v1alpha1.BGPAdvertisement{newer, older}, map[string]uint32{"blue": 10200}, map[string]uint32{"blue": 10200}},
		{"a previous VNI no longer named is dropped", []*v1alpha1.BGPAdvertisement{older}, map[string]uint32{"blue": 10200}, map[string]uint32{"blue": 10100}},
		{"a VPC without advertisements has none", []*v1alpha1.BGPAdvertisement{older}, map[string]uint32{"red": 10300}, map[string]uint32{"blue": 10100}},
		{"a taken VNI is not given to a second VPC", []*v1alpha1.BGPAdvertisement{red, older}, nil, map[string]uint32{"blue": 10100}},
		{"a kept VNI beats an older claim of another VPC", []*v1alpha1.BGPAdvertisement{red, older}, map[string]uint32{"red": 10100}, map[string]uint32{"red": 10100}},
		{"a VNI freed by the kept one goes to the next VPC", []*v1alpha1.BGPAdvertisement{red, newer, older}, map[string]uint32{"blue": 10200}, map[string]uint32{"blue": 10200, "red": 10100}},
		{"no VNI is no entry", []*v1alpha1.BGPAdvertisement{unrouted}, map[string]uint32{"green": 10400}, map[string]uint32{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ResolveVNIs(tc.adverts, tc.prev); !maps.Equal(got, tc.want) {
				t.Errorf("ResolveVNIs = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAVPCsKeptVNIMakesTheOlderAdvertisementTheConflict(t *testing.T) {
	older := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, entry("a", "/live/a", 0))
	newer := advert("web-1", "blue", 10200, 1, v1alpha1.AnnounceAlways, []string{"10.20.0.6/32"}, entry("b", "/live/b", 0))
	in := exportInput(older, newer)
	in.VNIs = ResolveVNIs(in.Adverts, map[string]uint32{"blue": 10200})
	got, verdicts := Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.6/32", 10200, 0, false)))
	if verdicts["web-0"].Reason != v1alpha1.ReasonVNIConflict || !verdicts["web-1"].Announced {
		t.Errorf("verdicts %+v", verdicts)
	}
}

func TestOfTwoClaimsOfOneGenerationTheUndrainedIsAnnouncedWhateverTheOrder(t *testing.T) {
	// Without handoff every entry has generation 0; the list order of the
	// watch cache must not flip the route between drained and not.
	gated := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceWhenAvailable, []string{"10.20.0.5/32"}, entry("g", "/live/g", 0))
	always := advert("web-1", "blue", 10100, 1, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, entry("a", "/live/a", 0))
	for _, order := range [][]*v1alpha1.BGPAdvertisement{{gated, always}, {always, gated}} {
		in := exportInput(order...)
		in.Available = judge(metav1.ConditionFalse, "Stopping")
		in.Announced = routeSet(want("blue", "10.20.0.5/32", 10100, 0, false))
		got, _ := Desired(in)
		sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 0, false)))
	}
}
