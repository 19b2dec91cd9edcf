package harness

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/galactic-cni/galactic/test/packet"
)

var errUnreachable = errors.New("destination unreachable")

// Ping sends ICMP echo requests from inside the namespace to addr until
// one is answered, giving up after a few attempts or at the first
// "destination unreachable" about them (the error then says so). It needs
// no ping binary.
func (n *Netns) Ping(addr netip.Addr) error {
	return n.Do(func() error {
		e, c, err := echoSocket(addr)
		if err != nil {
			return err
		}
		defer c.Close()
		id := uint16(os.Getpid())
		var last error
		for seq := uint16(1); seq <= 5; seq++ {
			if _, err := c.WriteTo(e.echoRequest(addr, id, seq), &net.IPAddr{IP: addr.AsSlice()}); err != nil {
				return err
			}
			last = e.await(c, addr, id, seq, seq, time.Second)
			if last == nil {
				return nil
			}
			if errors.Is(last, errUnreachable) {
				break
			}
		}
		return fmt.Errorf("ping %s: %w", addr, last)
	})
}

// PingUntil sends an ICMP echo request to addr every interval until one
// is answered, and fails once deadline passes. Send errors and
// unreachables (a host that is not up yet) do not end it: it is for
// timing when a host starts to answer.
func (n *Netns) PingUntil(addr netip.Addr, interval time.Duration, deadline time.Time) error {
	return n.Do(func() error {
		e, c, err := echoSocket(addr)
		if err != nil {
			return err
		}
		defer c.Close()
		id := uint16(os.Getpid())
		var last error
		for seq := uint16(1); time.Now().Before(deadline); seq++ {
			next := time.Now().Add(interval)
			if _, last = c.WriteTo(e.echoRequest(addr, id, seq), &net.IPAddr{IP: addr.AsSlice()}); last == nil {
				// A late reply to an earlier request counts: the host answers.
				if last = e.await(c, addr, id, 1, seq, interval); last == nil {
					return nil
				}
			}
			time.Sleep(time.Until(next))
		}
		return fmt.Errorf("ping %s: no reply by the deadline: %v", addr, last)
	})
}

// echoRequest is an ICMP or ICMPv6 echo request.
func (e echoKind) echoRequest(addr netip.Addr, id, seq uint16) []byte {
	msg := []byte{e.request, 0, 0, 0, 0, 0, 0, 0, 'g', 'a', 'l', 'a', 'c', 't', 'i', 'c'}
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	if addr.Is4() {
		// The kernel fills in the ICMPv6 checksum, not the ICMP one.
		binary.BigEndian.PutUint16(msg[2:], packet.Checksum(msg))
	}
	return msg
}

// echoSocket opens an ICMP socket for addr's family in the current
// namespace. It is not connected: an unreachable comes from a router, not
// from addr.
func echoSocket(addr netip.Addr) (echoKind, *net.IPConn, error) {
	e := echo4
	if addr.Is6() {
		e = echo6
	}
	conn, err := net.ListenPacket(e.network, "")
	if err != nil {
		return e, nil, err
	}
	return e, conn.(*net.IPConn), nil
}

type echoKind struct {
	network                     string
	request, reply, unreachable byte
	// innerHeader is the length of the IP header an unreachable quotes;
	// 0 means it is read from the IPv4 header itself.
	innerHeader int
}

var (
	echo4 = echoKind{network: "ip4:icmp", request: 8, reply: 0, unreachable: 3}
	echo6 = echoKind{network: "ip6:ipv6-icmp", request: 128, reply: 129, unreachable: 1, innerHeader: 40}
)

// await reads replies until an echo reply from addr to (id, minSeq..seq)
// or an unreachable about one of our requests. ReadFrom strips the IPv4
// header.
func (e echoKind) await(c *net.IPConn, addr netip.Addr, id, minSeq, seq uint16, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		b := buf[:n]
		if len(b) < 8 {
			continue
		}
		src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if n := binary.BigEndian.Uint16(b[6:]); b[0] == e.reply && src.Unmap() == addr && binary.BigEndian.Uint16(b[4:]) == id && n >= minSeq && n <= seq {
			return nil
		}
		if b[0] == e.unreachable && e.quotesOurs(b[8:], id) {
			return fmt.Errorf("%w (from %s)", errUnreachable, src.Unmap())
		}
	}
}

// quotesOurs reports whether the packet an ICMP error quotes is one of our
// echo requests.
func (e echoKind) quotesOurs(inner []byte, id uint16) bool {
	hdr := e.innerHeader
	if hdr == 0 && len(inner) > 0 {
		hdr = int(inner[0]&0x0f) * 4
	}
	return len(inner) >= hdr+8 && inner[hdr] == e.request && binary.BigEndian.Uint16(inner[hdr+4:]) == id
}
