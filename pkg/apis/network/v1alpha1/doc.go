// Package v1alpha1 holds the network.galactic.dev/v1alpha1 API: VPCs and
// VPCAttachments (a tenant's networks and its workloads' identities in
// them), the VPCAddress and VNI records through which galactic-controller
// allocates, and the per-node BGPAdvertisement that tells routers which
// node serves an attachment.
//
// +kubebuilder:object:generate=true
// +groupName=network.galactic.dev
package v1alpha1
