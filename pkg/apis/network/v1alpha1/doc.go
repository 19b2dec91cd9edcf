// Package v1alpha1 holds the network.galactic.dev/v1alpha1 API: the per-node
// BGPAdvertisement that tells routers which node serves an attachment.
//
// +kubebuilder:object:generate=true
// +groupName=network.galactic.dev
package v1alpha1
