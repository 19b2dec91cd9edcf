package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netlink library sends an IPv4-mapped IPv6 address as four bytes
// (net.IP.To4 succeeds on it), which the kernel reads as an IPv4 gateway
// and refuses on an IPv6 route. These two requests carry the full 16 bytes.

// replaceMappedRoute installs `dst via gw dev ifindex onlink table proto`
// for an IPv6 dst whose gateway is an IPv4-mapped address, replacing any
// route to dst in that table; without replace it fails with EEXIST when
// the table has one.
func replaceMappedRoute(dst netip.Prefix, gw netip.Addr, ifindex, table int, replace bool) error {
	if !dst.Addr().Is6() || !gw.Is4In6() {
		return fmt.Errorf("mapped route %s via %s: want an IPv6 prefix and an IPv4-mapped gateway", dst, gw)
	}
	flags := unix.NLM_F_CREATE | unix.NLM_F_EXCL | unix.NLM_F_ACK
	if replace {
		flags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE | unix.NLM_F_ACK
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWROUTE, flags)
	msg := nl.NewRtMsg()
	msg.Family = unix.AF_INET6
	msg.Dst_len = uint8(dst.Bits())
	msg.Protocol = Protocol
	msg.Flags = unix.RTNH_F_ONLINK
	// The header's table is eight bits; RTA_TABLE carries the full one.
	msg.Table = unix.RT_TABLE_UNSPEC
	if table < 256 {
		msg.Table = uint8(table)
	}
	req.AddData(msg)
	d := dst.Masked().Addr().As16()
	g := gw.As16()
	req.AddData(nl.NewRtAttr(unix.RTA_DST, d[:]))
	req.AddData(nl.NewRtAttr(unix.RTA_GATEWAY, g[:]))
	req.AddData(nl.NewRtAttr(unix.RTA_OIF, nl.Uint32Attr(uint32(ifindex))))
	req.AddData(nl.NewRtAttr(unix.RTA_TABLE, nl.Uint32Attr(uint32(table))))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("installing %s via %s onlink table %d: %w", dst, gw, table, err)
	}
	return nil
}

// setMappedNeigh makes addr (IPv4-mapped) a permanent IPv6 neighbour of
// the device with mac; with mac nil it removes that neighbour.
func setMappedNeigh(dev *Device, addr netip.Addr, mac net.HardwareAddr) error {
	if !addr.Is4In6() {
		return fmt.Errorf("neighbour %s: not an IPv4-mapped address", addr)
	}
	proto, flags := unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK
	if mac == nil {
		proto, flags = unix.RTM_DELNEIGH, unix.NLM_F_ACK
	}
	req := nl.NewNetlinkRequest(proto, flags)
	req.AddData(&netlink.Ndmsg{Family: unix.AF_INET6, Index: uint32(dev.Index), State: netlink.NUD_PERMANENT})
	a := addr.As16()
	req.AddData(nl.NewRtAttr(netlink.NDA_DST, a[:]))
	if mac != nil {
		req.AddData(nl.NewRtAttr(netlink.NDA_LLADDR, []byte(mac)))
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		if mac == nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("removing neighbour %s dev %s: %w", addr, dev.Name, err)
		}
		return fmt.Errorf("neighbour %s lladdr %s dev %s: %w", addr, mac, dev.Name, err)
	}
	return nil
}
