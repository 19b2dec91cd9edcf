package isolation

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/packet"
)

// plainNode is a node with forwarding on and no router.
func plainNode(t *testing.T, env *harness.Env, name string) *harness.Node {
	t.Helper()
	n := env.NewNode(t, name)
	n.EnableForwarding(t)
	return n
}

// listeners are TCP and UDP sockets of the node on 0.0.0.0 and [::],
// counting what reaches them.
type listeners struct {
	mu       sync.Mutex
	accepted int
	// datagrams counts UDP payloads by their first 16 bytes.
	datagrams map[string]int
	closers   []func()
}

const (
	tcpPort = 7070
	udpPort = 7071
)

func listen(t *testing.T, n *harness.Node) *listeners {
	t.Helper()
	l := &listeners{datagrams: map[string]int{}}
	t.Cleanup(l.close)
	err := n.Do(func() error {
		lc := net.ListenConfig{}
		for _, a := range []struct{ network, addr string }{{"tcp4", "0.0.0.0"}, {"tcp6", "[::]"}} {
			ln, err := lc.Listen(context.Background(), a.network, fmt.Sprintf("%s:%d", a.addr, tcpPort))
			if err != nil {
				return err
			}
			l.closers = append(l.closers, func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					l.mu.Lock()
					l.accepted++
					l.mu.Unlock()
					c.Close()
				}
			}()
		}
		for _, a := range []struct{ network, addr string }{{"udp4", "0.0.0.0"}, {"udp6", "[::]"}} {
			pc, err := lc.ListenPacket(context.Background(), a.network, fmt.Sprintf("%s:%d", a.addr, udpPort))
			if err != nil {
				return err
			}
			l.closers = append(l.closers, func() { pc.Close() })
			go func() {
				buf := make([]byte, 2048)
				for {
					k, _, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					key := string(buf[:min(k, 16)])
					l.mu.Lock()
					l.datagrams[key]++
					l.mu.Unlock()
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *listeners) close() {
	for _, c := range l.closers {
		c()
	}
}

func (l *listeners) count(marker []byte) (accepted, datagrams int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepted, l.datagrams[string(marker)]
}

// linkLocal is the IPv6 link-local address of ifName in ns.
func linkLocal(t *testing.T, ns *harness.Netns, ifName string) netip.Addr {
	t.Helper()
	var out netip.Addr
	harness.Eventually(t, 10*time.Second, "a link-local address on "+ifName, func() error {
		return ns.Do(func() error {
			ifc, err := net.InterfaceByName(ifName)
			if err != nil {
				return err
			}
			addrs, err := ifc.Addrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().IsLinkLocalUnicast() && p.Addr().Is6() {
					out = p.Addr()
					return nil
				}
			}
			return fmt.Errorf("none yet: %v", addrs)
		})
	})
	return out
}

func TestAWorkloadReachesNoNodeSocketThroughAnyAddressButPingsItsGateway(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	run(t, n.Netns, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
	run(t, n.Netns, "ip", "-6", "addr", "add", "2001:db8::1/128", "dev", "lo", "nodad")
	subnet := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-1", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, NoBGP: true})
	host := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-2", Addresses: []string{"10.20.0.9/32", "fd20::9/128"}, NoBGP: true})
	l := listen(t, n)

	// The node's own traffic reaches its listener through the same
	// addresses: the listeners work, and only the workloads are kept out.
	err := n.Do(func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("10.20.0.1:%d", tcpPort), 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("the node should reach its own listener through 10.20.0.1: %v", err)
	}
	harness.Eventually(t, 5*time.Second, "the node's own connection accepted", func() error {
		if a, _ := l.count(nil); a != 1 {
			return fmt.Errorf("accepted %d", a)
		}
		return nil
	})

	marker := packet.NewMarker()
	targets := map[*workload][]string{
		subnet: {"10.20.0.1", "fd20::1", "192.0.2.1", "2001:db8::1", "127.0.0.1", linkLocal(t, n.Netns, subnet.HostIf()).String() + "%" + ifName},
		host:   {"169.254.0.1", "fe80::1%" + ifName, "192.0.2.1", "2001:db8::1"},
	}
	broadcast := map[*workload][]string{
		subnet: {"255.255.255.255", "10.20.0.255", "224.0.0.1", "239.1.2.3", "ff02::1%" + ifName, "ff02::2%" + ifName},
		host:   {"255.255.255.255", "224.0.0.1", "ff02::1%" + ifName},
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var connected []string
	for w, addrs := range targets {
		for _, a := range addrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := w.c.Do(func() error {
					c, err := net.DialTimeout("tcp", net.JoinHostPort(a, fmt.Sprint(tcpPort)), 2*time.Second)
					if err == nil {
						c.Close()
					}
					return err
				})
				if err == nil {
					mu.Lock()
					connected = append(connected, a)
					mu.Unlock()
				}
			}()
		}
	}
	for w, addrs := range targets {
		err := w.c.Do(func() error {
			for _, a := range append(addrs, broadcast[w]...) {
				c, err := net.ListenPacket("udp", ":0")
				if err != nil {
					return err
				}
				if err := setBroadcast(c); err != nil {
					c.Close()
					return err
				}
				ua, err := net.ResolveUDPAddr("udp", net.JoinHostPort(a, fmt.Sprint(udpPort)))
				if err == nil {
					_, err = c.WriteTo(marker, ua)
				}
				c.Close()
				// A destination the workload cannot route to fails here:
				// nothing was sent, which is fine.
				if err != nil && !errors.Is(err, errNoRoute) && !strings.Contains(err.Error(), "unreachable") && !strings.Contains(err.Error(), "invalid argument") {
					return fmt.Errorf("sending to %s: %w", a, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if len(connected) > 0 {
		t.Errorf("a workload connected to the node's TCP listener through %v", connected)
	}
	// Pings to the gateways work, on the same paths the datagrams took.
	for w, gws := range map[*workload][]string{subnet: {"10.20.0.1", "fd20::1"}, host: {"169.254.0.1"}} {
		for _, gw := range gws {
			if err := w.c.Ping(addr(gw)); err != nil {
				t.Errorf("%s should ping its gateway %s: %v", w.Name, gw, err)
			}
		}
	}
	// The last datagram, from the node itself, is the barrier.
	if err := n.Do(func() error {
		c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", udpPort))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(append(packet.NewMarker()[:0], "barrier-barrier!"...))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 5*time.Second, "the node's own datagram", func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.datagrams["barrier-barrier!"] == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if a, d := l.count(marker); a != 1 || d != 0 {
		t.Errorf("the node's listeners got %d connections (want only its own) and %d datagrams from workloads (want 0)", a, d)
	}
}

// Nothing tracks connections (that would track every forwarded packet),
// so the node tells what answers its own connections by the TCP flags:
// its connections to a workload work, and a workload's segments that are
// not connection requests reach no listener.
func TestTheNodesOwnConnectionsToAWorkloadWorkAndOtherTCPSegmentsReachNoListener(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	w := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-1", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, NoBGP: true})
	l := listen(t, n)
	const echoPort = 7072
	if err := w.c.Do(func() error {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", echoPort))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); buf := make([]byte, 64); k, _ := c.Read(buf); _, _ = c.Write(buf[:k]) }()
			}
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, v6 := range []bool{false, true} {
		a := w.Addr(v6)
		if err := n.Ping(a); err != nil {
			t.Errorf("the node should ping its workload at %s: %v", a, err)
		}
		err := n.Do(func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(a.String(), fmt.Sprint(echoPort)), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("hello")); err != nil {
				return err
			}
			buf := make([]byte, 16)
			k, err := c.Read(buf)
			if err != nil || string(buf[:k]) != "hello" {
				return fmt.Errorf("echo %q: %v", buf[:k], err)
			}
			return nil
		})
		if err != nil {
			t.Errorf("the node's own TCP connection to %s: %v", a, err)
		}
	}
	marker := packet.NewMarker()
	var segments [][]byte
	for _, gw := range []netip.Addr{addr("10.20.0.1"), addr("fd20::1")} {
		src := w.Addr(gw.Is6())
		for i, flags := range []byte{packet.TCPAck, packet.TCPPsh | packet.TCPAck, packet.TCPFin | packet.TCPAck, packet.TCPRst, 0, packet.TCPSyn | packet.TCPAck, packet.TCPSyn, packet.TCPSyn | packet.TCPFin} {
			segments = append(segments, packet.TCP(src, gw, uint16(41000+i), tcpPort, flags, 1000, 1, marker))
		}
	}
	w.send(t, segments...)
	// The workload's ping of its gateway takes the same path after them.
	for _, gw := range []string{"10.20.0.1", "fd20::1"} {
		if err := w.c.Ping(addr(gw)); err != nil {
			t.Errorf("%s should ping its gateway %s: %v", w.Name, gw, err)
		}
	}
	if a, _ := l.count(nil); a != 0 {
		t.Errorf("the node's TCP listeners accepted %d connections from crafted segments, want 0", a)
	}
}

var errNoRoute = errors.New("no route to host")

func setBroadcast(c net.PacketConn) error {
	rc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) { serr = setsockoptBroadcast(int(fd)) })
	return errors.Join(err, serr)
}

// routerAdvert is an RA from src with a default route and an autonomous
// prefix, as a guest playing router sends it.
func routerAdvert(src netip.Addr, mac net.HardwareAddr) []byte {
	body := []byte{64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0} // hop limit, flags, lifetime 1800 s, reachable, retrans
	body = append(body, 3, 4, 64, 0xc0)                       // prefix information: on-link, autonomous
	body = binary.BigEndian.AppendUint32(body, 86400)
	body = binary.BigEndian.AppendUint32(body, 14400)
	body = append(body, 0, 0, 0, 0)
	body = append(body, addr("2001:db8:77::").AsSlice()...)
	body = append(append(body, 1, 1), mac...) // source link-layer address
	return packet.ICMP(src, addr("ff02::1"), 134, 0, body)
}

// redirect6 tells the node to reach dst through target.
func redirect6(src, target, dst netip.Addr) []byte {
	body := append(append([]byte{0, 0, 0, 0}, target.AsSlice()...), dst.AsSlice()...)
	return packet.ICMP(src, addr("ff02::1"), 137, 0, body)
}

// redirect4 tells the node to reach dst through gw, quoting a packet of
// the node's to dst.
func redirect4(src, to, gw, dst netip.Addr) []byte {
	quoted := packet.UDP(to, dst, 5000, 5001, nil)
	return packet.ICMP(src, to, 5, 1, append(gw.AsSlice(), quoted[:28]...))
}

// nodeNetState is what a router advertisement or redirect could change on
// the node: its routes in every table, its addresses, its route cache.
func nodeNetState(t *testing.T, n *harness.Node) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"ip", "-4", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"},
		{"ip", "-4", "addr"}, {"ip", "-6", "addr"},
		{"ip", "-4", "route", "get", "10.40.0.1"}, {"ip", "-6", "route", "get", "2001:db8:99::1"},
	} {
		out, _ := n.Run(args[0], args[1:]...)
		// Lifetimes count down; they are not what an RA would change.
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, "valid_lft") && !strings.Contains(line, "expires") {
				b.WriteString(line + "\n")
			}
		}
	}
	return b.String()
}

func TestGuestRouterAdvertisementsAndRedirectsChangeNoRouteOrAddressOfTheNode(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	run(t, n.Netns, "ip", "addr", "add", "10.99.0.1/24", "dev", "lo")
	veth := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-1", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, NoBGP: true})
	tap := add(t, env, n, harness.Attachment{VPC: "blue", Name: "vm-1", Mode: names.ModeTap, Addresses: []string{"10.20.0.8/24", "fd20::8/64"}, NoBGP: true})
	for _, w := range []*workload{veth, tap} {
		for _, s := range []string{"net/ipv6/conf/%s/accept_ra", "net/ipv6/conf/%s/accept_redirects", "net/ipv4/conf/%s/accept_redirects"} {
			key := fmt.Sprintf(s, w.HostIf())
			if v := strings.TrimSpace(run(t, n.Netns, "cat", "/proc/sys/"+key)); v != "0" {
				t.Errorf("%s is %s after ADD, want 0", key, v)
			}
			// As if the host side had inherited accepting defaults: the
			// packet filter alone must hold.
			val := "1"
			if strings.HasSuffix(s, "accept_ra") {
				val = "2"
			}
			run(t, n.Netns, "sysctl", "-q", "-w", strings.ReplaceAll(key, "/", ".")+"="+val)
		}
	}
	sendAll := func() {
		for _, w := range []*workload{veth, tap} {
			ll := addr("fe80::5054:ff:fe12:3456")
			if w.tap == nil {
				ll = linkLocal(t, w.c, ifName)
			}
			w.send(t,
				routerAdvert(ll, w.mac),
				redirect6(ll, addr("fe80::bad"), addr("2001:db8:99::1")),
				redirect4(addr("10.20.0.1"), w.Addr(false), w.Addr(false), addr("10.40.0.1")),
				redirect4(w.Addr(false), addr("10.99.0.1"), w.Addr(false), addr("10.40.0.1")),
			)
		}
		// Pings on the same paths: once they are answered, the node has
		// processed what came before them.
		if err := veth.c.Ping(addr("fd20::1")); err != nil {
			t.Fatal(err)
		}
		if err := veth.c.Ping(addr("10.20.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	// Link-local addresses and their routes settle first.
	var before string
	harness.Eventually(t, 20*time.Second, "the node's addresses settle", func() error {
		a := nodeNetState(t, n)
		if strings.Contains(a, "tentative") || a != before {
			before = a
			return errors.New("still changing")
		}
		return nil
	})
	sendAll()
	if after := nodeNetState(t, n); after != before {
		t.Fatalf("a guest's router advertisement or redirect changed the node:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The same packets with galactic's table removed do change the node
	// (with the accepting sysctls set above), so the test shows what the
	// filter stops.
	if err := n.Do(filter.New().Delete); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the unfiltered RA takes effect", func() error {
		sendAll()
		if after := nodeNetState(t, n); after == before {
			return errors.New("no change")
		}
		return nil
	})
}

func TestTableRoutingRefusesAnAddressAnotherVPCHoldsOnTheNode(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	blue := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-1", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, NoBGP: true})
	red := harness.Attachment{VPC: "red", Name: "web-1", Addresses: []string{"10.30.0.7/24", "fd20::5/64"}, NoBGP: true}
	env.ForgetAttachment(t, red.VPC, red.Name)
	n.WriteConflist(t, red.Conflist())
	c := harness.NewContainer(t)
	_, err := harness.LibCNI{Node: n, Network: red.Network()}.Add(context.Background(), harness.RuntimeConf(c, ifName))
	var e *types.Error
	if !errors.As(err, &e) || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "fd20::5") || !strings.Contains(e.Msg, `"routing": "vrf"`) {
		t.Fatalf("an ADD of an address another VPC holds should fail with code 7 naming the address and vrf routing, got %v", err)
	}
	// Nothing of red is left, and blue is untouched.
	if l, _ := n.LinkMAC(red.HostIf()); l != nil {
		t.Errorf("the refused ADD left %s", red.HostIf())
	}
	if err := blue.c.Ping(addr("fd20::1")); err != nil {
		t.Errorf("blue should still reach its gateway: %v", err)
	}
	if err := n.Ping(blue.Addr(true)); err != nil {
		t.Errorf("the node should still reach blue's fd20::5: %v", err)
	}
}

// flush removes every table of the node, as `nft flush ruleset` does.
func flush(t *testing.T, n *harness.Node) {
	t.Helper()
	if err := n.Do(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.FlushRuleset()
		return c.Flush()
	}); err != nil {
		t.Fatal(err)
	}
}

func elements(t *testing.T, n *harness.Node) int {
	t.Helper()
	var k int
	if err := n.Do(func() (err error) { k, err = filter.Elements(); return err }); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestAFlushedRulesetFailsCheckNamingWhatIsMissingAndTheNextGCPassRestoresIt(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	blue := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-1", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, NoBGP: true})
	check := func() error {
		n.WriteConflist(t, blue.Conflist())
		_, err := n.CNITool("check", blue.Network(), blue.c, ifName)
		return err
	}
	if err := check(); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	flush(t, n)
	err := check()
	if err == nil || !strings.Contains(err.Error(), "table inet galactic is missing") {
		t.Fatalf("CHECK after a flush should name the missing table, got %v", err)
	}
	// With the table gone, the spoofed packet would pass; the GC pass puts
	// the table and the attachment's elements back.
	n.MustGC(t)
	if err := check(); err != nil {
		t.Fatalf("CHECK after the GC pass: %v", err)
	}
	if err := blue.c.Ping(addr("10.20.0.1")); err != nil {
		t.Fatalf("ping of the gateway after the restore: %v", err)
	}
	// Leftovers of an interface that no longer exists are removed.
	if err := n.Do(func() error {
		// ADD attaches the classifier, so the interface exists until then.
		gone := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "gv00000000gone"}, PeerName: "gone-peer"}
		if err := netlink.LinkAdd(gone); err != nil {
			return err
		}
		if err := filter.New().Add(filter.Attachment{Interface: "gv00000000gone", Sources: []netip.Prefix{netip.MustParsePrefix("10.20.0.99/32")}}); err != nil {
			return err
		}
		return netlink.LinkDel(gone)
	}); err != nil {
		t.Fatal(err)
	}
	before := elements(t, n)
	n.MustGC(t)
	// Its source, in the inet and the arp table.
	if after := elements(t, n); after != before-2 {
		t.Fatalf("the GC pass should remove the leftover's two elements: %d before, %d after", before, after)
	}
}

func TestFiveHundredADDAndDELPairsLeaveNoSetElementBehind(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	a := harness.Attachment{VPC: "blue", Name: "churn", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, Allowed: []string{"192.168.0.0/16"}, NoBGP: true}
	env.ForgetAttachment(t, a.VPC, a.Name)
	n.WriteConflist(t, a.Conflist())
	cni := harness.LibCNI{Node: n, Network: a.Network()}
	c := harness.NewContainer(t)
	rt := harness.RuntimeConf(c, ifName)
	ctx := context.Background()
	const pairs = 500
	for i := 0; i < pairs; i++ {
		if _, err := cni.Add(ctx, rt); err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		if i == 0 {
			// Addresses and prefix, two gateways, the MAC, and the ARP
			// table's IPv4 address, prefix and MAC.
			if k := elements(t, n); k != 9 {
				t.Fatalf("one attachment should have 9 elements, has %d", k)
			}
		}
		if err := cni.Del(ctx, rt); err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
	}
	if k := elements(t, n); k != 0 {
		t.Fatalf("%d ADD/DEL pairs left %d set elements", pairs, k)
	}
}
