package filter

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/netnstest"
)

func TestCoverDropsPrefixesAnotherContains(t *testing.T) {
	got := Cover([]netip.Prefix{
		netip.MustParsePrefix("10.20.0.5/32"), netip.MustParsePrefix("10.20.0.0/24"),
		netip.MustParsePrefix("10.30.0.7/24"), netip.MustParsePrefix("fd20::5/128"), netip.MustParsePrefix("10.20.0.0/24"),
	})
	want := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/24"), netip.MustParsePrefix("10.30.0.0/24"), netip.MustParsePrefix("fd20::5/128")}
	if !slices.Equal(got, want) {
		t.Fatalf("Cover = %v, want %v", got, want)
	}
}

func TestLastAddrIsTheEndOfThePrefix(t *testing.T) {
	for p, want := range map[string]string{"10.20.0.0/24": "10.20.0.255", "10.20.0.5/32": "10.20.0.5", "fd20::/60": "fd20::f:ffff:ffff:ffff:ffff", "0.0.0.0/0": "255.255.255.255", "10.16.0.0/12": "10.31.255.255"} {
		if got := lastAddr(netip.MustParsePrefix(p)); got.String() != want {
			t.Errorf("lastAddr(%s) = %s, want %s", p, got, want)
		}
	}
}

// k is the kernel's filter the tests change, as galactic's binaries do.
var k = New()

// inNetns runs f in a fresh network namespace; it needs root.
func inNetns(t *testing.T, f func()) { inNetnsB(t, f) }

func inNetnsB(t testing.TB, f func()) { netnstest.Run(t, f) }

// hostIf creates the named veths in the current namespace, standing for
// workload host interfaces: ADD attaches the classifier to them.
func hostIf(t testing.TB, names ...string) {
	t.Helper()
	for i, name := range names {
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: fmt.Sprintf("peer%d", i)}
		if err := netlink.LinkAdd(l); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
	}
}

func blue() Attachment {
	return Attachment{
		Interface: "gv0123456789abc",
		Sources:   []netip.Prefix{netip.MustParsePrefix("10.20.0.5/32"), netip.MustParsePrefix("fd20::5/128"), netip.MustParsePrefix("192.168.0.0/16")},
		Gateways:  []netip.Addr{netip.MustParseAddr("10.20.0.1"), netip.MustParseAddr("fd20::1")},
		MAC:       net.HardwareAddr{0x02, 0, 0, 0, 0, 5},
	}
}

func TestAddCheckRemoveChangeOnlyTheAttachmentsElements(t *testing.T) {
	inNetns(t, func() {
		hostIf(t, "gv0123456789abc", "gt0123456789abc")
		if err := k.Check(blue()); err == nil || !strings.Contains(err.Error(), "table inet galactic is missing") {
			t.Fatalf("CHECK before any ADD should name the missing table, got %v", err)
		}
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		red := Attachment{Interface: "gt0123456789abc", Sources: []netip.Prefix{netip.MustParsePrefix("10.30.0.5/32")}, Gateways: []netip.Addr{netip.MustParseAddr("10.30.0.1")}}
		if err := k.Add(red); err != nil {
			t.Fatal(err)
		}
		// A second ADD is idempotent.
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		for _, a := range []Attachment{blue(), red} {
			if err := k.Check(a); err != nil {
				t.Fatalf("CHECK after ADD: %v", err)
			}
		}
		if n, err := Elements(); err != nil || n != 12 {
			t.Fatalf("elements = %d, %v; want 12 (blue 9 with its ARP elements, red 3)", n, err)
		}
		// A re-ADD with other sources replaces those of the previous record.
		narrowed := blue()
		narrowed.Sources = narrowed.Sources[:2]
		if err := k.Add(narrowed, blue()); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(blue()); err == nil || !strings.Contains(err.Error(), "lacks gv0123456789abc . 192.168.0.0-192.168.255.255") {
			t.Fatalf("CHECK should name the missing source prefix, got %v", err)
		}
		// Without the previous record, an overlapping leftover is found by
		// reading the sets.
		overlapping := narrowed
		overlapping.Sources = append(slices.Clone(narrowed.Sources), netip.MustParsePrefix("192.168.1.0/24"))
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		if err := k.Add(overlapping); err != nil {
			t.Fatalf("an ADD over an overlapping leftover: %v", err)
		}
		if err := k.Check(overlapping); err != nil {
			t.Fatal(err)
		}
		if err := k.Remove(narrowed.Interface, overlapping); err != nil {
			t.Fatal(err)
		}
		if err := k.Remove(narrowed.Interface); err != nil {
			t.Fatalf("a second Remove: %v", err)
		}
		if n, err := Elements(); err != nil || n != 3 {
			t.Fatalf("elements after removing blue = %d, %v; want red's 3", n, err)
		}
		if err := k.Check(red); err != nil {
			t.Fatalf("red's filter after blue's DEL: %v", err)
		}
	})
}

func TestAFlushedRulesetIsReportedAndRestoredBySync(t *testing.T) {
	inNetns(t, func() {
		hostIf(t, "gv0123456789abc", "gv-gone")
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		c.FlushRuleset()
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(blue()); err == nil || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("CHECK after a flush should name what is missing, got %v", err)
		}
		leftover := Attachment{Interface: "gv-gone", Sources: []netip.Prefix{netip.MustParsePrefix("10.20.0.9/32")}}
		if err := k.Add(leftover); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "gv-gone"}}); err != nil {
			t.Fatal(err)
		}
		res, err := k.Sync([]Attachment{blue()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Rebuilt || res.Added != 9 || res.Removed != 2 {
			t.Fatalf("Sync = %+v, want 9 added and the leftover's 2 removed (the table was rebuilt by the leftover's ADD)", res)
		}
		if err := k.Check(blue()); err != nil {
			t.Fatalf("CHECK after Sync: %v", err)
		}
		// Another agent's change to one chain is found and undone, and a
		// chain that is not galactic's (an earlier ruleset's) goes.
		ch := &nftables.Chain{Name: "input", Table: table}
		c.FlushChain(ch)
		c.AddChain(baseChain("forward", nftables.ChainHookForward, nftables.ChainPriority(-10)))
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if miss, err := Missing(); err != nil || len(miss) != 2 || !strings.Contains(miss[0], "chain inet galactic forward is not galactic's") || !strings.Contains(miss[1], "chain inet galactic input") {
			t.Fatalf("Missing = %v, %v", miss, err)
		}
		if rebuilt, err := k.Ensure(); err != nil || !rebuilt {
			t.Fatalf("Ensure = %v, %v", rebuilt, err)
		}
		if err := k.Check(blue()); err != nil {
			t.Fatalf("CHECK after Ensure: %v", err)
		}
		if err := k.Delete(); err != nil {
			t.Fatal(err)
		}
		if err := k.Delete(); err != nil {
			t.Fatalf("a second Delete: %v", err)
		}
		if n, err := Elements(); err != nil || n != 0 {
			t.Fatalf("elements after Delete = %d, %v", n, err)
		}
	})
}

func TestSetVTEPsKeepsExactlyTheNextHops(t *testing.T) {
	inNetns(t, func() {
		a, b, c6 := netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.13"), netip.MustParseAddr("2001:db8::13")
		if res, err := k.SetVTEPs([]netip.Addr{a, b, c6, a}); err != nil || res.Added != 3 {
			t.Fatalf("SetVTEPs = %+v, %v", res, err)
		}
		if res, err := k.SetVTEPs([]netip.Addr{b}); err != nil || res.Added != 0 || res.Removed != 2 {
			t.Fatalf("SetVTEPs = %+v, %v", res, err)
		}
		if n, err := Elements(); err != nil || n != 1 {
			t.Fatalf("elements = %d, %v", n, err)
		}
	})
}

func TestARemovedElementExpiresAtOnce(t *testing.T) {
	inNetns(t, func() {
		hostIf(t, "gv0123456789abc")
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		for _, e := range blue().elements() {
			if left, err := expires(e); err != nil || left < goneAfter {
				t.Fatalf("%s %s after Add: expires in %v, %v", e.set, e.describe(), left, err)
			}
		}
		if err := k.Remove(blue().Interface, blue()); err != nil {
			t.Fatal(err)
		}
		for _, e := range blue().elements() {
			// Zero: already gone; else within the removal's expiration.
			if left, err := expires(e); err != nil || left >= goneAfter {
				t.Fatalf("%s %s after Remove: expires in %v, %v", e.set, e.describe(), left, err)
			}
		}
	})
}

// A plugin starts the ADD's filter work and then enters the container's
// namespace: the elements still land in the namespace StartAdd was called
// in, and nothing in the one the caller went to.
func TestStartAddWritesInItsCallersNamespaceWhileTheCallerIsElsewhere(t *testing.T) {
	inNetns(t, func() {
		hostIf(t, "gv0123456789abc")
		l, err := netlink.LinkByName("gv0123456789abc")
		if err != nil {
			t.Fatal(err)
		}
		p := k.StartAdd(blue())
		inNetns(t, func() {
			if err := p.Wait(); err != nil {
				t.Fatal(err)
			}
			if missing, err := Missing(); err != nil || len(missing) == 0 {
				t.Fatalf("the namespace the caller entered got galactic's table (missing %v, %v)", missing, err)
			}
		})
		if err := p.Finish(l.Attrs().Index); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(blue()); err != nil {
			t.Fatalf("CHECK after StartAdd and Finish: %v", err)
		}
	})
}

func TestTheClassifierGoesOnAtAddIsCheckedAndIsPutBackBySync(t *testing.T) {
	inNetns(t, func() {
		if err := k.Add(blue()); !errors.Is(err, ErrNoInterface) {
			t.Fatalf("ADD on a missing interface = %v, want ErrNoInterface", err)
		}
		hostIf(t, "gv0123456789abc")
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		link, err := netlink.LinkByName(blue().Interface)
		if err != nil {
			t.Fatal(err)
		}
		// Another agent deletes the interface's clsact qdisc.
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscDel(q); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(blue()); err == nil || !strings.Contains(err.Error(), "has no workload classifier on its ingress") {
			t.Fatalf("CHECK without the classifier = %v", err)
		}
		if res, err := k.Sync([]Attachment{blue()}); err != nil || res.Attached != 1 {
			t.Fatalf("Sync = %+v, %v; want the classifier attached once", res, err)
		}
		if err := k.Check(blue()); err != nil {
			t.Fatalf("CHECK after Sync: %v", err)
		}
		// An ADD given the interface's index, as the plugin's is, puts
		// the qdisc and the classifier back as well.
		if err := netlink.QdiscDel(q); err != nil {
			t.Fatal(err)
		}
		withIndex := blue()
		withIndex.Index = link.Attrs().Index
		if err := k.Add(withIndex, blue()); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(blue()); err != nil {
			t.Fatalf("CHECK after an ADD by index: %v", err)
		}
		// An entry that is not the attachment's is named, and a re-ADD
		// replaces it.
		narrowed := blue()
		narrowed.Sources = narrowed.Sources[:1]
		if err := k.Add(narrowed, blue()); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(blue()); err == nil || !strings.Contains(err.Error(), "the workload classifier's entry for gv0123456789abc allows") {
			t.Fatalf("CHECK of the wider attachment = %v", err)
		}
		if err := k.Remove(narrowed.Interface, narrowed); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(narrowed); err == nil || !strings.Contains(err.Error(), "has no entry for gv0123456789abc") {
			t.Fatalf("CHECK after DEL = %v", err)
		}
		if err := k.Delete(); err != nil {
			t.Fatal(err)
		}
		if f, err := attached(link); err != nil || f != nil {
			t.Fatalf("after uninstall the interface still has %+v, %v", f, err)
		}
	})
}

func TestARebuildFromAPreroutingRulesetAttachesTheClassifierFromTheSourceSets(t *testing.T) {
	inNetns(t, func() {
		hostIf(t, "gv0123456789abc")
		if err := k.Add(blue()); err != nil {
			t.Fatal(err)
		}
		link, err := netlink.LinkByName(blue().Interface)
		if err != nil {
			t.Fatal(err)
		}
		// An earlier build's node: its elements, a prerouting chain, and
		// no classifier.
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscDel(q); err != nil {
			t.Fatal(err)
		}
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		c.AddChain(baseChain("prerouting", nftables.ChainHookPrerouting, nftables.ChainPriority(-300)))
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if rebuilt, err := k.Ensure(); err != nil || !rebuilt {
			t.Fatalf("Ensure = %v, %v", rebuilt, err)
		}
		if err := k.Check(blue()); err != nil {
			t.Fatalf("CHECK after the rebuild: %v", err)
		}
	})
}
