// Package netconf holds the configuration both galactic plugins share: the
// attachment a stanza names and how its validation errors are reported.
package netconf

import (
	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/names"
)

// Attachment names a VPC attachment: the stanza fields every galactic
// plugin has.
type Attachment struct {
	// VPC is the VPC's name, a DNS-1123 label.
	VPC string `json:"vpc"`
	// Attachment is the VPC attachment's name, a DNS-1123 label.
	Attachment string `json:"attachment"`
}

// Validate returns a CNI "invalid network config" error (code 7) naming the
// first field that is missing or not a DNS-1123 label.
func (a Attachment) Validate() *types.Error {
	if err := names.ValidateLabel("vpc", a.VPC); err != nil {
		return InvalidConfig(err.Error())
	}
	if err := names.ValidateLabel("attachment", a.Attachment); err != nil {
		return InvalidConfig(err.Error())
	}
	return nil
}

// InvalidConfig is a code 7 error with a message that says what to fix.
func InvalidConfig(msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, msg, "")
}
