package hostif

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netnstest"
	"github.com/galactic-cni/galactic/pkg/routing"
)

func objectTapSpec(uid string) Spec {
	return Spec{
		Network: "vm", ContainerID: "c-" + uid, IfName: "net0", Netns: "/var/run/netns/none",
		VPC: "blue-1a2b3c4d", Attachment: "vm-0-5e6f7a8b", Mode: names.ModeTap, Routing: routing.KindTable,
		Addresses: []netip.Prefix{netip.MustParsePrefix("10.20.0.5/24")},
		Namespace: "tenant-a", AttachmentName: "vm-0", AttachmentUID: uid,
	}
}

func tapIndex(t *testing.T, name string) (int, string) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index, l.Attrs().Alias
}

// A tap of the same data-plane names but another UID is a predecessor's:
// an ADD never reattaches it, but removes it (nobody holds it) and makes
// its own. One with the inline alias of the same names is an adopted
// attachment's, reattached and given the UID.
func TestATapOfAnotherUIDIsReplacedAndAnInlineOneAdopted(t *testing.T) {
	netnstest.Run(t, func() {
		h := Host{StateDir: t.TempDir()}
		old := objectTapSpec("uid-1")
		att, err := h.Setup(old)
		if err != nil {
			t.Fatal(err)
		}
		name := old.HostInterface()
		oldIndex, _ := tapIndex(t, name)
		// The predecessor's record goes (its DEL ran) but its tap stays, as
		// when a DEL could not delete it.
		if err := h.Store().Delete(att.Record.ContainerID, att.Record.IfName); err != nil {
			t.Fatal(err)
		}

		next := objectTapSpec("uid-2")
		att2, err := h.Setup(next)
		if err != nil {
			t.Fatalf("ADD of the successor: %v", err)
		}
		if att2.AdoptedTap {
			t.Fatal("the predecessor's tap was reattached")
		}
		index, alias := tapIndex(t, name)
		if index == oldIndex || alias != names.AliasOf(next.VPC, next.Attachment, "uid-2") {
			t.Fatalf("the tap after the successor's ADD: ifindex %d (was %d), alias %q", index, oldIndex, alias)
		}
		if err := h.Teardown(att2.Record); err != nil {
			t.Fatal(err)
		}

		// An inline attachment's tap of the same names (before adoption).
		inline := objectTapSpec("")
		inline.Namespace, inline.AttachmentName = "", ""
		att3, err := h.Setup(inline)
		if err != nil {
			t.Fatal(err)
		}
		inlineIndex, _ := tapIndex(t, name)
		if err := h.Store().Delete(att3.Record.ContainerID, att3.Record.IfName); err != nil {
			t.Fatal(err)
		}
		adopted := objectTapSpec("uid-3")
		att4, err := h.Setup(adopted)
		if err != nil {
			t.Fatal(err)
		}
		index, alias = tapIndex(t, name)
		if !att4.AdoptedTap || index != inlineIndex || alias != names.AliasOf(adopted.VPC, adopted.Attachment, "uid-3") {
			t.Fatalf("the inline tap: adopted %v, ifindex %d (was %d), alias %q", att4.AdoptedTap, index, inlineIndex, alias)
		}
		// The teardown of a record of another UID (a predecessor's DEL
		// that comes late) leaves the tap and its routes alone.
		stale := att2.Record
		stale.ContainerID = "c-stale"
		if err := h.Store().Put(stale); err != nil {
			t.Fatal(err)
		}
		if err := h.Teardown(stale); err != nil {
			t.Fatalf("the late teardown of another UID's record: %v", err)
		}
		if i, _ := tapIndex(t, name); i != inlineIndex {
			t.Fatalf("another UID's teardown removed the tap")
		}
		d, err := routing.Find(adopted.VPC)
		if err != nil || d == nil {
			t.Fatalf("the domain went with another UID's teardown: %v", err)
		}
		if err := d.Verify(mustLink(t, name), []netip.Addr{netip.MustParseAddr("10.20.0.5")}, Gateways(adopted.Addresses)); err != nil {
			t.Fatalf("another UID's teardown touched the successor's routes: %v", err)
		}
		if err := h.Teardown(att4.Record); err != nil {
			t.Fatal(err)
		}
	})
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
