package isolation

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/packet"
)

// neighbours is the node's neighbour table of a host interface.
func neighbours(t *testing.T, n *harness.Node, hostIf string) string {
	t.Helper()
	return run(t, n.Netns, "ip", "neigh", "show", "dev", hostIf)
}

// TestAWorkloadClaimsOnlyItsOwnAddressesAndMACInARPAndNeighbourDiscovery
// sends ARP requests and neighbour solicitations and advertisements that
// claim another address or (from a veth) another MAC, and shows that none
// of them enters the node's neighbour table, while the same frames do
// once galactic's tables are gone.
func TestAWorkloadClaimsOnlyItsOwnAddressesAndMACInARPAndNeighbourDiscovery(t *testing.T) {
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	veth := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-1", Addresses: []string{"10.20.0.5/24", "fd20::5/64"}, NoBGP: true})
	tap := add(t, env, n, harness.Attachment{VPC: "blue", Name: "vm-1", Mode: names.ModeTap, Addresses: []string{"10.20.0.8/24", "fd20::8/64"}, NoBGP: true})
	spoofMAC := net.HardwareAddr{0x02, 0, 0, 0, 0xbe, 0xef}
	broadcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for _, w := range []*workload{veth, tap} {
		// As if the node took unsolicited advertisements: the filter
		// alone must hold.
		run(t, n.Netns, "sysctl", "-q", "-w", fmt.Sprintf("net.ipv6.conf.%s.accept_untracked_na=1", w.HostIf()))
	}
	vethLL := linkLocal(t, veth.c, ifName)
	send := func(settle bool) {
		for _, w := range []*workload{veth, tap} {
			ll := addr("fe80::5054:ff:fe12:3456")
			if w.tap == nil {
				ll = vethLL
			}
			// Another address as the ARP sender, and as an advertisement's
			// target.
			w.sendFrames(t, packet.Ethernet(broadcast, w.mac, packet.EtherTypeARP,
				packet.ARP(packet.ARPRequest, w.mac, addr("10.20.0.77"), make(net.HardwareAddr, 6), addr("10.20.0.1"))))
			w.send(t, packet.NeighborAdvertisement(ll, addr("fd20::77"), w.mac))
		}
		// The veth's own addresses with another MAC: in ARP, in a
		// solicitation's source link-layer option, in an advertisement's
		// target link-layer option. (The node's entries for the veth's
		// configured addresses are permanent; its link-local one is not.)
		veth.sendFrames(t, packet.Ethernet(broadcast, veth.mac, packet.EtherTypeARP,
			packet.ARP(packet.ARPRequest, spoofMAC, veth.Addr(false), make(net.HardwareAddr, 6), addr("10.20.0.1"))))
		veth.send(t,
			packet.NeighborSolicitation(vethLL, addr("fd20::1"), spoofMAC),
			packet.NeighborAdvertisement(vethLL, vethLL, spoofMAC))
		if !settle {
			return
		}
		// Pings on the same paths: once they are answered, the node has
		// processed what came before them.
		for _, a := range []string{"10.20.0.1", "fd20::1"} {
			if err := veth.c.Ping(addr(a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	claimed := func() []string {
		var out []string
		for _, w := range []*workload{veth, tap} {
			nb := neighbours(t, n, w.HostIf())
			for _, s := range []string{"10.20.0.77 ", "fd20::77 ", spoofMAC.String()} {
				if strings.Contains(nb, s) {
					out = append(out, fmt.Sprintf("%s on %s", strings.TrimSpace(s), w.HostIf()))
				}
			}
		}
		return out
	}
	send(true)
	// The workloads' own claims are taken: the filter is not closed to
	// neighbour discovery.
	tap.sendFrames(t, packet.Ethernet(broadcast, tap.mac, packet.EtherTypeARP,
		packet.ARP(packet.ARPRequest, tap.mac, tap.Addr(false), make(net.HardwareAddr, 6), addr("10.20.0.1"))))
	harness.Eventually(t, 10*time.Second, "the tap guest's own ARP claim", func() error {
		if nb := neighbours(t, n, tap.HostIf()); !strings.Contains(nb, tap.Addr(false).String()+" lladdr "+tap.mac.String()) {
			return fmt.Errorf("neighbours of %s: %s", tap.HostIf(), nb)
		}
		return nil
	})
	if got := claimed(); len(got) > 0 {
		t.Fatalf("spoofed ARP or neighbour discovery entered the node's neighbour table: %v", got)
	}
	// Without galactic's tables the same frames do enter it, so the test
	// shows what the filter stops.
	if err := n.Do(filter.New().Delete); err != nil {
		t.Fatal(err)
	}
	// No pings here: the veth's own traffic would put its real MAC back.
	seen := map[string]bool{}
	harness.Eventually(t, 10*time.Second, "the unfiltered claims take effect", func() error {
		send(false)
		for _, c := range claimed() {
			seen[c] = true
		}
		if len(seen) < 5 {
			return fmt.Errorf("only %v", seen)
		}
		return nil
	})
}
