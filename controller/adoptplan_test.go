package controller

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

func TestParseVPCNetworksReadsOneOrSeveralVPCsAndNamesTheKeyOnBadInput(t *testing.T) {
	got, err := ParseVPCNetworks([]string{"blue=10.20.0.0/16,fd20::/48,red=10.30.0.0/16", "green=10.40.0.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Names) != "[blue red green]" || fmt.Sprint(got.Networks["blue"]) != "[10.20.0.0/16 fd20::/48]" ||
		fmt.Sprint(got.Networks["red"]) != "[10.30.0.0/16]" || fmt.Sprint(got.Networks["green"]) != "[10.40.0.0/24]" {
		t.Fatalf("ParseVPCNetworks = %+v", got)
	}
	for _, tc := range []struct{ in, want string }{
		{"10.20.0.0/16", `"10.20.0.0/16" names no VPC`},
		{"blue=10.20.0.0/16,,fd20::/48", "an empty item"},
		{"Blue=10.20.0.0/16", `VPC name "Blue" is not a DNS-1123 label`},
		{"blue=10.20.0.1/16", `--vpc-networks blue: networks[0] "10.20.0.1/16" has host bits set`},
		{"blue=10.20.0.0/16,10.20.1.0/24", "--vpc-networks blue: networks[1] 10.20.1.0/24 overlaps"},
		{"blue=10.20.0.0/16,blue=10.30.0.0/16", "VPC blue is named twice"},
		{"blue=", `--vpc-networks blue: networks[0] "" is not a CIDR`},
	} {
		if _, err := ParseVPCNetworks([]string{tc.in}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseVPCNetworks(%q) error = %v, want it to say %q", tc.in, err, tc.want)
		}
	}
}

// inlineAdvert is an advertisement galactic-bgp publishes for an inline
// attachment.
func inlineAdvert(vpc, att, node string, vni int32, prefixes ...string) v1alpha1.BGPAdvertisement {
	a := v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: vpc + "." + att + "." + node, Labels: map[string]string{v1alpha1.LabelVPC: vpc, v1alpha1.LabelAttachment: att}},
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: vpc, Attachment: att, Node: node, VNI: vni},
	}
	for _, p := range prefixes {
		a.Spec.Prefixes = append(a.Spec.Prefixes, v1alpha1.Prefix(p))
	}
	return a
}

func networks(t *testing.T, v ...string) VPCNetworks {
	t.Helper()
	n, err := ParseVPCNetworks(v)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func adoptedVPC(name string, vni int32, dataplane string, nets ...v1alpha1.CIDR) v1alpha1.VPC {
	return v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{v1alpha1.LabelAdopted: "true"}},
		Spec: v1alpha1.VPCSpec{Networks: nets, VNI: &vni}, Status: v1alpha1.VPCStatus{DataplaneName: dataplane}}
}

func TestPlanAdoptionMakesOneVPCPerNamedInlineVPCWithItsAttachmentsAddressesAndVNI(t *testing.T) {
	in := adoptInputs{
		Namespace: "tenant-a",
		Networks:  networks(t, "blue=10.20.0.0/16,fd20::/48"),
		Adverts: []v1alpha1.BGPAdvertisement{
			inlineAdvert("blue", "web", "node-a", 10100, "10.20.0.5/32", "fd20::5/128"),
			inlineAdvert("blue", "web", "node-b", 10100, "10.20.0.5/32"), // a migration's target
			inlineAdvert("blue", "db", "node-b", 10100, "10.20.0.9/32"),
			inlineAdvert("red", "x", "node-a", 10200, "10.30.0.5/32"),
		},
	}
	// An object-backed advertisement is nobody's to adopt.
	owned := inlineAdvert("blue", "other", "node-a", 10100, "10.20.0.7/32")
	owned.Labels[v1alpha1.LabelAttachmentUID] = "u1"
	in.Adverts = append(in.Adverts, owned)
	plan, err := planAdoption(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.VPCs) != 1 {
		t.Fatalf("plan has %d VPCs, want blue only: %+v", len(plan.VPCs), plan)
	}
	v := plan.VPCs[0]
	if v.Name != "blue" || v.VNI != 10100 || fmt.Sprint(v.Networks) != "[10.20.0.0/16 fd20::/48]" || v.Existing != nil {
		t.Errorf("VPC %+v", v)
	}
	var got []string
	for _, a := range v.Attachments {
		got = append(got, fmt.Sprintf("%s %v %s", a.Name, a.Addresses, a.Announce))
	}
	if want := "[db [10.20.0.9] always web [10.20.0.5 fd20::5] always]"; fmt.Sprint(got) != want {
		t.Errorf("attachments %v, want %s", got, want)
	}
	if len(plan.Skipped) != 1 || !strings.Contains(plan.Skipped[0], "red (1 inline attachments): name it in --vpc-networks") {
		t.Errorf("skipped %v, want red", plan.Skipped)
	}
}

func TestPlanAdoptionOfAnEarlierRunCompletesItWithoutTheFlag(t *testing.T) {
	vpc := adoptedVPC("blue", 10100, "blue", "10.20.0.0/16")
	att := v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web", UID: "uid-web", Labels: map[string]string{v1alpha1.LabelAdopted: "true"}},
		Spec: v1alpha1.VPCAttachmentSpec{VPC: "blue", Addresses: []v1alpha1.IPAddress{"10.20.0.5"}}}
	labelled := inlineAdvert("blue", "web", "node-a", 10100, "10.20.0.5/32")
	labelled.Labels[v1alpha1.LabelAttachmentUID] = "uid-web"
	in := adoptInputs{Namespace: "tenant-a", VPCs: []v1alpha1.VPC{vpc}, Attachments: []v1alpha1.VPCAttachment{att},
		Adverts: []v1alpha1.BGPAdvertisement{labelled, inlineAdvert("blue", "db", "node-b", 10100, "10.20.0.9/32")},
		VNIs:    []v1alpha1.VNI{{ObjectMeta: metav1.ObjectMeta{Name: "10100"}, Spec: v1alpha1.VNISpec{Namespace: "tenant-a", VPC: "blue", VPCUID: vpc.UID}}}}
	plan, err := planAdoption(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.VPCs) != 1 || plan.VPCs[0].Existing == nil || len(plan.VPCs[0].Attachments) != 2 {
		t.Fatalf("plan %+v, want blue (existing) with db and web", plan)
	}
	if a := plan.VPCs[0].Attachments[1]; a.Name != "web" || a.Existing == nil || fmt.Sprint(a.Addresses) != "[10.20.0.5]" {
		t.Errorf("web %+v", a)
	}
}

func TestPlanAdoptionRefusesWhatItCannotKeepNamingWhatToChange(t *testing.T) {
	blue := func(prefixes ...string) v1alpha1.BGPAdvertisement {
		return inlineAdvert("blue", "web", "node-a", 10100, prefixes...)
	}
	for _, tc := range []struct {
		name string
		in   adoptInputs
		want string
	}{
		{"a VPC nobody advertises", adoptInputs{Networks: networks(t, "bleu=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")}},
			"--vpc-networks bleu: no node advertises an inline attachment of VPC bleu (inline VPCs: blue)"},
		{"an address outside the networks", adoptInputs{Networks: networks(t, "blue=10.30.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")}},
			"inline attachment blue/web: address 10.20.0.5 (advertisement blue.web.node-a) is outside VPC blue's networks 10.30.0.0/16: add its network to --vpc-networks blue"},
		{"the gateway", adoptInputs{Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.1/32")}},
			"address 10.20.0.1 (advertisement blue.web.node-a) is the gateway of 10.20.0.0/16"},
		{"no VNI", adoptInputs{Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{inlineAdvert("blue", "web", "node-a", 0, "10.20.0.5/32")}},
			"inline VPC blue: no advertisement of it carries a VNI"},
		{"two VNIs", adoptInputs{Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32"), inlineAdvert("blue", "db", "node-b", 10101, "10.20.0.6/32")}},
			"inline VPC blue: its advertisements carry different VNIs: 10100 (blue.web.node-a), 10101 (blue.db.node-b)"},
		{"one address twice", adoptInputs{Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32"), inlineAdvert("blue", "db", "node-b", 10100, "10.20.0.5/32")}},
			"inline attachments blue/db and blue/web both advertise 10.20.0.5"},
		{"not a host prefix", adoptInputs{Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.0/24")}},
			`advertisement blue.web.node-a: prefix "10.20.0.0/24" is not a host prefix`},
		{"the VNI held by another VPC", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")},
			VNIs: []v1alpha1.VNI{{ObjectMeta: metav1.ObjectMeta{Name: "10100"}, Spec: v1alpha1.VNISpec{Namespace: "tenant-b", VPC: "blue", VPCUID: "x"}}}},
			"inline VPC blue: its VNI 10100 is held by VPC tenant-b/blue (VNI object 10100)"},
		{"a VPC the tenant made", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")},
			VPCs: []v1alpha1.VPC{{ObjectMeta: metav1.ObjectMeta{Name: "blue"}}}},
			"VPC tenant-a/blue exists and was not made by adopt (no label network.galactic.dev/adopted=true)"},
		{"an attachment the tenant made", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "blue=10.20.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")},
			Attachments: []v1alpha1.VPCAttachment{{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: v1alpha1.VPCAttachmentSpec{VPC: "blue"}}}},
			"VPCAttachment tenant-a/web exists and was not made by adopt"},
		{"an adopted VPC with another name on nodes", adoptInputs{Namespace: "tenant-a", Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")},
			VPCs: []v1alpha1.VPC{adoptedVPC("blue", 10100, "blue-1234abcd", "10.20.0.0/16")}},
			"VPC tenant-a/blue exists with status.dataplaneName blue-1234abcd, not its inline name blue"},
		{"a network the adopted VPC lacks", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "blue=10.30.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32")},
			VPCs: []v1alpha1.VPC{adoptedVPC("blue", 10100, "blue", "10.20.0.0/16")}},
			"--vpc-networks blue: network 10.30.0.0/16 is not in VPC tenant-a/blue, which exists with 10.20.0.0/16"},
		{"no networks", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "red=10.30.0.0/16"), Adverts: []v1alpha1.BGPAdvertisement{inlineAdvert("red", "x", "n", 7, "10.30.0.5/32"), blue("10.20.0.5/32")},
			VPCs: []v1alpha1.VPC{adoptedVPC("blue", 10100, "blue", "10.20.0.0/16")}}, ""},
		{"one attachment name in two VPCs", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "blue=10.20.0.0/16,red=10.30.0.0/16"),
			Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32"), inlineAdvert("red", "web", "n", 10200, "10.30.0.5/32")}},
			"inline attachments blue/web and red/web have one name, and namespace tenant-a holds one VPCAttachment web"},
		{"two VPCs of one VNI", adoptInputs{Namespace: "tenant-a", Networks: networks(t, "blue=10.20.0.0/16,red=10.30.0.0/16"),
			Adverts: []v1alpha1.BGPAdvertisement{blue("10.20.0.5/32"), inlineAdvert("red", "x", "n", 10100, "10.30.0.5/32")}},
			"inline VPCs blue and red both use VNI 10100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := planAdoption(tc.in)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("planAdoption: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("planAdoption = %+v, %v; want an error saying %q", plan, err, tc.want)
			}
		})
	}
}

func TestAdoptAdvertPatchLabelsTheAdvertisementAndGivesEveryInlineEntryTheUID(t *testing.T) {
	att := &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web", UID: "uid-web"}}
	adv := inlineAdvert("blue", "web", "node-a", 10100, "10.20.0.5/32")
	adv.ResourceVersion = "42"
	adv.Spec.Containers = []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "net0", HolderGeneration: 3}, {ContainerID: "c2", IfName: "net0", Standby: true}}
	patch, done, err := adoptAdvertPatch("advertisement x", &adv, att)
	if err != nil || done {
		t.Fatalf("adoptAdvertPatch = %s, %v, %v", patch, done, err)
	}
	want := `{"metadata":{"labels":{"network.galactic.dev/attachment-uid":"uid-web","network.galactic.dev/namespace":"tenant-a"},"resourceVersion":"42"},` +
		`"spec":{"containers":[{"containerID":"c1","ifName":"net0","holderGeneration":3,"attachmentUID":"uid-web"},{"containerID":"c2","ifName":"net0","holderGeneration":0,"attachmentUID":"uid-web","standby":true}]}}`
	if string(patch) != want {
		t.Errorf("patch\n%s\nwant\n%s", patch, want)
	}
	if adv.Spec.Containers[0].AttachmentUID != "" {
		t.Error("the patch changed the advertisement it was made from")
	}

	adv.Labels[v1alpha1.LabelAttachmentUID] = "uid-web"
	for i := range adv.Spec.Containers {
		adv.Spec.Containers[i].AttachmentUID = "uid-web"
	}
	if patch, done, err := adoptAdvertPatch("advertisement x", &adv, att); err != nil || !done || patch != nil {
		t.Errorf("an adopted advertisement: %s, %v, %v; want done", patch, done, err)
	}
	adv.Spec.Containers[1].AttachmentUID = "uid-other"
	if _, _, err := adoptAdvertPatch("advertisement x", &adv, att); err == nil || !strings.Contains(err.Error(), "entry c2/net0 belongs to attachment UID uid-other") {
		t.Errorf("an entry of another UID: %v", err)
	}
	adv.Labels[v1alpha1.LabelAttachmentUID] = "uid-other"
	if _, _, err := adoptAdvertPatch("advertisement x", &adv, att); err == nil || !strings.Contains(err.Error(), "advertisement x is labelled with attachment UID uid-other") {
		t.Errorf("an advertisement of another UID: %v", err)
	}
}
