package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Label keys every BGPAdvertisement carries, so a node or an attachment
// selects its advertisements without reading anyone else's.
const (
	LabelVPC        = "network.galactic.dev/vpc"
	LabelAttachment = "network.galactic.dev/attachment"
	LabelNode       = "network.galactic.dev/node"
)

// Prefix is an IPv4 or IPv6 prefix in CIDR notation.
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.20.0.5/32 or fd20::5/128"
type Prefix string

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bgpadv,categories=galactic
// +kubebuilder:printcolumn:name="VPC",type=string,JSONPath=`.spec.vpc`
// +kubebuilder:printcolumn:name="Attachment",type=string,JSONPath=`.spec.attachment`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Prefixes",type=string,JSONPath=`.spec.prefixes`
// +kubebuilder:printcolumn:name="Programmed",type=string,JSONPath=`.status.conditions[?(@.type=="Programmed")].status`
// +kubebuilder:printcolumn:name="HolderAvailable",type=string,JSONPath=`.status.conditions[?(@.type=="HolderAvailable")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// BGPAdvertisement is one node's claim to serve an attachment: routers send
// the listed prefixes to that node while any of its containers is live.
type BGPAdvertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BGPAdvertisementSpec   `json:"spec"`
	Status BGPAdvertisementStatus `json:"status,omitempty"`
}

// BGPAdvertisementSpec names the attachment and node and records every
// container on that node that published it.
type BGPAdvertisementSpec struct {
	// VPC is the VPC the attachment belongs to (a DNS-1123 label).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	VPC string `json:"vpc"`

	// Attachment is the VPC attachment's name (a DNS-1123 label).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Attachment string `json:"attachment"`

	// Node is the name of the node that serves the prefixes.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// VNI is the VPC's VXLAN network identifier, from the galactic-bgp
	// stanza; 0 (absent) means the advertisement is not routed.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16777215
	// +optional
	VNI int32 `json:"vni,omitempty"`

	// Announce says when galactic-router routes the prefixes: always
	// (while an entry is live; the default) or whenAvailable (only while
	// the current holder reports itself available).
	// +kubebuilder:validation:Enum=always;whenAvailable
	// +optional
	Announce Announce `json:"announce,omitempty"`

	// Prefixes is the sorted, deduplicated union of the entries' prefixes.
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Prefixes []Prefix `json:"prefixes,omitempty"`

	// Containers has one entry per container that ADDed on this node.
	// +listType=map
	// +listMapKey=containerID
	// +listMapKey=ifName
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Containers []ContainerEntry `json:"containers,omitempty"`
}

// ContainerEntry is what one container's ADD published.
type ContainerEntry struct {
	// ContainerID is the CNI container ID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ContainerID string `json:"containerID"`

	// IfName is the interface name inside the container (CNI_IFNAME).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	IfName string `json:"ifName"`

	// Netns is the container's network namespace path; the entry is live
	// while it exists.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Netns string `json:"netns,omitempty"`

	// Prefixes are the host prefixes of the container's addresses.
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Prefixes []Prefix `json:"prefixes,omitempty"`

	// HolderGeneration is the handoff lease's transition count when this
	// entry's holder acquired it; 0 without handoff.
	// +kubebuilder:validation:Minimum=0
	// +optional
	HolderGeneration int64 `json:"holderGeneration"`

	// AttachmentUID is the VPCAttachment's UID when the entry's attachment
	// is an object; empty for an inline attachment.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	AttachmentUID string `json:"attachmentUID,omitempty"`

	// Standby marks the entry of a live-migration target that has not
	// been promoted: it holds no lease and galactic-router announces
	// nothing of it. Promotion clears it and sets holderGeneration.
	// +optional
	Standby bool `json:"standby,omitempty"`
}

// Announce is the spec.announce policy.
type Announce string

const (
	AnnounceAlways        Announce = "always"
	AnnounceWhenAvailable Announce = "whenAvailable"
)

// Condition types and reasons galactic-router writes.
const (
	// ConditionProgrammed is True while the prefixes are announced and at
	// least one peer is established.
	ConditionProgrammed = "Programmed"
	// ConditionHolderAvailable says whether the current holder reports
	// itself available, derived afresh from the handoff lease.
	ConditionHolderAvailable = "HolderAvailable"

	ReasonAnnounced         = "Announced"
	ReasonNoEstablishedPeer = "NoEstablishedPeer"
	ReasonNoVNI             = "NoVNI"
	ReasonVNIConflict       = "VNIConflict"
	ReasonHolderUnavailable = "HolderUnavailable"
	ReasonNoLiveEntry       = "NoLiveEntry"
)

// BGPAdvertisementStatus is written by whatever consumes the advertisement.
type BGPAdvertisementStatus struct {
	// Conditions such as HolderAvailable and Programmed.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// BGPAdvertisementList is a list of BGPAdvertisements.
type BGPAdvertisementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPAdvertisement `json:"items"`
}
