// Package names derives every name galactic components agree on: host
// interfaces and their aliases, BGPAdvertisement names and labels, and
// handoff leases. Each is a pure function of the attachment (and node), so
// every node and every restart computes the same one.
package names

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// Host interface modes.
const (
	ModeTap  = "tap"
	ModeVeth = "veth"
)

const (
	aliasPrefix = "galactic:"
	// hashDigits keeps prefix+hash within IFNAMSIZ-1 (15) characters.
	hashDigits = 13
	// maxObjectName is the longest name a Kubernetes object can have.
	maxObjectName = validation.DNS1123SubdomainMaxLength
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// ValidateLabel reports why value is not a DNS-1123 label, naming the field.
func ValidateLabel(field, value string) error {
	if value == "" {
		return fmt.Errorf("%s is required: a DNS-1123 label such as \"blue\"", field)
	}
	if errs := validation.IsDNS1123Label(value); len(errs) > 0 {
		return fmt.Errorf("%s %q is not a DNS-1123 label: %s", field, value, strings.Join(errs, "; "))
	}
	return nil
}

// HostInterface is the host-side interface name of an attachment: "gt" (tap)
// or "gv" (veth) and the first 13 hex digits of sha256("<vpc>/<attachment>").
func HostInterface(mode, vpc, attachment string) string {
	return modePrefix(mode) + sum(vpc + "/" + attachment)[:hashDigits]
}

func modePrefix(mode string) string {
	if mode == ModeVeth {
		return "gv"
	}
	return "gt"
}

// IsHostInterface reports whether name has the shape of a galactic host
// interface of the given mode.
func IsHostInterface(mode, name string) bool {
	digits, found := strings.CutPrefix(name, modePrefix(mode))
	if !found || len(digits) != hashDigits {
		return false
	}
	return strings.Trim(digits, "0123456789abcdef") == ""
}

// Alias is the ifalias of an inline attachment's host interface; the GC
// maps a device back to its attachment through it.
func Alias(vpc, attachment string) string {
	return aliasPrefix + vpc + "/" + attachment
}

// AliasOf is the ifalias of an attachment's host interface: Alias for an
// inline attachment (uid empty), "galactic:<vpc>/<attachment>/<uid>" for
// an object-backed one, vpc and attachment being its data-plane names.
func AliasOf(vpc, attachment, uid string) string {
	if uid == "" {
		return Alias(vpc, attachment)
	}
	return Alias(vpc, attachment) + "/" + uid
}

// ParseAlias returns the VPC and attachment of a galactic ifalias, either form.
func ParseAlias(alias string) (vpc, attachment string, ok bool) {
	vpc, attachment, _, ok = ParseAliasUID(alias)
	return vpc, attachment, ok
}

// ParseAliasUID returns the VPC, attachment and UID of a galactic ifalias;
// uid is empty for an inline attachment's.
func ParseAliasUID(alias string) (vpc, attachment, uid string, ok bool) {
	rest, found := strings.CutPrefix(alias, aliasPrefix)
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") {
		return "", "", "", false
	}
	if len(parts) == 3 {
		uid = parts[2]
	}
	return parts[0], parts[1], uid, true
}

// IdentityLabels are the labels that tie a lease or an advertisement to
// the VPCAttachment it belongs to; none for an inline attachment (uid
// empty).
func IdentityLabels(namespace, uid string) map[string]string {
	if uid == "" {
		return nil
	}
	return map[string]string{v1alpha1.LabelNamespace: namespace, v1alpha1.LabelAttachmentUID: uid}
}

// SecondaryIfName is the container interface of a pod's attachment at
// position i (from 1) of its network.galactic.dev/attachments list; the
// first (0) gets CNI_IFNAME.
func SecondaryIfName(i int) string {
	return "net" + strconv.Itoa(i)
}

// Advertisement is the BGPAdvertisement name "<vpc>.<attachment>.<node>".
// A name that would pass 253 characters uses a hash of the node instead.
func Advertisement(vpc, attachment, node string) string {
	name := vpc + "." + attachment + "." + node
	if len(name) <= maxObjectName {
		return name
	}
	return vpc + "." + attachment + "." + sum(node)[:32]
}

// NodeLabelValue is node when it fits a label value, and otherwise a hash of it.
func NodeLabelValue(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	return sum(node)[:validation.LabelValueMaxLength]
}

// AdvertisementLabels are the labels of an attachment's advertisement on node.
func AdvertisementLabels(vpc, attachment, node string) map[string]string {
	return map[string]string{
		v1alpha1.LabelVPC:        vpc,
		v1alpha1.LabelAttachment: attachment,
		v1alpha1.LabelNode:       NodeLabelValue(node),
	}
}

// AttachmentSelector selects every node's advertisement of one attachment.
func AttachmentSelector(vpc, attachment string) string {
	return v1alpha1.LabelVPC + "=" + vpc + "," + v1alpha1.LabelAttachment + "=" + attachment
}

// NodeSelector selects every advertisement of one node.
func NodeSelector(node string) string {
	return v1alpha1.LabelNode + "=" + NodeLabelValue(node)
}

// LabelHolderNode labels a held handoff Lease with its holder's node
// (NodeLabelValue), so a node's components can watch only the leases held
// on that node; a free lease carries no such label.
const LabelHolderNode = "network.galactic.dev/holder-node"

// HolderNodeSelector selects the handoff leases held on node.
func HolderNodeSelector(node string) string {
	return LabelHolderNode + "=" + NodeLabelValue(node)
}

// Lease is the handoff Lease name "<vpc>.<attachment>".
func Lease(vpc, attachment string) string {
	return vpc + "." + attachment
}

// Holder is the handoff holder identity "<node>/<containerID>".
func Holder(node, containerID string) string {
	return node + "/" + containerID
}

// ParseHolder splits a holder identity into node and container ID.
func ParseHolder(holder string) (node, containerID string, ok bool) {
	i := strings.LastIndex(holder, "/")
	if i <= 0 || i == len(holder)-1 {
		return "", "", false
	}
	return holder[:i], holder[i+1:], true
}

// dataplaneNameLength is how much of an object's name its data-plane name
// keeps: with "-" and 8 hash digits it stays a DNS-1123 label.
const dataplaneNameLength = validation.DNS1123LabelMaxLength - 9

// DataplaneName is the data-plane name galactic-controller gives a VPC or
// VPCAttachment: its name (cut to 54 characters, without a trailing "-")
// and the first 8 hex digits of sha256 of its UID. Nodes name routing
// domains, host interfaces, leases and advertisements from it, so two
// tenants' objects of one name never meet, and a recreated object (a new
// UID) inherits nothing of its predecessor.
func DataplaneName(name, uid string) string {
	if len(name) > dataplaneNameLength {
		name = strings.TrimRight(name[:dataplaneNameLength], "-")
	}
	return name + "-" + sum(uid)[:8]
}

// VPCAddressName is the name of the VPCAddress that records addr in vpc:
// "<vpc>.<address>", an IPv6 address written as its eight groups in hex
// without leading zeros joined by "-", so every address has exactly one
// name and the API server refuses a second claim of it.
func VPCAddressName(vpc string, addr netip.Addr) string {
	addr = addr.Unmap()
	if addr.Is4() {
		return vpc + "." + addr.String()
	}
	b := addr.As16()
	groups := make([]string, 8)
	for i := range groups {
		groups[i] = strconv.FormatUint(uint64(b[2*i])<<8|uint64(b[2*i+1]), 16)
	}
	return vpc + "." + strings.Join(groups, "-")
}

// VNIName is the name of the VNI object that records vni.
func VNIName(vni int32) string {
	return strconv.FormatInt(int64(vni), 10)
}
