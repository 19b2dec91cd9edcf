package names

import (
	"crypto/sha256"
	"net"
)

// TapMAC is the MAC of an attachment's host-side tap: a locally
// administered unicast address from sha256("mac:<vpc>/<attachment>"),
// the same on every node, so a guest that live-migrates keeps a valid
// neighbour entry for its gateway.
func TapMAC(vpc, attachment string) net.HardwareAddr {
	h := sha256.Sum256([]byte("mac:" + vpc + "/" + attachment))
	mac := net.HardwareAddr(h[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}
