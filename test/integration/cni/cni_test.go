package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestATapAttachmentIsCreatedCheckedAndDeletedIdempotently(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	container := harness.NewContainer(t)
	network(t, node, "blue", stanza("blue", "vm-0-net0", "tap", "10.20.0.5/24", "fd20::5/64"))

	out := cnitool(t, node, "add", "blue", container)
	var res current.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("ADD result: %v\n%s", err, out)
	}
	tapName := names.HostInterface(names.ModeTap, "blue", "vm-0-net0")
	if len(res.Interfaces) != 1 || res.Interfaces[0].Name != tapName || res.Interfaces[0].Sandbox != "" {
		t.Fatalf("the result should list only the host tap %s: %s", tapName, out)
	}
	if len(res.IPs) != 2 || res.IPs[0].Gateway.String() != "10.20.0.1" || res.IPs[1].Gateway.String() != "fd20::1" || *res.IPs[0].Interface != 0 {
		t.Fatalf("the result should carry both addresses with their gateways on interface 0: %s", out)
	}

	l := hostLink(t, node, tapName)
	if l == nil {
		t.Fatalf("ADD should create tap %s", tapName)
	}
	if tp, ok := l.(*netlink.Tuntap); !ok || tp.Mode != netlink.TUNTAP_MODE_TAP || tp.NonPersist {
		t.Fatalf("%s should be a persistent tap, is %#v", tapName, l)
	}
	if l.Attrs().Alias != "galactic:blue/vm-0-net0" || l.Attrs().MTU != 1400 || l.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("tap should have the alias, MTU 1400 and be up: alias %q mtu %d flags %v", l.Attrs().Alias, l.Attrs().MTU, l.Attrs().Flags)
	}
	var addrs []string
	in(t, node, func() error {
		as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range as {
			addrs = append(addrs, a.IPNet.String())
		}
		return err
	})
	for _, gw := range []string{"10.20.0.1/32", "fd20::1/128"} {
		if !slices.Contains(addrs, gw) {
			t.Fatalf("tap should carry gateway %s, has %v", gw, addrs)
		}
	}
	d := domain(t, node, "blue")
	if d == nil || d.Kind != routing.KindTable {
		t.Fatalf("VPC blue should have a table domain, has %+v", d)
	}
	routes := tableRoutes(t, node, d.Table)
	for _, r := range []string{"10.20.0.5/32", "fd20::5/128"} {
		if !hasRoute(routes, r, unix.RTN_UNICAST) {
			t.Fatalf("table %d should route %s to the tap: %v", d.Table, r, routes)
		}
	}
	for _, r := range []string{"0.0.0.0/0", "::/0"} {
		if !hasRoute(routes, r, unix.RTN_UNREACHABLE) {
			t.Fatalf("table %d should end with unreachable %s: %v", d.Table, r, routes)
		}
	}
	rules := galacticRules(t, node)
	for _, want := range []string{
		fmt.Sprintf("family %d iif %s lookup %d", netlink.FAMILY_V4, tapName, d.Table),
		fmt.Sprintf("family %d iif %s lookup %d", netlink.FAMILY_V6, tapName, d.Table),
	} {
		if !slices.Contains(rules, want) {
			t.Fatalf("missing rule %q in %v", want, rules)
		}
	}
	if recs := node.Records(t); len(recs) != 1 || recs[0].HostInterface != tapName || recs[0].Table != d.Table || recs[0].Network != "blue" {
		t.Fatalf("ADD should write one record for the tap: %+v", recs)
	}

	cnitool(t, node, "check", "blue", container)

	cnitool(t, node, "del", "blue", container)
	assertClean(t, node)
	cnitool(t, node, "del", "blue", container)
	assertClean(t, node)

	// DEL once the container's netns is gone.
	cnitool(t, node, "add", "blue", container)
	container.Delete()
	cnitool(t, node, "del", "blue", container)
	assertClean(t, node)
}

func TestATapHeldByAnotherRuntimeFailsWithTryAgainLaterAndIsAdoptedOnceReleased(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	old, replacement := harness.NewContainer(t), harness.NewContainer(t)
	network(t, node, "blue", stanza("blue", "vm-1-net0", "tap", "10.20.0.6/24"))
	cni := lib(node, "blue")

	if _, err := cni.Add(ctx, rt(old)); err != nil {
		t.Fatal(err)
	}
	tapName := names.HostInterface(names.ModeTap, "blue", "vm-1-net0")
	before := hostLink(t, node, tapName).Attrs().Index
	stop := node.HoldTap(t, tapName)

	_, err := cni.Add(ctx, rt(replacement))
	e := harness.CNIError(t, err)
	if e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, "another runtime holds interface "+tapName) {
		t.Fatalf("want code %d saying another runtime holds %s, got %d %q", types.ErrTryAgainLater, tapName, e.Code, e.Msg)
	}
	if recs := node.Records(t); len(recs) != 1 {
		t.Fatalf("the refused ADD must not write a record: %+v", recs)
	}

	stop()
	if _, err := cni.Add(ctx, rt(replacement)); err != nil {
		t.Fatalf("ADD should adopt the released tap: %v", err)
	}
	if after := hostLink(t, node, tapName).Attrs().Index; after != before {
		t.Fatalf("the tap should be adopted (ifindex %d), not recreated (ifindex %d)", before, after)
	}
	if err := cni.Check(ctx, rt(replacement)); err != nil {
		t.Fatalf("CHECK of the replacement: %v", err)
	}

	// The predecessor's DEL leaves the tap to the live replacement.
	if err := cni.Del(ctx, rt(old)); err != nil {
		t.Fatal(err)
	}
	if hostLink(t, node, tapName) == nil {
		t.Fatal("DEL of the predecessor must keep the tap its live replacement uses")
	}
	if err := cni.Check(ctx, rt(replacement)); err != nil {
		t.Fatalf("CHECK of the replacement after the predecessor's DEL: %v", err)
	}
	if err := cni.Del(ctx, rt(replacement)); err != nil {
		t.Fatal(err)
	}
	assertClean(t, node)
}

func TestAVethContainerPingsItsGatewayPassesCheckAndDelRemovesBothEnds(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	container := harness.NewContainer(t)
	network(t, node, "blue", stanza("blue", "web-0-net0", "veth", "10.20.0.5/24", "fd20::5/64"))

	out := cnitool(t, node, "add", "blue", container)
	var res current.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	hostName := names.HostInterface(names.ModeVeth, "blue", "web-0-net0")
	if len(res.Interfaces) != 2 || res.Interfaces[0].Name != hostName || res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != container.Path {
		t.Fatalf("the result should list the host end and the container's eth0: %s", out)
	}
	if *res.IPs[0].Interface != 1 || len(res.Routes) != 2 {
		t.Fatalf("the addresses belong to eth0 and there is a default route per family: %s", out)
	}

	for _, gw := range []string{"10.20.0.1", "fd20::1"} {
		if err := container.Ping(netip.MustParseAddr(gw)); err != nil {
			t.Fatalf("the container should reach its gateway %s: %v", gw, err)
		}
	}
	var neighs []string
	in(t, node, func() error {
		ns, err := netlink.NeighList(hostLink(t, node, hostName).Attrs().Index, netlink.FAMILY_ALL)
		for _, n := range ns {
			if n.State&netlink.NUD_PERMANENT != 0 {
				neighs = append(neighs, n.IP.String())
			}
		}
		return err
	})
	slices.Sort(neighs)
	if !slices.Equal(neighs, []string{"10.20.0.5", "fd20::5"}) {
		t.Fatalf("the host end should have permanent neighbours for the workload: %v", neighs)
	}

	cnitool(t, node, "check", "blue", container)

	cnitool(t, node, "del", "blue", container)
	if out, _ := container.Run("ip", "link", "show", "eth0"); !strings.Contains(out, "does not exist") {
		t.Fatalf("DEL should remove the container end: %s", out)
	}
	assertClean(t, node)
	cnitool(t, node, "del", "blue", container)

	// DEL once the container's netns is gone: the pair went with it.
	cnitool(t, node, "add", "blue", container)
	container.Delete()
	cnitool(t, node, "del", "blue", container)
	assertClean(t, node)
}

func TestCheckSaysWhatDiffersFromTheConfig(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	container := harness.NewContainer(t)
	network(t, node, "blue", stanza("blue", "web-1-net0", "veth", "10.20.0.7/24"))
	cni := lib(node, "blue")
	if _, err := cni.Add(ctx, rt(container)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cni.Del(ctx, rt(container)) })
	hostName := names.HostInterface(names.ModeVeth, "blue", "web-1-net0")
	if out, err := node.Run("ip", "addr", "del", "10.20.0.1/32", "dev", hostName); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	e := harness.CNIError(t, cni.Check(ctx, rt(container)))
	if !strings.Contains(e.Msg, hostName+" lacks gateway address 10.20.0.1") {
		t.Fatalf("CHECK should say the gateway is missing, got %q", e.Msg)
	}
}

func TestTableRoutingGivesEachVPCItsOwnTableAndIsolatesThem(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	if out, err := node.Run("sysctl", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	blue1, blue2, red1 := harness.NewContainer(t), harness.NewContainer(t), harness.NewContainer(t)
	network(t, node, "blue-1", stanza("blue", "web-1", "veth", "10.20.0.5/24", "fd20::5/64"))
	network(t, node, "blue-2", stanza("blue", "web-2", "veth", "10.20.0.6/24", "fd20::6/64"))
	network(t, node, "red-1", stanza("red", "web-1", "veth", "10.30.0.5/24", "fd30::5/64"))
	cnitool(t, node, "add", "blue-1", blue1)
	cnitool(t, node, "add", "blue-2", blue2)
	cnitool(t, node, "add", "red-1", red1)

	blue, red := domain(t, node, "blue"), domain(t, node, "red")
	if blue == nil || red == nil || blue.Table == red.Table {
		t.Fatalf("VPCs blue and red should have different tables: %+v %+v", blue, red)
	}

	// Within a VPC, workloads reach their gateway and each other.
	for _, c := range []struct {
		from *harness.Netns
		to   string
	}{{blue1, "10.20.0.1"}, {blue1, "10.20.0.6"}, {blue1, "fd20::6"}, {blue2, "10.20.0.5"}, {red1, "10.30.0.1"}, {red1, "fd30::1"}} {
		if err := c.from.Ping(netip.MustParseAddr(c.to)); err != nil {
			t.Fatalf("ping %s within its VPC: %v", c.to, err)
		}
	}
	// Across VPCs the table's unreachable default stops the packet.
	for _, to := range []string{"10.20.0.5", "fd20::5"} {
		if err := red1.Ping(netip.MustParseAddr(to)); err == nil || !strings.Contains(err.Error(), "destination unreachable") {
			t.Fatalf("red must not reach blue's %s; want destination unreachable from red's table, got %v", to, err)
		}
	}

	cnitool(t, node, "del", "blue-1", blue1)
	if d := domain(t, node, "blue"); d == nil || d.Table != blue.Table {
		t.Fatalf("blue's domain must stay while blue-2 uses it: %+v", d)
	}
	if err := blue2.Ping(netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Fatalf("blue-2 after blue-1's DEL: %v", err)
	}
	if err := red1.Ping(netip.MustParseAddr("10.30.0.1")); err != nil {
		t.Fatalf("red after blue-1's DEL: %v", err)
	}
	cnitool(t, node, "check", "red-1", red1)

	cnitool(t, node, "del", "blue-2", blue2)
	if d := domain(t, node, "blue"); d != nil {
		t.Fatalf("blue's domain should go with its last attachment: %+v", d)
	}
	if routes := tableRoutes(t, node, blue.Table); len(routes) != 0 {
		t.Fatalf("blue's table should be empty: %v", routes)
	}
	for _, r := range galacticRules(t, node) {
		if strings.HasSuffix(r, fmt.Sprintf("lookup %d", blue.Table)) {
			t.Fatalf("blue's rule %q should be gone", r)
		}
	}
	cnitool(t, node, "check", "red-1", red1)
	cnitool(t, node, "del", "red-1", red1)
	assertClean(t, node)
}

func TestVRFRoutingPutsTheHostInterfaceInTheVPCsVRF(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	var probe error
	in(t, node, func() error { probe = routing.ProbeVRF("gpvrftest"); return nil })
	if probe != nil {
		t.Skipf("this kernel cannot run routing \"vrf\": %v", probe)
	}
	container := harness.NewContainer(t)
	st := stanza("blue", "web-0-net0", "veth", "10.20.0.5/24")
	st["routing"] = "vrf"
	network(t, node, "blue", st)
	cnitool(t, node, "add", "blue", container)
	d := domain(t, node, "blue")
	if d == nil || d.Kind != routing.KindVRF {
		t.Fatalf("VPC blue should have a VRF domain: %+v", d)
	}
	host := hostLink(t, node, names.HostInterface(names.ModeVeth, "blue", "web-0-net0"))
	if vrf := hostLink(t, node, d.Device); vrf == nil || host.Attrs().MasterIndex != vrf.Attrs().Index {
		t.Fatalf("the host end should be enslaved to %s", d.Device)
	}
	if err := container.Ping(netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Fatal(err)
	}
	cnitool(t, node, "check", "blue", container)
	cnitool(t, node, "del", "blue", container)
	assertClean(t, node)
}

func TestEightParallelAddsOfOneVPCShareOneDomain(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	const n = 8
	containers := make([]*harness.Netns, n)
	for i := range containers {
		containers[i] = harness.NewContainer(t)
		mode := names.ModeTap
		if i%2 == 1 {
			mode = names.ModeVeth
		}
		network(t, node, fmt.Sprintf("blue-%d", i), stanza("blue", fmt.Sprintf("web-%d", i), mode, fmt.Sprintf("10.20.0.%d/24", 10+i)))
	}
	run := func(verb string) {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range containers {
			wg.Go(func() {
				_, errs[i] = node.CNITool(verb, fmt.Sprintf("blue-%d", i), containers[i], "eth0")
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	run("add")

	d := domain(t, node, "blue")
	if d == nil {
		t.Fatal("VPC blue has no domain")
	}
	recs := node.Records(t)
	if len(recs) != n {
		t.Fatalf("want %d records, have %d", n, len(recs))
	}
	for _, r := range recs {
		if r.Table != d.Table {
			t.Fatalf("every attachment should share table %d, %s has %d", d.Table, r.HostInterface, r.Table)
		}
	}
	markers := 0
	in(t, node, func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == routing.Marker("blue").String() {
				markers++
			}
		}
		return err
	})
	if markers != 1 {
		t.Fatalf("want one table marked for VPC blue, found %d", markers)
	}
	if rules := galacticRules(t, node); len(rules) != 3*n {
		t.Fatalf("want an IPv4 and IPv6 iif rule and a to rule per attachment (%d), have %d: %v", 3*n, len(rules), rules)
	}
	run("del")
	assertClean(t, node)
}

func TestBadInputGetsTheRightErrorAndLeavesNothingBehind(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	container := harness.NewContainer(t)
	for _, tc := range []struct {
		name   string
		change func(map[string]any)
		code   uint
		msg    string
	}{
		{"missing vpc", func(s map[string]any) { delete(s, "vpc") }, types.ErrInvalidNetworkConfig, "vpc is required"},
		{"an attachment that is not a DNS label", func(s map[string]any) { s["attachment"] = "Web_0" }, types.ErrInvalidNetworkConfig, `attachment "Web_0" is not a DNS-1123 label`},
		{"a bad CIDR", func(s map[string]any) { s["addresses"] = []string{"10.20.0.5/24", "10.20.0.300/24"} }, types.ErrInvalidNetworkConfig, `addresses[1] "10.20.0.300/24" is not a CIDR`},
		{"an unknown mode", func(s map[string]any) { s["mode"] = "macvtap" }, types.ErrInvalidNetworkConfig, `mode "macvtap" is not supported`},
		{"an MTU out of range", func(s map[string]any) { s["mtu"] = 70000 }, types.ErrInvalidNetworkConfig, "mtu 70000 is out of range"},
		{"an unknown cniVersion", func(s map[string]any) { s["cniVersion"] = "9.9.9" }, types.ErrIncompatibleCNIVersion, `config is "9.9.9"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := stanza("blue", "web-0", "veth", "10.20.0.5/24")
			tc.change(st)
			version := "1.1.0"
			if v, ok := st["cniVersion"].(string); ok {
				version = v
				delete(st, "cniVersion")
			}
			node.WriteConflist(t, map[string]any{"cniVersion": version, "name": "bad", "plugins": []any{st}})
			_, err := lib(node, "bad").Add(ctx, rt(container))
			if err == nil {
				t.Fatal("ADD should fail")
			}
			e := harness.CNIError(t, err)
			if e.Code != tc.code || !strings.Contains(e.Error(), tc.msg) {
				t.Fatalf("want code %d with %q, got %d %q", tc.code, tc.msg, e.Code, e.Error())
			}
			assertClean(t, node)
		})
	}

	t.Run("routing vrf on a kernel without VRF", func(t *testing.T) {
		var probe error
		in(t, node, func() error { probe = routing.ProbeVRF("gpvrftest"); return nil })
		if probe == nil {
			t.Skip("this kernel has VRF, so routing \"vrf\" is valid here")
		}
		st := stanza("blue", "web-0", "veth", "10.20.0.5/24")
		st["routing"] = "vrf"
		network(t, node, "bad", st)
		e := harness.CNIError(t, func() error { _, err := lib(node, "bad").Add(ctx, rt(container)); return err }())
		if e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "CONFIG_NET_VRF") || !strings.Contains(e.Msg, `"routing": "table"`) {
			t.Fatalf("want code 7 naming CONFIG_NET_VRF and the table alternative, got %d %q", e.Code, e.Msg)
		}
		assertClean(t, node)
	})
}

func TestAFailedAddRemovesOnlyWhatItCreated(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	first, broken := harness.NewContainer(t), harness.NewContainer(t)
	// The broken container already has an eth0, so the veth cannot land.
	if out, err := broken.Run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	network(t, node, "blue-1", stanza("blue", "web-1", "veth", "10.20.0.5/24"))
	network(t, node, "blue-2", stanza("blue", "web-2", "veth", "10.20.0.6/24"))

	// Alone, the failed ADD takes its new domain with it.
	if _, err := node.CNITool("add", "blue-2", broken, "eth0"); err == nil || !strings.Contains(err.Error(), "already has an interface eth0") {
		t.Fatalf("ADD into a netns that has eth0 should fail saying so: %v", err)
	}
	assertClean(t, node)

	// Next to a working attachment, it leaves the shared domain alone.
	cnitool(t, node, "add", "blue-1", first)
	d := domain(t, node, "blue")
	if _, err := node.CNITool("add", "blue-2", broken, "eth0"); err == nil {
		t.Fatal("ADD into a netns that has eth0 should fail")
	}
	if after := domain(t, node, "blue"); after == nil || after.Table != d.Table {
		t.Fatalf("the shared domain must survive the failed ADD: %+v", after)
	}
	if hostLink(t, node, names.HostInterface(names.ModeVeth, "blue", "web-2")) != nil {
		t.Fatal("the failed ADD's host end must be gone")
	}
	if err := first.Ping(netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Fatalf("the working attachment after the failed ADD: %v", err)
	}
	cnitool(t, node, "check", "blue-1", first)
	cnitool(t, node, "del", "blue-1", first)
	assertClean(t, node)
}

func TestGCRemovesExactlyTheAttachmentsMissingFromTheValidList(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	keep, drop := harness.NewContainer(t), harness.NewContainer(t)
	network(t, node, "blue", stanza("blue", "vm-0-net0", "tap"))
	// Both attachments share the network config; their containers differ.
	cni := lib(node, "blue")
	if _, err := cni.Add(ctx, rt(keep)); err != nil {
		t.Fatal(err)
	}
	network(t, node, "blue", stanza("blue", "vm-1-net0", "tap"))
	if _, err := cni.Add(ctx, rt(drop)); err != nil {
		t.Fatal(err)
	}
	// Another network's attachment is not this GC's business.
	other := harness.NewContainer(t)
	network(t, node, "red", stanza("red", "vm-0-net0", "tap"))
	if _, err := lib(node, "red").Add(ctx, rt(other)); err != nil {
		t.Fatal(err)
	}

	forgetInRuntimeCache(t, node, "blue", drop)
	if err := cni.GC(ctx, types.GCAttachment{ContainerID: harness.ContainerID(keep.Path), IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if hostLink(t, node, names.HostInterface(names.ModeTap, "blue", "vm-0-net0")) == nil {
		t.Fatal("GC removed the valid attachment's tap")
	}
	if hostLink(t, node, names.HostInterface(names.ModeTap, "blue", "vm-1-net0")) != nil {
		t.Fatal("GC kept the tap of the attachment missing from the valid list")
	}
	if hostLink(t, node, names.HostInterface(names.ModeTap, "red", "vm-0-net0")) == nil {
		t.Fatal("GC of network blue removed network red's tap")
	}
	var left []string
	for _, r := range node.Records(t) {
		left = append(left, r.Network+"/"+r.Attachment)
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"blue/vm-0-net0", "red/vm-0-net0"}) {
		t.Fatalf("GC should remove exactly the dropped record: %v", left)
	}

	if err := lib(node, "red").Del(ctx, rt(other)); err != nil {
		t.Fatal(err)
	}
	network(t, node, "blue", stanza("blue", "vm-0-net0", "tap"))
	if err := cni.Del(ctx, rt(keep)); err != nil {
		t.Fatal(err)
	}
	assertClean(t, node)
}

func TestStatusReportsWhatTheNodeCannotServe(t *testing.T) {
	env := harness.Setup(t)
	node := env.NewNode(t, "node-a")
	network(t, node, "blue", stanza("blue", "web-0", "veth"))
	if err := lib(node, "blue").Status(ctx); err != nil {
		t.Fatalf("STATUS of a servable config: %v", err)
	}

	var probe error
	in(t, node, func() error { probe = routing.ProbeVRF("gpvrftest"); return nil })
	if probe != nil {
		st := stanza("blue", "web-0", "veth")
		st["routing"] = "vrf"
		network(t, node, "vrf", st)
		e := harness.CNIError(t, lib(node, "vrf").Status(ctx))
		if e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "CONFIG_NET_VRF") {
			t.Fatalf("STATUS of vrf routing without VRF: want code 50 naming CONFIG_NET_VRF, got %d %q", e.Code, e.Msg)
		}
	}

	broken := env.NewNode(t, "node-b")
	network(t, broken, "blue", stanza("blue", "web-0", "veth"))
	if err := writeFile(broken.ConfigPath, "{not json"); err != nil {
		t.Fatal(err)
	}
	e := harness.CNIError(t, lib(broken, "blue").Status(ctx))
	if e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "node settings are unreadable") {
		t.Fatalf("STATUS with unreadable node settings: want code 50, got %d %q", e.Code, e.Msg)
	}
}
