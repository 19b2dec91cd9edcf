package netconf

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func pod(kv ...string) RuntimeConfig {
	rc := RuntimeConfig{PodAnnotations: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		rc.PodAnnotations[kv[i]] = kv[i+1]
	}
	return rc
}

func TestRuntimeConfigDecodesTheCRIPodAnnotationsCapability(t *testing.T) {
	var s struct {
		RuntimeConfig RuntimeConfig `json:"runtimeConfig"`
	}
	data := `{"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"network.galactic.dev/attachment":"blue"},"portMappings":[]}}`
	if err := json.Unmarshal([]byte(data), &s); err != nil {
		t.Fatal(err)
	}
	if got := s.RuntimeConfig.PodAnnotations[AnnotationAttachment]; got != "blue" {
		t.Fatalf("vpc annotation = %q", got)
	}
}

const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=tenant-a;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1"

func TestResolveNamesVPCAttachmentsOfThePodsNamespaceInOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		rc   RuntimeConfig
		want []string
	}{
		{"one", pod(AnnotationAttachment, " web-0-net0 "), []string{"web-0-net0"}},
		{"{pod} is the pod's name", pod(AnnotationAttachment, "{pod}-net0"), []string{"web-0-net0"}},
		{"several", pod(AnnotationAttachments, "a, {pod}-b,c,"), []string{"a", "web-0-b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := Resolve(Attachment{}, tc.rc, ResolveOptions{Required: true, CNIArgs: podArgs})
			if err != nil {
				t.Fatal(err)
			}
			if n.Inline != nil || n.Namespace != "tenant-a" || !slices.Equal(n.Objects, tc.want) || !n.FromPod {
				t.Fatalf("resolved %+v, want tenant-a/%v", n, tc.want)
			}
		})
	}
}

func TestResolveTakesAVMMStanzasNamespaceAndAttachmentAndAnInlineStanzaAsItIs(t *testing.T) {
	n, err := Resolve(Attachment{Namespace: "tenant-a", Attachment: "vm-1"}, pod(AnnotationAttachment, "other"), ResolveOptions{Required: true})
	if err != nil || n.Inline != nil || n.Namespace != "tenant-a" || !slices.Equal(n.Objects, []string{"vm-1"}) || n.FromPod {
		t.Fatalf("VMM stanza: %+v, %v", n, err)
	}
	n, err = Resolve(Attachment{VPC: "blue", Attachment: "vm-1"}, RuntimeConfig{}, ResolveOptions{Required: true})
	if err != nil || n.Inline == nil || *n.Inline != (Attachment{VPC: "blue", Attachment: "vm-1"}) || len(n.Objects) != 0 {
		t.Fatalf("inline stanza: %+v, %v", n, err)
	}
	n, err = Resolve(Attachment{}, pod(), ResolveOptions{CNIArgs: podArgs})
	if err != nil || !n.Empty() {
		t.Fatalf("STATUS or GC of a shared conflist: %+v, %v", n, err)
	}
}

func TestResolveRefusesWhatAPodOrAStanzaMayNoLongerChooseNamingTheField(t *testing.T) {
	addresses := []InlineField{{Name: "addresses", Set: true, Replacement: "spec.addresses"}}
	for _, tc := range []struct {
		name    string
		stanza  Attachment
		rc      RuntimeConfig
		o       ResolveOptions
		msg     string
		without string // a phrase the message must not have
	}{
		{name: "pod vpc", rc: pod(AnnotationVPC, "blue", AnnotationAttachment, "a"), msg: "pod annotation network.galactic.dev/vpc is refused: the pod names a VPCAttachment (network.galactic.dev/attachment), whose spec.vpc decides this"},
		{name: "pod addresses", rc: pod(AnnotationAttachment, "a", AnnotationAddresses, "10.20.0.5/24"), msg: "pod annotation network.galactic.dev/addresses is refused", without: "spec.vpc"},
		{name: "pod addresses name spec.addresses", rc: pod(AnnotationAddresses, "10.20.0.5/24"), msg: "spec.addresses"},
		{name: "pod vni", rc: pod(AnnotationAttachment, "a", AnnotationVNI, "10100"), msg: "network.galactic.dev/vni is refused: the pod names a VPCAttachment (network.galactic.dev/attachment), whose status.vni"},
		{name: "pod allowed sources", rc: pod(AnnotationAttachment, "a", AnnotationAllowedSourcePrefixes, "0.0.0.0/0"), msg: "network.galactic.dev/allowed-source-prefixes is refused: the pod names a VPCAttachment (network.galactic.dev/attachment), whose spec.allowedSourcePrefixes"},
		{name: "refused even beside an inline stanza", stanza: Attachment{VPC: "blue", Attachment: "a"}, rc: pod(AnnotationVPC, "red"), msg: "network.galactic.dev/vpc is refused"},
		{name: "no attachment named", rc: pod("io.kubernetes.pod.name", "web-0"), msg: "no attachment is named: annotate the pod with network.galactic.dev/attachment"},
		{name: "no runtimeConfig at all", rc: RuntimeConfig{}, msg: "annotate the pod with network.galactic.dev/attachment"},
		{name: "both annotations", rc: pod(AnnotationAttachment, "a", AnnotationAttachments, "a,b"), msg: "network.galactic.dev/attachment and network.galactic.dev/attachments are both set"},
		{name: "an invalid name", rc: pod(AnnotationAttachment, "Web"), msg: `pod annotation network.galactic.dev/attachment: attachment "Web" is not a DNS-1123 label`},
		{name: "an invalid name after {pod}", rc: pod(AnnotationAttachments, "a,{pod}_x"), msg: "pod annotation network.galactic.dev/attachments: attachment \"web-0_x\""},
		{name: "a name twice", rc: pod(AnnotationAttachments, "a,b,a"), msg: "names a twice"},
		{name: "only commas", rc: pod(AnnotationAttachments, " , ,"), msg: "names no attachment"},
		{name: "too many", rc: pod(AnnotationAttachments, "a0,a1,a2,a3,a4,a5,a6,a7,a8,a9,b0,b1,b2,b3,b4,b5,b6"), msg: "names 17 attachments: at most 16"},
		{name: "no pod namespace", rc: pod(AnnotationAttachment, "a"), o: ResolveOptions{CNIArgs: "K8S_POD_NAME=web-0"}, msg: "CNI_ARGS has no K8S_POD_NAMESPACE"},
		{name: "{pod} without a pod name", rc: pod(AnnotationAttachment, "{pod}-net0"), o: ResolveOptions{CNIArgs: "K8S_POD_NAMESPACE=tenant-a"}, msg: "uses {pod}, but CNI_ARGS has no K8S_POD_NAME"},
		{name: "addresses in a shared conflist", rc: pod(AnnotationAttachment, "a"), o: ResolveOptions{Inline: addresses}, msg: "addresses is set beside the pod annotation network.galactic.dev/attachment: the VPCAttachment's spec.addresses decides it"},
		{name: "vpc beside namespace", stanza: Attachment{Namespace: "tenant-a", VPC: "blue", Attachment: "a"}, msg: "vpc is set beside namespace: the VPCAttachment's spec.vpc names its VPC"},
		{name: "addresses beside namespace", stanza: Attachment{Namespace: "tenant-a", Attachment: "a"}, o: ResolveOptions{Inline: addresses}, msg: "addresses is set beside namespace"},
		{name: "namespace without attachment", stanza: Attachment{Namespace: "tenant-a"}, msg: "attachment is required beside namespace"},
		{name: "an invalid namespace", stanza: Attachment{Namespace: "Tenant", Attachment: "a"}, msg: `namespace "Tenant" is not a DNS-1123 label`},
		{name: "attachment alone", stanza: Attachment{Attachment: "a"}, msg: `attachment "a" needs namespace (a VPCAttachment in that namespace) or vpc (an inline attachment)`},
		{name: "inline without attachment", stanza: Attachment{VPC: "blue"}, msg: "attachment is required"},
		{name: "inline vpc not a label", stanza: Attachment{VPC: "Blue", Attachment: "a"}, msg: `vpc "Blue" is not a DNS-1123 label`, without: "annotation"},
		{name: "addresses without vpc", stanza: Attachment{Attachment: "a"}, o: ResolveOptions{Inline: addresses}, msg: "vpc is required"},
		{name: "inline refused by requireAttachmentObjects", stanza: Attachment{VPC: "blue", Attachment: "a"}, o: ResolveOptions{RequireObjects: true}, msg: "inline attachment blue/a (vpc in the network config) is refused on this node, which sets requireAttachmentObjects"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Required = true
			if o.CNIArgs == "" {
				o.CNIArgs = podArgs
			}
			n, err := Resolve(tc.stanza, tc.rc, o)
			if err == nil || err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, tc.msg) {
				t.Fatalf("want code 7 with %q, got %v (resolved %+v)", tc.msg, err, n)
			}
			if tc.without != "" && strings.Contains(err.Msg, tc.without) {
				t.Fatalf("message %q has %q", err.Msg, tc.without)
			}
		})
	}
}

func TestModeComesFromThePodOnlyWhenTheStanzaLeavesItOut(t *testing.T) {
	rc := pod(AnnotationMode, "veth")
	if m, key := rc.Mode(""); m != "veth" || key != AnnotationMode {
		t.Fatalf("mode %q from %q", m, key)
	}
	if m, key := rc.Mode("tap"); m != "tap" || key != "" {
		t.Fatalf("stanza mode: %q from %q", m, key)
	}
}

func TestFromAnnotationPrefixesOnlyValuesFromThePod(t *testing.T) {
	e := InvalidConfig("mode \"x\" is not supported")
	if got := FromAnnotation("", e); got != e {
		t.Fatalf("stanza value rewritten: %v", got)
	}
	got := FromAnnotation(AnnotationMode, e)
	if got.Code != types.ErrInvalidNetworkConfig || got.Msg != "pod annotation network.galactic.dev/mode: mode \"x\" is not supported" {
		t.Fatalf("got %v", got)
	}
	if FromAnnotation(AnnotationMode, nil) != nil {
		t.Fatal("nil error became non-nil")
	}
}
