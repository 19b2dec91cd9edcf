package netconf

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/names"
)

// CapabilityPodAnnotations is the runtimeConfig capability through which a
// CRI runtime (containerd, CRI-O) passes the pod's annotations to plugins
// that declare it in their stanza's "capabilities".
const CapabilityPodAnnotations = "io.kubernetes.cri.pod-annotations"

// The pod annotations that may supply a stanza's attachment fields.
const (
	AnnotationVPC        = "network.galactic.dev/vpc"
	AnnotationAttachment = "network.galactic.dev/attachment"
	// AnnotationAddresses is a comma-separated list of CIDRs.
	AnnotationAddresses = "network.galactic.dev/addresses"
	AnnotationMode      = "network.galactic.dev/mode"
	AnnotationVNI       = "network.galactic.dev/vni"
	// AnnotationStandby is "true" on a live-migration target's pod.
	AnnotationStandby = "network.galactic.dev/standby"
	// AnnotationAllowedSourcePrefixes is a comma-separated list of CIDRs.
	AnnotationAllowedSourcePrefixes = "network.galactic.dev/allowed-source-prefixes"
)

// RuntimeConfig is the part of a stanza's runtimeConfig galactic reads.
type RuntimeConfig struct {
	// PodAnnotations are the pod's annotations, present when the runtime
	// is a CRI runtime and the stanza declares the capability.
	PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
}

// annotation is the trimmed value of a pod annotation; "" when unset.
func (rc RuntimeConfig) annotation(key string) string {
	return strings.TrimSpace(rc.PodAnnotations[key])
}

// Resolve fills the VPC and attachment the stanza leaves empty from the pod
// annotations and validates both; a field in the stanza wins. Unless
// required, a config naming neither (STATUS and GC of a conflist shared by
// every pod) is accepted. Errors are code 7 and name the stanza field or
// annotation to fix.
func (a *Attachment) Resolve(rc RuntimeConfig, required bool) *types.Error {
	fromPod := map[string]bool{}
	fill := func(field *string, key string) {
		if *field == "" {
			if v := rc.annotation(key); v != "" {
				*field, fromPod[key] = v, true
			}
		}
	}
	fill(&a.VPC, AnnotationVPC)
	fill(&a.Attachment, AnnotationAttachment)
	if !required && a.VPC == "" && a.Attachment == "" {
		return nil
	}
	for _, f := range []struct{ name, value, key string }{
		{"vpc", a.VPC, AnnotationVPC},
		{"attachment", a.Attachment, AnnotationAttachment},
	} {
		if f.value == "" {
			return InvalidConfig(fmt.Sprintf(`%s is required: set %q in the network config, or annotate the pod with %s (a DNS-1123 label such as "blue")`, f.name, f.name, f.key))
		}
		if err := names.ValidateLabel(f.name, f.value); err != nil {
			if fromPod[f.key] {
				return InvalidConfig("pod annotation " + f.key + ": " + err.Error())
			}
			return InvalidConfig(err.Error())
		}
	}
	return nil
}

// Mode is the stanza's mode, else the pod's; key names the annotation when
// the value came from it.
func (rc RuntimeConfig) Mode(stanza string) (mode, key string) {
	if stanza != "" {
		return stanza, ""
	}
	if v := rc.annotation(AnnotationMode); v != "" {
		return v, AnnotationMode
	}
	return "", ""
}

// Addresses is the stanza's addresses (nil when it has no "addresses";
// an empty list stands), else the pod's comma-separated list; key names the
// annotation when the value came from it.
func (rc RuntimeConfig) Addresses(stanza []string) (addresses []string, key string) {
	return rc.list(stanza, AnnotationAddresses)
}

// AllowedSourcePrefixes is the stanza's allowedSourcePrefixes, else the
// pod's comma-separated list, as Addresses.
func (rc RuntimeConfig) AllowedSourcePrefixes(stanza []string) (prefixes []string, key string) {
	return rc.list(stanza, AnnotationAllowedSourcePrefixes)
}

func (rc RuntimeConfig) list(stanza []string, key string) ([]string, string) {
	if stanza != nil {
		return stanza, ""
	}
	v := rc.annotation(key)
	if v == "" {
		return nil, ""
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out, key
}

// VNI is the stanza's vni, else the pod's; key names the annotation when
// the value came from it. An annotation that is not a whole number is
// code 7; the range is the caller's to check.
func (rc RuntimeConfig) VNI(stanza *int64) (vni *int64, key string, err *types.Error) {
	if stanza != nil {
		return stanza, "", nil
	}
	v := rc.annotation(AnnotationVNI)
	if v == "" {
		return nil, "", nil
	}
	n, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil {
		return nil, AnnotationVNI, InvalidConfig(fmt.Sprintf("pod annotation %s: %q is not a whole number: use the VPC's VXLAN network identifier, such as \"10100\"", AnnotationVNI, v))
	}
	return &n, AnnotationVNI, nil
}

// FromAnnotation says where a value came from in an error about it: with a
// key, the message names the pod annotation.
func FromAnnotation(key string, err *types.Error) *types.Error {
	if err == nil || key == "" {
		return err
	}
	return types.NewError(err.Code, "pod annotation "+key+": "+err.Msg, err.Details)
}

// Standby is the stanza's standby, else the pod's annotation ("true" or
// "false"); key names the annotation when the value came from it. Any
// other annotation value is code 7.
func (rc RuntimeConfig) Standby(stanza *bool) (standby bool, key string, err *types.Error) {
	if stanza != nil {
		return *stanza, "", nil
	}
	v := rc.annotation(AnnotationStandby)
	if v == "" {
		return false, "", nil
	}
	b, perr := strconv.ParseBool(v)
	if perr != nil {
		return false, AnnotationStandby, InvalidConfig(fmt.Sprintf("pod annotation %s: %q is not a boolean: use \"true\" on a live-migration target, or leave it out", AnnotationStandby, v))
	}
	return b, AnnotationStandby, nil
}
