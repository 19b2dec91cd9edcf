// Package netconf holds the configuration both galactic plugins share: the
// attachment a stanza (or the pod's annotations) names and how its
// validation errors are reported.
package netconf

import (
	"github.com/containernetworking/cni/pkg/types"
)

// Attachment names a VPC attachment: the stanza fields every galactic
// plugin has. With Namespace, Attachment names a VPCAttachment in it (a
// VMM's stanza); with VPC, the stanza is an inline attachment.
type Attachment struct {
	// Namespace is a VPCAttachment's namespace.
	Namespace string `json:"namespace,omitempty"`
	// VPC is an inline attachment's VPC, a DNS-1123 label.
	VPC string `json:"vpc"`
	// Attachment is the VPC attachment's name, a DNS-1123 label.
	Attachment string `json:"attachment"`
}

// InvalidConfig is a code 7 error with a message that says what to fix.
func InvalidConfig(msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, msg, "")
}
