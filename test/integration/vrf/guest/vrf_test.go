package guest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
)

func TestTheKernelCreatesVRFDevices(t *testing.T) {
	n := newNode(t)
	n.do(t, func() error { return routing.ProbeVRF("gpprobe") })
	if l := n.link(t, "gpprobe"); l != nil {
		t.Fatalf("the probe should leave no device, found %v", l)
	}
}

func TestATapIsEnslavedToItsVPCsVRFWithGatewaysAndHostRoutesInTheVRFTable(t *testing.T) {
	n := newNode(t)
	c := newNetns(t)
	n.network(t, "blue", stanza("blue", "web-0-net0", names.ModeTap, "10.20.0.5/24", "fd20::5/64"))
	n.cnitool(t, "add", "blue", c)

	vrf := n.vrf(t, "blue")
	table := int(vrf.Table)
	if table < routing.TableMin || table >= routing.TableMin+routing.TableCount {
		t.Fatalf("VRF %s should use a table in galactic's range, got %d", vrf.Name, table)
	}
	if vrf.Alias != routing.DeviceAlias("blue") || vrf.Flags&unix.IFF_UP == 0 {
		t.Fatalf("VRF %s should be up with alias %q: %+v", vrf.Name, routing.DeviceAlias("blue"), vrf.LinkAttrs)
	}
	tap := n.hostLink(t, names.ModeTap, "blue", "web-0-net0")
	if tap.Type() != "tuntap" || tap.Attrs().MasterIndex != vrf.Index {
		t.Fatalf("tap %s should be enslaved to VRF %s (index %d), has type %s and master %d", tap.Attrs().Name, vrf.Name, vrf.Index, tap.Type(), tap.Attrs().MasterIndex)
	}
	if tap.Attrs().Alias != names.Alias("blue", "web-0-net0") || tap.Attrs().MTU != 1400 {
		t.Fatalf("tap should have alias %q and MTU 1400: %+v", names.Alias("blue", "web-0-net0"), tap.Attrs())
	}
	addrs := n.addrs(t, tap)
	for _, gw := range []string{"10.20.0.1/32", "fd20::1/128"} {
		if !slices.Contains(addrs, gw) {
			t.Fatalf("tap should carry gateway %s, has %v", gw, addrs)
		}
	}
	routes := n.tableRoutes(t, table)
	for _, dst := range []string{"10.20.0.5/32", "fd20::5/128"} {
		if !hasRoute(routes, dst, unix.RTN_UNICAST, tap.Attrs().Index) {
			t.Fatalf("VRF table %d should route %s to the tap: %v", table, dst, routes)
		}
	}
	for _, dst := range []string{"0.0.0.0/0", "::/0"} {
		if !hasRoute(routes, dst, unix.RTN_UNREACHABLE, 0) {
			t.Fatalf("VRF table %d should end in unreachable %s: %v", table, dst, routes)
		}
	}
	if main := n.tableRoutes(t, unix.RT_TABLE_MAIN); hasRoute(main, "10.20.0.5/32", unix.RTN_UNICAST, 0) {
		t.Fatalf("the workload's route belongs in the VRF table, not main: %v", main)
	}
	var d *routing.Domain
	n.do(t, func() (err error) { d, err = routing.Find("blue"); return err })
	if d == nil || d.Kind != routing.KindVRF || d.Table != table || d.Device != vrf.Name {
		t.Fatalf("the domain found from kernel state should be VRF %s table %d: %+v", vrf.Name, table, d)
	}
	if rec := n.record(t, "blue", "web-0-net0"); rec.Routing != routing.KindVRF || rec.Table != table || rec.HostInterface != tap.Attrs().Name {
		t.Fatalf("the node record should say vrf, table %d, %s: %+v", table, tap.Attrs().Name, rec)
	}

	n.cnitool(t, "check", "blue", c)
	// CHECK notices a tap that left its VRF.
	n.do(t, func() error { return netlink.LinkSetNoMaster(tap) })
	if _, err := n.run("check", "blue", c); err == nil || !strings.Contains(err.Error(), "not enslaved to VRF "+vrf.Name) {
		t.Fatalf("CHECK of a tap outside its VRF should say it is not enslaved to %s, got %v", vrf.Name, err)
	}

	n.cnitool(t, "del", "blue", c)
	if l := n.link(t, tap.Attrs().Name); l != nil {
		t.Fatalf("DEL should remove the tap, found %v", l)
	}
	if l := n.link(t, vrf.Name); l != nil {
		t.Fatalf("DEL of the VPC's last attachment should remove VRF %s", vrf.Name)
	}
	if routes := n.tableRoutes(t, table); len(routes) != 0 {
		t.Fatalf("table %d should be empty after the VRF went: %v", table, routes)
	}
	n.cnitool(t, "del", "blue", c)
	n.assertClean(t)
}

func TestAVethContainerInAVRFReachesItsGateway(t *testing.T) {
	n := newNode(t)
	c := newNetns(t)
	n.network(t, "blue", stanza("blue", "web-0-net0", names.ModeVeth, "10.20.0.5/24", "fd20::5/64"))
	// STATUS probes for VRF: this kernel has it.
	n.cnitool(t, "status", "blue", c)
	n.cnitool(t, "add", "blue", c)

	vrf := n.vrf(t, "blue")
	host := n.hostLink(t, names.ModeVeth, "blue", "web-0-net0")
	if host.Type() != "veth" || host.Attrs().MasterIndex != vrf.Index {
		t.Fatalf("the host end %s should be a veth enslaved to VRF %s: type %s, master %d", host.Attrs().Name, vrf.Name, host.Type(), host.Attrs().MasterIndex)
	}
	for _, gw := range []string{"10.20.0.1", "fd20::1"} {
		if err := ping(c, netip.MustParseAddr(gw)); err != nil {
			t.Fatalf("the container should reach its gateway through the VRF: %v", err)
		}
	}
	n.cnitool(t, "check", "blue", c)

	n.cnitool(t, "del", "blue", c)
	if l := n.link(t, host.Attrs().Name); l != nil {
		t.Fatalf("DEL should remove the host end, found %v", l)
	}
	err := c.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName("eth0")
		return err
	})
	if !errors.As(err, &netlink.LinkNotFoundError{}) {
		t.Fatalf("DEL should remove the container end eth0, lookup says %v", err)
	}
	if l := n.link(t, vrf.Name); l != nil {
		t.Fatalf("DEL of the VPC's last attachment should remove VRF %s", vrf.Name)
	}
	n.assertClean(t)
}

func TestTwoVPCsGetTwoVRFsWithTheirOwnTablesAndStayIsolated(t *testing.T) {
	n := newNode(t)
	blue1, blue2, red1 := newNetns(t), newNetns(t), newNetns(t)
	n.network(t, "blue-1", stanza("blue", "web-1", names.ModeVeth, "10.20.0.5/24", "fd20::5/64"))
	n.network(t, "blue-2", stanza("blue", "web-2", names.ModeVeth, "10.20.0.6/24", "fd20::6/64"))
	n.network(t, "red-1", stanza("red", "web-1", names.ModeVeth, "10.30.0.5/24", "fd30::5/64"))
	n.cnitool(t, "add", "blue-1", blue1)
	n.cnitool(t, "add", "blue-2", blue2)
	n.cnitool(t, "add", "red-1", red1)

	blue, red := n.vrf(t, "blue"), n.vrf(t, "red")
	if blue.Name == red.Name || blue.Table == red.Table {
		t.Fatalf("VPCs blue and red should get two VRFs with different tables: %s table %d, %s table %d", blue.Name, blue.Table, red.Name, red.Table)
	}
	for _, a := range []struct{ vpc, att string }{{"blue", "web-1"}, {"blue", "web-2"}, {"red", "web-1"}} {
		want := map[string]*netlink.Vrf{"blue": blue, "red": red}[a.vpc]
		if l := n.hostLink(t, names.ModeVeth, a.vpc, a.att); l.Attrs().MasterIndex != want.Index {
			t.Fatalf("%s/%s's host end should be enslaved to %s", a.vpc, a.att, want.Name)
		}
	}
	if routes := n.tableRoutes(t, int(blue.Table)); hasRoute(routes, "10.30.0.5/32", unix.RTN_UNICAST, 0) {
		t.Fatalf("blue's table must not route red's workload: %v", routes)
	}

	// Within a VPC, workloads reach their gateway and each other.
	for _, p := range []struct {
		from ns.NetNS
		to   string
	}{{blue1, "10.20.0.1"}, {blue1, "10.20.0.6"}, {blue1, "fd20::6"}, {blue2, "10.20.0.5"}, {red1, "10.30.0.1"}, {red1, "fd30::1"}} {
		if err := ping(p.from, netip.MustParseAddr(p.to)); err != nil {
			t.Fatalf("ping %s within its VPC: %v", p.to, err)
		}
	}
	// Across VPCs the VRF's table stops the packet: neither blue's
	// workloads nor its gateway are reachable from red.
	for _, to := range []string{"10.20.0.5", "fd20::5", "10.20.0.1"} {
		if err := ping(red1, netip.MustParseAddr(to)); !errors.Is(err, errUnreachable) {
			t.Fatalf("red must not reach blue's %s; want destination unreachable from red's VRF, got %v", to, err)
		}
	}
	n.cnitool(t, "check", "blue-1", blue1)
	n.cnitool(t, "check", "red-1", red1)

	n.cnitool(t, "del", "blue-1", blue1)
	if still := n.vrf(t, "blue"); still.Index != blue.Index || still.Table != blue.Table {
		t.Fatalf("blue's VRF must stay while blue-2 uses it: was %s table %d, now %s table %d", blue.Name, blue.Table, still.Name, still.Table)
	}
	if err := ping(blue2, netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Fatalf("blue-2 after blue-1's DEL: %v", err)
	}
	if err := ping(red1, netip.MustParseAddr("10.30.0.1")); err != nil {
		t.Fatalf("red after blue-1's DEL: %v", err)
	}
	n.cnitool(t, "check", "blue-2", blue2)
	n.cnitool(t, "check", "red-1", red1)

	n.cnitool(t, "del", "blue-2", blue2)
	if l := n.link(t, blue.Name); l != nil {
		t.Fatalf("blue's VRF should go with its last attachment")
	}
	if routes := n.tableRoutes(t, int(blue.Table)); len(routes) != 0 {
		t.Fatalf("blue's table should be empty: %v", routes)
	}
	if still := n.vrf(t, "red"); still.Index != red.Index {
		t.Fatalf("red's VRF must not change when blue goes")
	}
	if err := ping(red1, netip.MustParseAddr("fd30::1")); err != nil {
		t.Fatalf("red after blue's VRF went: %v", err)
	}
	n.cnitool(t, "check", "red-1", red1)
	n.cnitool(t, "del", "red-1", red1)
	n.assertClean(t)
}

func TestATapAndAVethOfOneVPCShareOneVRF(t *testing.T) {
	n := newNode(t)
	vmNS, ctNS := newNetns(t), newNetns(t)
	n.network(t, "vm", stanza("blue", "vm-0", names.ModeTap, "10.20.0.7/24"))
	n.network(t, "ct", stanza("blue", "ct-0", names.ModeVeth, "10.20.0.8/24"))
	n.cnitool(t, "add", "vm", vmNS)
	n.cnitool(t, "add", "ct", ctNS)

	vrf := n.vrf(t, "blue")
	tap := n.hostLink(t, names.ModeTap, "blue", "vm-0")
	veth := n.hostLink(t, names.ModeVeth, "blue", "ct-0")
	if tap.Attrs().MasterIndex != vrf.Index || veth.Attrs().MasterIndex != vrf.Index {
		t.Fatalf("both host interfaces should be in VRF %s: tap master %d, veth master %d, VRF %d", vrf.Name, tap.Attrs().MasterIndex, veth.Attrs().MasterIndex, vrf.Index)
	}
	routes := n.tableRoutes(t, int(vrf.Table))
	if !hasRoute(routes, "10.20.0.7/32", unix.RTN_UNICAST, tap.Attrs().Index) || !hasRoute(routes, "10.20.0.8/32", unix.RTN_UNICAST, veth.Attrs().Index) {
		t.Fatalf("the VRF's table should route each workload to its host interface: %v", routes)
	}
	n.cnitool(t, "check", "vm", vmNS)
	n.cnitool(t, "check", "ct", ctNS)

	n.cnitool(t, "del", "vm", vmNS)
	if still := n.vrf(t, "blue"); still.Index != vrf.Index {
		t.Fatalf("the VRF must stay for the veth")
	}
	if routes := n.tableRoutes(t, int(vrf.Table)); hasRoute(routes, "10.20.0.7/32", unix.RTN_UNICAST, 0) {
		t.Fatalf("the tap's host route should go with it: %v", routes)
	}
	if err := ping(ctNS, netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Fatalf("the container after the tap's DEL: %v", err)
	}
	n.cnitool(t, "del", "ct", ctNS)
	n.assertClean(t)
}

func TestATableAttachmentCannotJoinAVPCThatHasAVRF(t *testing.T) {
	n := newNode(t)
	first, second := newNetns(t), newNetns(t)
	n.network(t, "vrf", stanza("blue", "web-1", names.ModeTap, "10.20.0.5/24"))
	st := stanza("blue", "web-2", names.ModeTap, "10.20.0.6/24")
	st["routing"] = routing.KindTable
	n.network(t, "table", st)
	n.cnitool(t, "add", "vrf", first)
	vrf := n.vrf(t, "blue")

	_, err := n.run("add", "table", second)
	if err == nil || !strings.Contains(err.Error(), `uses routing "vrf" here, the config asks for "table"`) {
		t.Fatalf("ADD with table routing into a VPC with a VRF should be refused naming both kinds, got %v", err)
	}
	if l := n.link(t, names.HostInterface(names.ModeTap, "blue", "web-2")); l != nil {
		t.Fatalf("the refused ADD should leave no tap, found %s", l.Attrs().Name)
	}
	if still := n.vrf(t, "blue"); still.Index != vrf.Index {
		t.Fatalf("the refused ADD must leave the VRF alone")
	}
	if len(n.records(t)) != 1 {
		t.Fatalf("the refused ADD should write no record: %+v", n.records(t))
	}
	n.cnitool(t, "check", "vrf", first)
	n.cnitool(t, "del", "table", second)
	n.cnitool(t, "del", "vrf", first)
	n.assertClean(t)
}

func TestDelAfterTheContainerIsGoneRemovesTheHostEndAndTheVRF(t *testing.T) {
	n := newNode(t)
	c := newNetns(t)
	n.network(t, "blue", stanza("blue", "web-0-net0", names.ModeVeth, "10.20.0.5/24"))
	n.cnitool(t, "add", "blue", c)
	vrf := n.vrf(t, "blue")
	path := c.Path()
	c.Close()
	if err := testutils.UnmountNS(c); err != nil {
		t.Fatal(err)
	}

	if _, err := n.run("del", "blue", gone(path)); err != nil {
		t.Fatalf("DEL after the container netns was deleted should succeed: %v", err)
	}
	if l := n.link(t, names.HostInterface(names.ModeVeth, "blue", "web-0-net0")); l != nil {
		t.Fatalf("DEL should leave no host end, found %s", l.Attrs().Name)
	}
	if l := n.link(t, vrf.Name); l != nil {
		t.Fatalf("DEL should remove VRF %s with the VPC's last attachment", vrf.Name)
	}
	n.assertClean(t)
}

func TestEightParallelAddsOfOneVPCCreateOneVRF(t *testing.T) {
	n := newNode(t)
	const count = 8
	containers := make([]ns.NetNS, count)
	for i := range containers {
		containers[i] = newNetns(t)
		mode := names.ModeTap
		if i%2 == 1 {
			mode = names.ModeVeth
		}
		n.network(t, fmt.Sprintf("blue-%d", i), stanza("blue", fmt.Sprintf("web-%d", i), mode, fmt.Sprintf("10.20.0.%d/24", 10+i)))
	}
	parallel := func(verb string) {
		errs := make([]error, count)
		var wg sync.WaitGroup
		for i := range containers {
			wg.Go(func() { _, errs[i] = n.run(verb, fmt.Sprintf("blue-%d", i), containers[i]) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("parallel %s: %v", verb, err)
		}
	}
	parallel("add")

	vrf := n.vrf(t, "blue")
	var vrfs []string
	n.do(t, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if _, ok := l.(*netlink.Vrf); ok {
				vrfs = append(vrfs, l.Attrs().Name)
			}
		}
		return err
	})
	if len(vrfs) != 1 {
		t.Fatalf("eight attachments of one VPC should share one VRF, found %v", vrfs)
	}
	routes := n.tableRoutes(t, int(vrf.Table))
	for i := range containers {
		mode := names.ModeTap
		if i%2 == 1 {
			mode = names.ModeVeth
		}
		l := n.hostLink(t, mode, "blue", fmt.Sprintf("web-%d", i))
		if l.Attrs().MasterIndex != vrf.Index {
			t.Fatalf("%s should be enslaved to %s", l.Attrs().Name, vrf.Name)
		}
		if dst := fmt.Sprintf("10.20.0.%d/32", 10+i); !hasRoute(routes, dst, unix.RTN_UNICAST, l.Attrs().Index) {
			t.Fatalf("the VRF's table should route %s to %s: %v", dst, l.Attrs().Name, routes)
		}
	}
	parallel("del")
	n.assertClean(t)
}

func TestAWorkloadInAVRFCannotReachTheNodesOwnAddresses(t *testing.T) {
	n := newNode(t)
	c := newNetns(t)
	n.network(t, "blue", stanza("blue", "web-0-net0", names.ModeVeth, "10.20.0.5/24", "fd20::5/64"))
	n.cnitool(t, "add", "blue", c)
	// The node's own addresses live outside every VPC, in the default VRF;
	// here they sit on the node's loopback.
	nodeAddrs := []string{"192.0.2.1", "2001:db8::1"}
	n.do(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, s := range nodeAddrs {
			a := netip.MustParseAddr(s)
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}, Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		return nil
	})

	for _, gw := range []string{"10.20.0.1", "fd20::1"} {
		if err := ping(c, netip.MustParseAddr(gw)); err != nil {
			t.Fatalf("the workload should reach its own gateway: %v", err)
		}
	}
	for _, s := range nodeAddrs {
		if err := ping(c, netip.MustParseAddr(s)); !errors.Is(err, errUnreachable) {
			t.Errorf("a workload in VPC blue's VRF must not reach the node's address %s outside the VPC; "+
				"want destination unreachable from the VRF's table, got %v", s, err)
		}
	}
	// The node reaches its own addresses through the moved local rule.
	for _, s := range nodeAddrs {
		if err := ping(n.ns, netip.MustParseAddr(s)); err != nil {
			t.Errorf("the node should reach its own %s: %v", s, err)
		}
	}
	n.cnitool(t, "check", "blue", c)
	n.cnitool(t, "del", "blue", c)
	n.assertClean(t)
	if prefs := n.localRulePrefs(t); !slices.Equal(prefs, []int{routing.LocalPriority, routing.LocalPriority}) {
		t.Fatalf("the local rules (IPv4, IPv6) should stay at %d after the last DEL, are at %v", routing.LocalPriority, prefs)
	}
	for _, s := range nodeAddrs {
		if err := ping(n.ns, netip.MustParseAddr(s)); err != nil {
			t.Errorf("the node should reach its own %s after the last DEL: %v", s, err)
		}
	}
}

func TestVRFAndTableVPCsOnOneNodeCannotReachEachOthersGateways(t *testing.T) {
	n := newNode(t)
	blueNS, redNS := newNetns(t), newNetns(t)
	n.network(t, "blue", stanza("blue", "web-0", names.ModeVeth, "10.20.0.5/24", "fd20::5/64"))
	red := stanza("red", "web-0", names.ModeVeth, "10.30.0.5/24", "fd30::5/64")
	red["routing"] = routing.KindTable
	n.network(t, "red", red)
	n.cnitool(t, "add", "blue", blueNS)
	n.cnitool(t, "add", "red", redNS)

	for _, p := range []struct {
		from ns.NetNS
		to   string
	}{{blueNS, "10.20.0.1"}, {blueNS, "fd20::1"}, {redNS, "10.30.0.1"}, {redNS, "fd30::1"}} {
		if err := ping(p.from, netip.MustParseAddr(p.to)); err != nil {
			t.Fatalf("a workload should reach its own gateway %s: %v", p.to, err)
		}
	}
	for _, p := range []struct {
		from      ns.NetNS
		to, which string
	}{{blueNS, "10.30.0.1", "the VRF workload"}, {blueNS, "fd30::1", "the VRF workload"}, {redNS, "10.20.0.1", "the table workload"}, {redNS, "fd20::1", "the table workload"}} {
		if err := ping(p.from, netip.MustParseAddr(p.to)); !errors.Is(err, errUnreachable) {
			t.Errorf("%s must not reach the other VPC's gateway %s; want destination unreachable, got %v", p.which, p.to, err)
		}
	}
	n.cnitool(t, "check", "blue", blueNS)
	n.cnitool(t, "check", "red", redNS)
	n.cnitool(t, "del", "blue", blueNS)
	n.cnitool(t, "del", "red", redNS)
	n.assertClean(t)
}

func TestAVPCWhoseVRFDeviceWasDeletedByHandKeepsVRFRoutingAndGetsItsDeviceBack(t *testing.T) {
	n := newNode(t)
	first, second := newNetns(t), newNetns(t)
	n.network(t, "blue-1", stanza("blue", "web-1", names.ModeVeth, "10.20.0.5/24"))
	n.network(t, "blue-2", stanza("blue", "web-2", names.ModeVeth, "10.20.0.6/24"))
	table := stanza("blue", "web-3", names.ModeVeth, "10.20.0.7/24")
	table["routing"] = routing.KindTable
	n.network(t, "blue-table", table)
	n.cnitool(t, "add", "blue-1", first)
	vrf := n.vrf(t, "blue")
	n.do(t, func() error { return netlink.LinkDel(vrf) })

	var d *routing.Domain
	n.do(t, func() (err error) { d, err = routing.Find("blue"); return err })
	if d == nil || d.Kind != routing.KindVRF || d.Table != int(vrf.Table) || d.Device != "" {
		t.Fatalf("the VPC should still be found as vrf routing with table %d and no device: %+v", vrf.Table, d)
	}
	if _, err := n.run("check", "blue-1", first); err == nil || !strings.Contains(err.Error(), "VRF device "+vrf.Name+" of VPC blue is missing") {
		t.Fatalf("CHECK should say the VRF device is missing, got %v", err)
	}
	if _, err := n.run("add", "blue-table", newNetns(t)); err == nil || !strings.Contains(err.Error(), `uses routing "vrf" here`) {
		t.Fatalf("table routing must not take over the VPC whose VRF device went, got %v", err)
	}

	n.cnitool(t, "add", "blue-2", second)
	again := n.vrf(t, "blue")
	if again.Table != vrf.Table {
		t.Fatalf("the recreated VRF should use the VPC's table %d, uses %d", vrf.Table, again.Table)
	}
	if err := ping(second, netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Fatalf("the attachment added after the VRF came back: %v", err)
	}
	n.cnitool(t, "check", "blue-2", second)
	n.cnitool(t, "del", "blue-1", first)
	n.cnitool(t, "del", "blue-2", second)
	n.assertClean(t)
}
