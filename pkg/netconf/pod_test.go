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
	data := `{"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"network.galactic.dev/vpc":"blue"},"portMappings":[]}}`
	if err := json.Unmarshal([]byte(data), &s); err != nil {
		t.Fatal(err)
	}
	if got := s.RuntimeConfig.PodAnnotations[AnnotationVPC]; got != "blue" {
		t.Fatalf("vpc annotation = %q", got)
	}
}

func TestResolveTakesTheAttachmentFromThePodWhereTheStanzaHasNone(t *testing.T) {
	a := Attachment{}
	if err := a.Resolve(pod(AnnotationVPC, "blue", AnnotationAttachment, " web-0-net0 "), true); err != nil {
		t.Fatal(err)
	}
	if a != (Attachment{VPC: "blue", Attachment: "web-0-net0"}) {
		t.Fatalf("resolved %+v", a)
	}
}

func TestResolveLetsTheStanzaWinOverThePod(t *testing.T) {
	a := Attachment{VPC: "red"}
	if err := a.Resolve(pod(AnnotationVPC, "blue", AnnotationAttachment, "web-0-net0"), true); err != nil {
		t.Fatal(err)
	}
	if a != (Attachment{VPC: "red", Attachment: "web-0-net0"}) {
		t.Fatalf("resolved %+v", a)
	}
}

func TestResolveErrorsNameTheFieldAndTheAnnotationToSet(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stanza   Attachment
		rc       RuntimeConfig
		required bool
		msg      string // empty: no error
	}{
		{"neither names a vpc", Attachment{Attachment: "a"}, pod(), true, "vpc is required: set \"vpc\" in the network config, or annotate the pod with network.galactic.dev/vpc"},
		{"neither names an attachment", Attachment{}, pod(AnnotationVPC, "blue"), true, "annotate the pod with network.galactic.dev/attachment"},
		{"no runtimeConfig at all", Attachment{}, RuntimeConfig{}, true, "vpc is required"},
		{"an invalid annotation names the annotation", Attachment{}, pod(AnnotationVPC, "Blue", AnnotationAttachment, "a"), true, `pod annotation network.galactic.dev/vpc: vpc "Blue" is not a DNS-1123 label`},
		{"an invalid stanza field does not blame the pod", Attachment{VPC: "Blue"}, pod(AnnotationAttachment, "a"), true, `vpc "Blue" is not a DNS-1123 label`},
		{"an empty annotation counts as unset", Attachment{}, pod(AnnotationVPC, " ", AnnotationAttachment, "a"), true, "vpc is required"},
		{"not required and nothing named", Attachment{}, pod(), false, ""},
		{"not required but half named is still checked", Attachment{}, pod(AnnotationVPC, "blue"), false, "attachment is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.stanza
			err := a.Resolve(tc.rc, tc.required)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("want no error, got %v", err)
				}
				return
			}
			if err == nil || err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, tc.msg) {
				t.Fatalf("want code 7 with %q, got %v", tc.msg, err)
			}
			if tc.name == "an invalid stanza field does not blame the pod" && strings.Contains(err.Msg, "annotation") {
				t.Fatalf("message blames the pod: %q", err.Msg)
			}
		})
	}
}

func TestModeAndAddressesComeFromThePodOnlyWhenTheStanzaLeavesThemOut(t *testing.T) {
	rc := pod(AnnotationMode, "veth", AnnotationAddresses, "10.20.0.5/24, fd20::5/64,")
	if m, key := rc.Mode(""); m != "veth" || key != AnnotationMode {
		t.Fatalf("mode %q from %q", m, key)
	}
	if m, key := rc.Mode("tap"); m != "tap" || key != "" {
		t.Fatalf("stanza mode: %q from %q", m, key)
	}
	if a, key := rc.Addresses(nil); !slices.Equal(a, []string{"10.20.0.5/24", "fd20::5/64"}) || key != AnnotationAddresses {
		t.Fatalf("addresses %q from %q", a, key)
	}
	// An explicit empty list in the stanza means "no addresses" and wins.
	if a, key := rc.Addresses([]string{}); a == nil || len(a) != 0 || key != "" {
		t.Fatalf("stanza's empty addresses: %q from %q", a, key)
	}
	if a, key := pod().Addresses(nil); a != nil || key != "" {
		t.Fatalf("no annotation: %q from %q", a, key)
	}
}

func TestVNIComesFromThePodAndMustBeANumber(t *testing.T) {
	v, key, err := pod(AnnotationVNI, "10100").VNI(nil)
	if err != nil || v == nil || *v != 10100 || key != AnnotationVNI {
		t.Fatalf("vni %v from %q, err %v", v, key, err)
	}
	stanza := int64(7)
	if v, key, err := pod(AnnotationVNI, "10100").VNI(&stanza); err != nil || v != &stanza || key != "" {
		t.Fatalf("stanza vni: %v from %q, err %v", v, key, err)
	}
	if v, _, err := pod().VNI(nil); v != nil || err != nil {
		t.Fatalf("no annotation: %v, %v", v, err)
	}
	_, _, err = pod(AnnotationVNI, "ten").VNI(nil)
	if err == nil || err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, "pod annotation network.galactic.dev/vni") {
		t.Fatalf("want code 7 naming the annotation, got %v", err)
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
