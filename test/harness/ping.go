package harness

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

var errUnreachable = errors.New("destination unreachable")

// Ping sends ICMP echo requests from inside the namespace to addr until
// one is answered, giving up after a few attempts or at the first
// "destination unreachable" about them (the error then says so). It needs
// no ping binary.
func (n *Netns) Ping(addr netip.Addr) error {
	return n.Do(func() error {
		e := echo4
		if addr.Is6() {
			e = echo6
		}
		// Not connected: an unreachable comes from a router, not from addr.
		conn, err := net.ListenPacket(e.network, "")
		if err != nil {
			return err
		}
		defer conn.Close()
		c := conn.(*net.IPConn)
		id := uint16(os.Getpid())
		var last error
		for seq := uint16(1); seq <= 5; seq++ {
			msg := []byte{e.request, 0, 0, 0, 0, 0, 0, 0, 'g', 'a', 'l', 'a', 'c', 't', 'i', 'c'}
			binary.BigEndian.PutUint16(msg[4:], id)
			binary.BigEndian.PutUint16(msg[6:], seq)
			if addr.Is4() {
				// The kernel fills in the ICMPv6 checksum, not the ICMP one.
				binary.BigEndian.PutUint16(msg[2:], checksum(msg))
			}
			if _, err := c.WriteTo(msg, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
				return err
			}
			last = e.await(c, addr, id, seq)
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

// await reads replies until the echo reply of (id, seq) from addr or an
// unreachable about one of our requests. ReadFrom strips the IPv4 header.
func (e echoKind) await(c *net.IPConn, addr netip.Addr, id, seq uint16) error {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
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
		if b[0] == e.reply && src.Unmap() == addr && binary.BigEndian.Uint16(b[4:]) == id && binary.BigEndian.Uint16(b[6:]) == seq {
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

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = (sum & 0xffff) + sum>>16
	}
	return ^uint16(sum)
}
