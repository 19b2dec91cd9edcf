package guest

import (
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/packet"
)

// dialFrom tries a TCP connection from inside c.
func dialFrom(c ns.NetNS, addr string) error {
	return c.Do(func(ns.NetNS) error {
		conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// sendFrame sends a raw frame out of c's eth0.
func sendFrame(c ns.NetNS, frame []byte) error {
	return c.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		copy(to.Addr[:], frame[:6])
		return unix.Sendto(fd, frame, 0, to)
	})
}

func TestInAVRFAWorkloadSendsOnlyAsItselfAndReachesNoNodeSocket(t *testing.T) {
	n := newNode(t)
	c1, c2 := newNetns(t), newNetns(t)
	n.network(t, "blue-1", stanza("blue", "web-1", names.ModeVeth, "10.20.0.5/24"))
	n.network(t, "blue-2", stanza("blue", "web-2", names.ModeVeth, "10.20.0.6/24"))
	n.cnitool(t, "add", "blue-1", c1)
	n.cnitool(t, "add", "blue-2", c2)
	// Sockets of the default VRF answer VRF traffic only with l3mdev_accept;
	// set it, so that only the filter stands between workload and socket.
	var ln net.Listener
	n.do(t, func() error {
		for _, k := range []string{"/proc/sys/net/ipv4/tcp_l3mdev_accept", "/proc/sys/net/ipv4/udp_l3mdev_accept"} {
			if err := os.WriteFile(k, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		var err error
		ln, err = net.Listen("tcp4", "0.0.0.0:7070")
		return err
	})
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := dialFrom(c1, "10.20.0.1:7070"); err == nil {
		t.Errorf("a workload in a VRF connected to the node's listener through its gateway")
	}
	if err := ping(c1, netip.MustParseAddr("10.20.0.1")); err != nil {
		t.Errorf("the workload should still ping its gateway: %v", err)
	}

	// blue-2 counts what reaches its UDP socket: a spoofed source first,
	// then the sender's own on the same path.
	var pc net.PacketConn
	if err := c2.Do(func(ns.NetNS) (err error) { pc, err = net.ListenPacket("udp4", "0.0.0.0:7072"); return err }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var hostMAC, ownMAC net.HardwareAddr
	hostMAC = n.hostLink(t, names.ModeVeth, "blue", "web-1").Attrs().HardwareAddr
	if err := c1.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			ownMAC = l.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"10.20.0.77", "10.20.0.5"} {
		p := packet.UDP(netip.MustParseAddr(src), netip.MustParseAddr("10.20.0.6"), 40000, 7072, []byte("from "+src))
		if err := sendFrame(c1, packet.Ethernet(hostMAC, ownMAC, packet.EtherTypeIPv4, p)); err != nil {
			t.Fatal(err)
		}
	}
	_ = pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 100)
	k, _, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatalf("the workload's own packet should reach blue-2: %v", err)
	}
	if got := string(buf[:k]); got != "from 10.20.0.5" {
		t.Errorf("blue-2 received %q first: a spoofed source went through the VRF", got)
	}

	// The same connection succeeds once galactic's table is gone: the
	// filter is what kept the workload out.
	n.do(t, filter.New().Delete)
	if err := dialFrom(c1, "10.20.0.1:7070"); err != nil {
		t.Errorf("without the filter the listener should be reachable (the test's control): %v", err)
	}
}
