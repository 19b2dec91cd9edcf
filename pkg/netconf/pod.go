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

// The pod annotations galactic reads.
const (
	// AnnotationAttachment names the pod's VPCAttachment in its namespace;
	// "{pod}" in it stands for the pod's name.
	AnnotationAttachment = "network.galactic.dev/attachment"
	// AnnotationAttachments names several, comma-separated, in order: the
	// first gets CNI_IFNAME, the next net1, net2, ...
	AnnotationAttachments = "network.galactic.dev/attachments"
	AnnotationMode        = "network.galactic.dev/mode"
	// AnnotationStandby is "true" on a live-migration target's pod.
	AnnotationStandby = "network.galactic.dev/standby"
)

// Pod annotations that once chose an attachment's network and are now
// refused: the VPCAttachment decides them, never the pod.
const (
	AnnotationVPC                   = "network.galactic.dev/vpc"
	AnnotationAddresses             = "network.galactic.dev/addresses"
	AnnotationVNI                   = "network.galactic.dev/vni"
	AnnotationAllowedSourcePrefixes = "network.galactic.dev/allowed-source-prefixes"
)

// refusedAnnotations are the annotations a pod may no longer set, each with
// the VPCAttachment field that replaces it.
var refusedAnnotations = []struct{ key, field string }{
	{AnnotationVPC, "spec.vpc"},
	{AnnotationAddresses, "spec.addresses (the allocated ones are status.addresses)"},
	{AnnotationVNI, "status.vni (its VPC's, allocated by galactic-controller)"},
	{AnnotationAllowedSourcePrefixes, "spec.allowedSourcePrefixes"},
}

// InlineField is a stanza field only an inline attachment has, with the
// VPCAttachment field that replaces it.
type InlineField struct {
	// Name is the stanza key; Set says the stanza has it.
	Name string
	Set  bool
	// Replacement is the VPCAttachment's field.
	Replacement string
}

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

// Names is what a network config names: one inline attachment, or
// VPCAttachments of one namespace (nothing, for STATUS and GC of a
// conflist shared by every pod).
type Names struct {
	// Inline is the stanza's inline attachment; nil for objects.
	Inline *Attachment
	// Namespace and Objects name VPCAttachments, in order.
	Namespace string
	Objects   []string
	// FromPod says the pod's annotations named the objects.
	FromPod bool
}

// Empty says nothing is named.
func (n Names) Empty() bool { return n.Inline == nil && len(n.Objects) == 0 }

// ResolveOptions say what a verb needs of a config.
type ResolveOptions struct {
	// Required: a config naming no attachment is an error (ADD, CHECK);
	// STATUS, GC and DEL accept one.
	Required bool
	// RequireObjects refuses inline attachments (the node setting
	// requireAttachmentObjects).
	RequireObjects bool
	// Inline are the plugin's stanza fields only an inline attachment may set.
	Inline []InlineField
	// CNIArgs is CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME for pods.
	CNIArgs string
}

// MaxAttachments bounds one pod's attachments.
const MaxAttachments = 16

// Resolve says what a stanza (a), or else the pod's annotations, name.
// Every error is code 7 and names the stanza field or pod annotation to
// fix; refused pod annotations (vpc, addresses, vni,
// allowed-source-prefixes) and inline fields beside a VPCAttachment name
// the VPCAttachment field that replaces them.
func Resolve(a Attachment, rc RuntimeConfig, o ResolveOptions) (Names, *types.Error) {
	for _, r := range refusedAnnotations {
		if rc.annotation(r.key) != "" {
			return Names{}, InvalidConfig(fmt.Sprintf("pod annotation %s is refused: the pod names a VPCAttachment (%s), whose %s decides this; remove the annotation", r.key, AnnotationAttachment, r.field))
		}
	}
	var inline *InlineField
	for i := range o.Inline {
		if o.Inline[i].Set {
			inline = &o.Inline[i]
			break
		}
	}
	objectsOnly := func(what string) *types.Error {
		if a.VPC != "" {
			return InvalidConfig(fmt.Sprintf("vpc is set beside %s: the VPCAttachment's spec.vpc names its VPC; leave vpc out", what))
		}
		if inline != nil {
			return InvalidConfig(fmt.Sprintf("%s is set beside %s: the VPCAttachment's %s decides it; leave %s out", inline.Name, what, inline.Replacement, inline.Name))
		}
		return nil
	}
	switch {
	case a.Namespace != "":
		if err := objectsOnly("namespace"); err != nil {
			return Names{}, err
		}
		if err := names.ValidateLabel("namespace", a.Namespace); err != nil {
			return Names{}, InvalidConfig(err.Error())
		}
		if a.Attachment == "" {
			return Names{}, InvalidConfig(`attachment is required beside namespace: the name of a VPCAttachment in that namespace, such as "web-0-net0"`)
		}
		if err := names.ValidateLabel("attachment", a.Attachment); err != nil {
			return Names{}, InvalidConfig(err.Error())
		}
		return Names{Namespace: a.Namespace, Objects: []string{a.Attachment}}, nil
	case a.VPC != "" || (inline != nil && a.Attachment != ""):
		for _, f := range []struct{ name, value string }{{"vpc", a.VPC}, {"attachment", a.Attachment}} {
			if err := names.ValidateLabel(f.name, f.value); err != nil {
				return Names{}, InvalidConfig(err.Error())
			}
		}
		if o.RequireObjects {
			return Names{}, InvalidConfig(fmt.Sprintf("inline attachment %s/%s (vpc in the network config) is refused on this node, which sets requireAttachmentObjects: name a VPCAttachment with namespace and attachment in the network config, or with the pod annotation %s", a.VPC, a.Attachment, AnnotationAttachment))
		}
		in := a
		return Names{Inline: &in}, nil
	case a.Attachment != "":
		return Names{}, InvalidConfig(fmt.Sprintf("attachment %q needs namespace (a VPCAttachment in that namespace) or vpc (an inline attachment) beside it in the network config", a.Attachment))
	}
	return podNames(rc, o, objectsOnly)
}

// podNames are the VPCAttachments a pod's annotations name in its namespace.
func podNames(rc RuntimeConfig, o ResolveOptions, objectsOnly func(string) *types.Error) (Names, *types.Error) {
	one, many := rc.annotation(AnnotationAttachment), rc.annotation(AnnotationAttachments)
	key, value := AnnotationAttachment, one
	switch {
	case one != "" && many != "":
		return Names{}, InvalidConfig(fmt.Sprintf("pod annotations %s and %s are both set: use %s for one attachment, %s for several", AnnotationAttachment, AnnotationAttachments, AnnotationAttachment, AnnotationAttachments))
	case many != "":
		key, value = AnnotationAttachments, many
	case one != "":
	case !o.Required:
		return Names{}, nil
	default:
		return Names{}, InvalidConfig(fmt.Sprintf(`no attachment is named: annotate the pod with %s, the name of a VPCAttachment in its namespace (such as "web-0-net0"), or set namespace and attachment in the network config`, AnnotationAttachment))
	}
	if err := objectsOnly("the pod annotation " + key); err != nil {
		return Names{}, err
	}
	args := cniArgs(o.CNIArgs)
	ns := args["K8S_POD_NAMESPACE"]
	if ns == "" {
		return Names{}, InvalidConfig(fmt.Sprintf("pod annotation %s names VPCAttachments of the pod's namespace, but CNI_ARGS has no K8S_POD_NAMESPACE: pod annotations name attachments only under a CRI runtime", key))
	}
	n := Names{Namespace: ns, FromPod: true}
	seen := map[string]bool{}
	for _, name := range strings.Split(value, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if strings.Contains(name, "{pod}") {
			pod := args["K8S_POD_NAME"]
			if pod == "" {
				return Names{}, InvalidConfig(fmt.Sprintf("pod annotation %s: %q uses {pod}, but CNI_ARGS has no K8S_POD_NAME", key, name))
			}
			name = strings.ReplaceAll(name, "{pod}", pod)
		}
		if err := names.ValidateLabel("attachment", name); err != nil {
			return Names{}, InvalidConfig("pod annotation " + key + ": " + err.Error())
		}
		if seen[name] {
			return Names{}, InvalidConfig(fmt.Sprintf("pod annotation %s names %s twice: list each attachment once", key, name))
		}
		seen[name] = true
		n.Objects = append(n.Objects, name)
	}
	switch {
	case len(n.Objects) == 0:
		return Names{}, InvalidConfig(fmt.Sprintf(`pod annotation %s names no attachment: list VPCAttachment names, such as "web-0-net0,web-0-net1"`, key))
	case len(n.Objects) > MaxAttachments:
		return Names{}, InvalidConfig(fmt.Sprintf("pod annotation %s names %d attachments: at most %d", key, len(n.Objects), MaxAttachments))
	}
	return n, nil
}

// cniArgs parses CNI_ARGS ("K=V;K=V").
func cniArgs(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
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
