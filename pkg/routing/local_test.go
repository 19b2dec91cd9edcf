package routing

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/netnstest"
	"golang.org/x/sys/unix"
)

// inNetns runs f in a fresh network namespace; it needs root.
func inNetns(t *testing.T, f func()) { netnstest.Run(t, f) }

// localPrefs are the preferences of the plain `lookup local` rules of a family.
func localPrefs(t *testing.T, family int) []int {
	t.Helper()
	rules, err := netlink.RuleList(family)
	if err != nil {
		t.Fatal(err)
	}
	var prefs []int
	for _, k := range rules {
		if isLocalLookup(k) {
			prefs = append(prefs, k.Priority)
		}
	}
	return prefs
}

func TestEnsureMovesTheLocalRuleBehindGalacticsRulesOnceAndTheMoveOutlivesTheDomain(t *testing.T) {
	inNetns(t, func() {
		for _, f := range families {
			if got := localPrefs(t, f); !slices.Equal(got, []int{0}) {
				t.Fatalf("family %d: a fresh netns should have the local rule at 0, has %v", f, got)
			}
		}
		if front, err := localRuleInFront(); err != nil || front == "" {
			t.Fatalf("the kernel's rule at 0 should be reported as in front: %q %v", front, err)
		}
		for range 2 {
			if _, _, err := Ensure("blue", KindTable); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := Ensure("red", KindTable); err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if got := localPrefs(t, f); !slices.Equal(got, []int{LocalPriority}) {
				t.Fatalf("family %d: the local rule should be at %d only, once, is at %v", f, LocalPriority, got)
			}
		}
		if front, err := localRuleInFront(); err != nil || front != "" {
			t.Fatalf("nothing should be in front after the move: %q %v", front, err)
		}
		for _, vpc := range []string{"blue", "red"} {
			if err := Remove(vpc); err != nil {
				t.Fatal(err)
			}
		}
		for _, f := range families {
			if got := localPrefs(t, f); !slices.Equal(got, []int{LocalPriority}) {
				t.Fatalf("family %d: removing the domains must keep the moved rule, found %v", f, got)
			}
		}
	})
}

func TestEachInterfaceCarriesItsOwnLocalRouteForASharedGateway(t *testing.T) {
	inNetns(t, func() {
		d, _, err := Ensure("blue", KindTable)
		if err != nil {
			t.Fatal(err)
		}
		var links []netlink.Link
		for _, name := range []string{"gva", "gvb"} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				t.Fatal(err)
			}
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err == nil {
				err = d.AddInterface(l)
			}
			if err != nil {
				t.Fatal(err)
			}
			links = append(links, l)
		}
		gws := []netip.Addr{netip.MustParseAddr("10.20.0.1"), netip.MustParseAddr("fd20::1")}
		for _, l := range links {
			for _, gw := range gws {
				// Twice: an adopted tap gets its gateways again.
				for range 2 {
					if err := d.AddGateway(l, gw); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		count := func(linkIndex int) int {
			routes, err := tableRoutes(d.Table)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range routes {
				if r.Type == unix.RTN_LOCAL && (linkIndex == 0 || r.LinkIndex == linkIndex) {
					n++
				}
			}
			return n
		}
		if n := count(0); n != 4 {
			t.Fatalf("want a local route per gateway and interface (4), have %d", n)
		}
		if err := d.Verify(links[0], nil, gws); err != nil {
			t.Fatalf("Verify with both gateways in place: %v", err)
		}
		if err := d.RemoveGateways(links[0].Attrs().Index); err != nil {
			t.Fatal(err)
		}
		if count(links[0].Attrs().Index) != 0 || count(links[1].Attrs().Index) != 2 {
			t.Fatalf("removing gva's gateways must keep gvb's: gva has %d, gvb %d", count(links[0].Attrs().Index), count(links[1].Attrs().Index))
		}
		if err := d.Verify(links[0], nil, gws); err == nil {
			t.Fatal("Verify should notice gva's missing local routes")
		}
		if err := d.RemoveGateways(links[0].Attrs().Index); err != nil {
			t.Fatalf("removing them again: %v", err)
		}
		if err := Remove("blue"); err != nil {
			t.Fatal(err)
		}
		if n := count(0); n != 0 {
			t.Fatalf("the domain's removal should take the rest: %d left", n)
		}
	})
}

// TestEnsureOfAWholeDomainWritesNoRouteAndCompletesAPartialOne: an ADD
// into an existing domain must not rewrite its routes (every route
// watcher, galactic-router among them, would hear of a marker again),
// and one whose default went missing gets it back.
func TestEnsureOfAWholeDomainWritesNoRouteAndCompletesAPartialOne(t *testing.T) {
	inNetns(t, func() {
		d, _, err := Ensure("blue", KindTable)
		if err != nil {
			t.Fatal(err)
		}
		ch, done := make(chan netlink.RouteUpdate, 64), make(chan struct{})
		defer close(done)
		if err := netlink.RouteSubscribe(ch, done); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Ensure("blue", KindTable); err != nil {
			t.Fatal(err)
		}
		// A route written after Ensure returns marks the end of what it
		// caused: the first notification must be that one.
		end := &netlink.Route{Dst: IPNet(netip.MustParsePrefix("198.51.100.0/24")), Type: unix.RTN_UNREACHABLE, Table: d.Table}
		if err := netlink.RouteAdd(end); err != nil {
			t.Fatal(err)
		}
		if u := <-ch; u.Dst.String() != "198.51.100.0/24" {
			t.Fatalf("Ensure of a whole domain wrote %v", u.Route)
		}
		def := &netlink.Route{Dst: IPNet(netip.MustParsePrefix("0.0.0.0/0")), Type: unix.RTN_UNREACHABLE, Table: d.Table, Protocol: Protocol, Priority: unreachableMetric}
		if err := netlink.RouteDel(def); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Ensure("blue", KindTable); err != nil {
			t.Fatal(err)
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: d.Table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(rs, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == "0.0.0.0/0" }) {
			t.Fatalf("Ensure did not put the missing default back: %v", rs)
		}
	})
}
