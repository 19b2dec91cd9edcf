package guest

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/routing"
)

func TestTheKernelCreatesVRFDevices(t *testing.T) {
	n := newNode(t)
	n.do(t, func() error { return routing.ProbeVRF("gpprobe") })
	if l := n.link(t, "gpprobe"); l != nil {
		t.Fatalf("the probe should leave no device, found %v", l)
	}
	_ = netlink.FAMILY_V4
}
