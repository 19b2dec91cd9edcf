package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Labels that tie a shared record (a handoff Lease, a BGPAdvertisement, a
// VPCAddress) to the VPCAttachment it belongs to. The UID, not the name, is
// the identity: a recreated attachment of the same name is another one.
const (
	LabelNamespace     = "network.galactic.dev/namespace"
	LabelAttachmentUID = "network.galactic.dev/attachment-uid"
	LabelVPCUID        = "network.galactic.dev/vpc-uid"
	// LabelAdopted ("true") marks a VPC or VPCAttachment that
	// `galactic-controller adopt` made of an inline attachment: the
	// controller leaves it alone until adopt has written its inline
	// data-plane names into its status.
	LabelAdopted = "network.galactic.dev/adopted"
)

// Finalizers galactic-controller keeps on the objects it protects.
const (
	// FinalizerAttachment keeps a VPCAttachment while it is in use (its
	// lease has a holder or an advertisement of it has an entry) and until
	// its reclaim policy is carried out.
	FinalizerAttachment = "network.galactic.dev/attachment-protection"
	// FinalizerVPC keeps a VPC while any attachment of it exists and until
	// its reservations are released.
	FinalizerVPC = "network.galactic.dev/vpc-protection"
	// FinalizerAddress keeps a bound VPCAddress until its attachment lets
	// go of it, so deleting a reservation never frees an address in use.
	FinalizerAddress = "network.galactic.dev/address-protection"
)

// Condition types and reasons of VPCs and VPCAttachments (Programmed and
// HolderAvailable are shared with BGPAdvertisement above).
const (
	// ConditionReady is True once the controller allocated what the object
	// asks for: a VPC's VNI, an attachment's addresses.
	ConditionReady = "Ready"

	ReasonAllocated       = "Allocated"
	ReasonInvalidNetworks = "InvalidNetworks"
	ReasonVPCNotFound     = "VPCNotFound"
	ReasonVPCNotReady     = "VPCNotReady"
	ReasonOutsideVPC      = "OutsideVPC"
	ReasonAddressInUse    = "AddressInUse"
	ReasonPoolExhausted   = "PoolExhausted"
	// ReasonPrefixNotOwned: an advertisement names prefixes its attachment
	// was not given; galactic-router does not announce it.
	ReasonPrefixNotOwned = "PrefixNotOwned"
	// ReasonNotAttached: no node holds or advertises the attachment.
	ReasonNotAttached = "NotAttached"
	// ReasonPending: the holder node's advertisement has no Programmed
	// condition yet.
	ReasonPending = "Pending"
	// ReasonNoHolder: the attachment's lease has no current holder.
	ReasonNoHolder = "NoHolder"
	// ReasonHolderTerminating: the attachment is being deleted.
	ReasonHolderTerminating = "HolderTerminating"
)

// ReclaimPolicy says what happens to an attachment's addresses once it is
// deleted and no longer in use.
// +kubebuilder:validation:Enum=Delete;Retain
type ReclaimPolicy string

const (
	// ReclaimDelete returns the addresses to the VPC.
	ReclaimDelete ReclaimPolicy = "Delete"
	// ReclaimRetain keeps them reserved (as VPCAddress objects) for the
	// next VPCAttachment of the same name and VPC.
	ReclaimRetain ReclaimPolicy = "Retain"
)

// IPFamily is IPv4 or IPv6.
// +kubebuilder:validation:Enum=IPv4;IPv6
type IPFamily string

const (
	IPv4 IPFamily = "IPv4"
	IPv6 IPFamily = "IPv6"
)

// CIDR is a network in canonical CIDR notation (its host bits zero).
// +kubebuilder:validation:MaxLength=43
// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be a network in canonical CIDR notation, such as 10.20.0.0/16 or fd20::/48 (host bits zero)"
type CIDR string

// IPAddress is one IPv4 or IPv6 address without a prefix length.
// +kubebuilder:validation:MaxLength=39
// +kubebuilder:validation:XValidation:rule="isIP(self) && ip.isCanonical(self)",message="must be an IP address in canonical form without a prefix length, such as 10.20.0.5 or fd20::5"
type IPAddress string

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=galactic
// +kubebuilder:printcolumn:name="Networks",type=string,JSONPath=`.spec.networks`
// +kubebuilder:printcolumn:name="VNI",type=integer,JSONPath=`.status.vni`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name must be a DNS-1123 label (at most 63 lower-case letters, digits and '-')"

// VPC is a tenant's virtual network: its address space and, once the
// controller allocated one, its VXLAN network identifier. The namespace is
// the tenant.
type VPC struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VPCSpec   `json:"spec"`
	Status VPCStatus `json:"status,omitempty"`
}

// VPCSpec is the VPC's address space.
// +kubebuilder:validation:XValidation:rule="oldSelf.networks.all(n, n in self.networks)",message="spec.networks may gain networks but never lose or change one: addresses of attachments are in them"
// +kubebuilder:validation:XValidation:rule="has(self.vni) == has(oldSelf.vni) && (!has(self.vni) || self.vni == oldSelf.vni)",message="spec.vni is immutable"
type VPCSpec struct {
	// Networks are the VPC's IPv4 and IPv6 networks, 1 to 8 CIDRs that do
	// not overlap; attachments get their addresses inside them.
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.all(b, a == b || (!cidr(a).containsCIDR(b) && !cidr(b).containsCIDR(a))))",message="spec.networks must not overlap each other"
	Networks []CIDR `json:"networks"`

	// VNI requests a VXLAN network identifier (1-16777215), for adopting a
	// VPC whose nodes already use one; granted when no other VPC holds it.
	// Absent: the controller allocates one.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777215
	// +optional
	VNI *int32 `json:"vni,omitempty"`
}

// VPCStatus is written by galactic-controller.
type VPCStatus struct {
	// VNI is the VPC's VXLAN network identifier, unique in the cluster for
	// the VPC's life and not reused while anything of it may remain.
	// +optional
	VNI int32 `json:"vni,omitempty"`

	// DataplaneName is the name nodes give the VPC's routing domain, VXLAN
	// device and advertisements (a DNS-1123 label): the VPC's name and a
	// hash of its UID, so two tenants' VPCs of one name never meet; an
	// adopted VPC keeps the name its nodes already use. Set once.
	// +optional
	DataplaneName string `json:"dataplaneName,omitempty"`

	// ObservedGeneration is the spec generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// VPCList is a list of VPCs.
type VPCList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VPC `json:"items"`
}

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vpcatt,categories=galactic
// +kubebuilder:printcolumn:name="VPC",type=string,JSONPath=`.spec.vpc`
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.status.addresses`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.node`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Programmed",type=string,JSONPath=`.status.conditions[?(@.type=="Programmed")].status`
// +kubebuilder:printcolumn:name="HolderAvailable",type=string,JSONPath=`.status.conditions[?(@.type=="HolderAvailable")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name must be a DNS-1123 label (at most 63 lower-case letters, digits and '-')"

// VPCAttachment is a workload's network identity in a VPC: the addresses
// the controller gives it, kept while the object lives, whichever pod or
// VMM holds it at the moment. Pods and VMMs name it; they choose nothing
// of it.
type VPCAttachment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VPCAttachmentSpec   `json:"spec"`
	Status VPCAttachmentStatus `json:"status,omitempty"`
}

// VPCAttachmentSpec is immutable but for announce and allowedSourcePrefixes:
// another address is another attachment.
// +kubebuilder:validation:XValidation:rule="self.vpc == oldSelf.vpc",message="spec.vpc is immutable: create another VPCAttachment"
// +kubebuilder:validation:XValidation:rule="(has(self.addresses) ? self.addresses : []) == (has(oldSelf.addresses) ? oldSelf.addresses : [])",message="spec.addresses is immutable: create another VPCAttachment for other addresses"
// +kubebuilder:validation:XValidation:rule="has(self.ipFamilies) == has(oldSelf.ipFamilies) && (!has(self.ipFamilies) || self.ipFamilies == oldSelf.ipFamilies)",message="spec.ipFamilies is immutable: create another VPCAttachment"
// +kubebuilder:validation:XValidation:rule="self.reclaimPolicy == oldSelf.reclaimPolicy",message="spec.reclaimPolicy is immutable"
type VPCAttachmentSpec struct {
	// VPC is the name of a VPC in the attachment's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	VPC string `json:"vpc"`

	// Addresses requests these addresses, each inside one of the VPC's
	// networks and free in it. Absent: one address per family of
	// ipFamilies.
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Addresses []IPAddress `json:"addresses,omitempty"`

	// No omitempty on ipFamilies: an empty list must survive a Go client's
	// round trip; nil is written as null, which the API server drops.

	// IPFamilies are the families to allocate one address each of when no
	// addresses are requested. Absent: every family of the VPC's networks;
	// empty: no address (the workload manages its own addressing).
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	// +optional
	IPFamilies []IPFamily `json:"ipFamilies"`

	// ReclaimPolicy is Delete (the default: the addresses return to the VPC
	// when the attachment is deleted and free) or Retain (they stay
	// reserved for the next VPCAttachment of this name and VPC).
	// +kubebuilder:default=Delete
	// +optional
	ReclaimPolicy ReclaimPolicy `json:"reclaimPolicy,omitempty"`

	// Announce is always (the default: routed while a holder's entry is
	// live) or whenAvailable (routed only while the holder reports itself
	// available).
	// +kubebuilder:validation:Enum=always;whenAvailable
	// +kubebuilder:default=always
	// +optional
	Announce Announce `json:"announce,omitempty"`

	// AllowedSourcePrefixes are sources the workload may send from beyond
	// its addresses (router or NAT appliances); empty: only its own.
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +optional
	AllowedSourcePrefixes []Prefix `json:"allowedSourcePrefixes,omitempty"`
}

// VPCAttachmentStatus is written by galactic-controller.
type VPCAttachmentStatus struct {
	// VNI is the VPC's VXLAN network identifier.
	// +optional
	VNI int32 `json:"vni,omitempty"`

	// Addresses are the allocated addresses with their network's prefix
	// length, as the workload's interface gets them; each is advertised as
	// a host route.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Addresses []Prefix `json:"addresses,omitempty"`

	// Dataplane are the names nodes give the attachment; set with the
	// allocation and never changed.
	// +optional
	Dataplane *Dataplane `json:"dataplane,omitempty"`

	// Holder is the current handoff holder; absent when none.
	// +optional
	Holder *Holder `json:"holder,omitempty"`

	// ObservedGeneration is the spec generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Programmed, HolderAvailable.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Dataplane names an attachment on nodes: the VPC's routing domain and the
// attachment's host interface, lease and advertisements derive from it,
// exactly as they derive from the names of an inline attachment.
type Dataplane struct {
	// VPC is the VPC's status.dataplaneName.
	VPC string `json:"vpc"`
	// Attachment is the attachment's name and a hash of its UID (an
	// adopted attachment keeps its inline name), a DNS-1123 label.
	Attachment string `json:"attachment"`
}

// Holder is the node and fencing token of an attachment's handoff holder.
type Holder struct {
	// Node is the holder's node.
	Node string `json:"node"`
	// Generation is the lease's transition count when it was acquired.
	Generation int64 `json:"generation"`
}

// +kubebuilder:object:root=true

// VPCAttachmentList is a list of VPCAttachments.
type VPCAttachmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VPCAttachment `json:"items"`
}

// AddressState says whether a VPCAddress is held by an attachment.
// +kubebuilder:validation:Enum=Bound;Retained
type AddressState string

const (
	AddressBound    AddressState = "Bound"
	AddressRetained AddressState = "Retained"
)

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=vpcaddr,categories=galactic
// +kubebuilder:printcolumn:name="VPC",type=string,JSONPath=`.spec.vpc`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Attachment",type=string,JSONPath=`.spec.attachment`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.spec.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// VPCAddress is one address of a VPC given to an attachment, named
// "<vpc>.<address>" (an IPv6 address with "-" for ":") so the API server
// itself refuses a second claim of one address in one VPC. Written only by
// galactic-controller; a Retained one is a reservation, and deleting it
// releases the address.
type VPCAddress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VPCAddressSpec `json:"spec"`
}

// VPCAddressSpec records who holds the address.
type VPCAddressSpec struct {
	// VPC and VPCUID name the VPC the address belongs to.
	VPC    string    `json:"vpc"`
	VPCUID types.UID `json:"vpcUID"`
	// Address is the IP address.
	Address IPAddress `json:"address"`
	// Attachment is the name of the attachment the address is for; it
	// stays while the address is Retained.
	Attachment string `json:"attachment"`
	// AttachmentUID is the attachment holding the address; empty while
	// it is Retained.
	// +optional
	AttachmentUID types.UID `json:"attachmentUID,omitempty"`
	// State is Bound (an attachment holds it) or Retained.
	State AddressState `json:"state"`
}

// +kubebuilder:object:root=true

// VPCAddressList is a list of VPCAddresses.
type VPCAddressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VPCAddress `json:"items"`
}

// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=galactic
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.namespace`
// +kubebuilder:printcolumn:name="VPC",type=string,JSONPath=`.spec.vpc`
// +kubebuilder:printcolumn:name="Released",type=date,JSONPath=`.spec.releasedAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// VNI records that one VXLAN network identifier belongs to one VPC,
// named by the number so the API server itself refuses a second claim.
// Written only by galactic-controller; it outlives its VPC for a hold
// time, so nothing of the VPC left on a node meets its successor.
type VNI struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VNISpec `json:"spec"`
}

// VNISpec names the VPC holding the VNI.
type VNISpec struct {
	// Namespace, VPC and VPCUID name the VPC.
	Namespace string    `json:"namespace"`
	VPC       string    `json:"vpc"`
	VPCUID    types.UID `json:"vpcUID"`
	// ReleasedAt is when the VPC went; the VNI may be given again once the
	// controller's hold time has passed since and no advertisement uses it.
	// +optional
	ReleasedAt *metav1.Time `json:"releasedAt,omitempty"`
}

// +kubebuilder:object:root=true

// VNIList is a list of VNIs.
type VNIList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VNI `json:"items"`
}
