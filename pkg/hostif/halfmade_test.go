package hostif

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netnstest"
	"github.com/galactic-cni/galactic/pkg/routing"
)

func vethSpec(t *testing.T, container ns.NetNS) Spec {
	return Spec{
		Network: "blue-app", ContainerID: "c1", IfName: "eth0", Netns: container.Path(),
		VPC: "blue", Attachment: "app", Mode: names.ModeVeth, Routing: routing.KindTable,
		Addresses: []netip.Prefix{netip.MustParsePrefix("10.20.0.5/24")},
	}
}

func newContainer(t *testing.T) ns.NetNS {
	t.Helper()
	c, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); _ = testutils.UnmountNS(c) })
	return c
}

// An ADD killed between creating the veth pair and naming it leaves a pair
// without an alias; the runtime's DEL finds no record, and its retried ADD
// of the same container replaces the pair. A device of that name whose
// peer is not in the container stays someone else's.
func TestARetriedADDReplacesThePairAKilledADDLeftUnnamed(t *testing.T) {
	netnstest.Run(t, func() {
		container := newContainer(t)
		spec := vethSpec(t, container)
		half := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: spec.HostInterface()}, PeerName: spec.IfName, PeerNamespace: netlink.NsFd(int(container.Fd()))}
		if err := netlink.LinkAdd(half); err != nil {
			t.Fatal(err)
		}
		h := Host{StateDir: t.TempDir()}
		att, err := h.Setup(spec)
		if err != nil {
			t.Fatalf("the retried ADD: %v", err)
		}
		l, err := netlink.LinkByName(spec.HostInterface())
		if err != nil || l.Attrs().Alias != names.Alias("blue", "app") {
			t.Fatalf("the host end after the retry: %v %v", l, err)
		}
		if err := h.Teardown(att.Record); err != nil {
			t.Fatal(err)
		}

		// Not peered with the container: not ours.
		other := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: spec.HostInterface()}, PeerName: "elsewhere"}
		if err := netlink.LinkAdd(other); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Setup(vethSpec(t, newContainer(t))); err == nil || !strings.Contains(err.Error(), "is not the veth of attachment") {
			t.Fatalf("a device not peered with the container: %v", err)
		}
		if _, err := netlink.LinkByName(spec.HostInterface()); err != nil {
			t.Fatalf("someone else's device was removed: %v", err)
		}
	})
}

func TestADeletionThatFindsTheDeviceGoneIsNotAnError(t *testing.T) {
	for _, c := range []struct {
		err  error
		gone bool
	}{
		{netlink.LinkNotFoundError{}, true},
		{unix.ENODEV, true},
		{fmt.Errorf("deleting gv0: %w", unix.ENODEV), true},
		{unix.EPERM, false},
		{errors.New("something else"), false},
	} {
		if got := linkGone(c.err); got != c.gone {
			t.Errorf("linkGone(%v) = %v, want %v", c.err, got, c.gone)
		}
	}
}
