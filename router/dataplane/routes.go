package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Route is what the router reads of a kernel route. The netlink library's
// route is a large struct with allocations of its own for every address;
// at 100,000 routes a read of every table made hundreds of megabytes of
// garbage, so routes are parsed straight into these few words.
type Route struct {
	// Prefix is the destination, not valid for a route without one.
	Prefix    netip.Prefix
	Gw        netip.Addr
	LinkIndex int
	Table     int
	Protocol  int
	Flags     int
}

// Onlink says whether the route carries the onlink flag.
func (r Route) Onlink() bool { return r.Flags&unix.RTNH_F_ONLINK != 0 }

// dumpRoutes reads the routes of each of tables (every table for 0) over
// one socket whose dumps the kernel filters by table (strict checking),
// calling each for every route. A dump the kernel interrupted (a table
// changed meanwhile) is started again, up to dumpAttempts times; the last
// one is kept.
func dumpRoutes(tables []int, each func(Route)) (n int, err error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if err := unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		return 0, fmt.Errorf("strict netlink dumps: %w", err)
	}
	sockets := map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	var got []Route
	for _, t := range tables {
		for attempt := 1; ; attempt++ {
			req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
			req.Sockets = sockets
			// In a strict dump every header field that is set filters.
			msg := &nl.RtMsg{RtMsg: unix.RtMsg{Family: unix.AF_UNSPEC}}
			if t > 0 && t < 256 {
				msg.Table = uint8(t)
			}
			req.AddData(msg)
			if t > 0 {
				req.AddData(nl.NewRtAttr(unix.RTA_TABLE, nl.Uint32Attr(uint32(t))))
			}
			got = got[:0]
			err = req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWROUTE, func(m []byte) bool {
				if r, ok := parseRoute(m); ok {
					got = append(got, r)
				}
				return true
			})
			if errors.Is(err, nl.ErrDumpInterrupted) && attempt < dumpAttempts {
				continue
			}
			if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
				return n, fmt.Errorf("listing table %d: %w", t, err)
			}
			break
		}
		for _, r := range got {
			each(r)
		}
		n += len(got)
	}
	return n, nil
}

// parseRoute reads an RTM_NEWROUTE message's payload: the rtmsg header
// (family, lengths, tos, table, protocol, scope, type, flags) and the
// attributes the router uses.
func parseRoute(m []byte) (Route, bool) {
	const hdr = unix.SizeofRtMsg
	if len(m) < hdr {
		return Route{}, false
	}
	family, dstLen := m[0], int(m[1])
	r := Route{Table: int(m[4]), Protocol: int(m[5]), Flags: int(binary.NativeEndian.Uint32(m[8:12]))}
	for b := m[hdr:]; len(b) >= unix.SizeofRtAttr; {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4])
		if l < unix.SizeofRtAttr || l > len(b) {
			break
		}
		data := b[unix.SizeofRtAttr:l]
		switch typ {
		case unix.RTA_DST:
			if a, ok := addrOf(family, data); ok {
				r.Prefix = netip.PrefixFrom(a, dstLen)
			}
		case unix.RTA_GATEWAY:
			r.Gw, _ = addrOf(family, data)
		case unix.RTA_OIF:
			if len(data) == 4 {
				r.LinkIndex = int(binary.NativeEndian.Uint32(data))
			}
		case unix.RTA_TABLE:
			if len(data) == 4 {
				r.Table = int(binary.NativeEndian.Uint32(data))
			}
		}
		adv := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if adv > len(b) {
			break
		}
		b = b[adv:]
	}
	return r, true
}

func addrOf(family byte, data []byte) (netip.Addr, bool) {
	switch {
	case family == unix.AF_INET && len(data) == 4:
		return netip.AddrFrom4([4]byte(data)), true
	case family == unix.AF_INET6 && len(data) == 16:
		return netip.AddrFrom16([16]byte(data)), true
	}
	return netip.Addr{}, false
}
