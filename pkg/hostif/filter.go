package hostif

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/state"
)

// FilterAttachment is the packet filter's view of one attachment: the
// workload may send from its addresses (host prefixes) and its allowed
// source prefixes, ping its gateways, and, on a veth, only with the
// container end's MAC.
func FilterAttachment(hostIf string, addrs, allowed []netip.Prefix, mac net.HardwareAddr) filter.Attachment {
	a := filter.Attachment{Interface: hostIf, Gateways: Gateways(addrs), MAC: mac}
	for _, p := range addrs {
		a.Sources = append(a.Sources, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	a.Sources = append(a.Sources, allowed...)
	return a
}

func (s Spec) filterAttachment(mac net.HardwareAddr) filter.Attachment {
	return FilterAttachment(s.HostInterface(), s.Addresses, s.AllowedSourcePrefixes, mac)
}

// RecordFilter is the packet filter's view of a node record.
func RecordFilter(r state.Record) filter.Attachment {
	var addrs, allowed []netip.Prefix
	for _, s := range r.Addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			addrs = append(addrs, p)
		}
	}
	for _, s := range r.AllowedSourcePrefixes {
		if p, err := netip.ParsePrefix(s); err == nil {
			allowed = append(allowed, p)
		}
	}
	mac, _ := net.ParseMAC(r.SandboxMAC)
	return FilterAttachment(recordInterface(r), addrs, allowed, mac)
}

// recordedFilters are the filter views of the node's records of the host
// interface hostIf. Callers hold the node lock.
func (h Host) recordedFilters(hostIf string) []filter.Attachment {
	recs, _ := h.Store().List()
	return filtersOf(recs, hostIf)
}

// filtersOf is recordedFilters among recs.
func filtersOf(recs []state.Record, hostIf string) []filter.Attachment {
	var out []filter.Attachment
	for _, r := range recs {
		if recordInterface(r) == hostIf {
			out = append(out, RecordFilter(r))
		}
	}
	return out
}

// hostSysctls keep a host interface from taking configuration from its
// workload: a guest's router advertisement or redirect changes no route
// or address of the node. They are set before the interface comes up.
var hostSysctls = []struct{ dir, key string }{
	{"/proc/sys/net/ipv6/conf", "accept_ra"},
	{"/proc/sys/net/ipv6/conf", "accept_redirects"},
	{"/proc/sys/net/ipv4/conf", "accept_redirects"},
}

func setHostSysctls(name string) error {
	for _, s := range hostSysctls {
		err := os.WriteFile(filepath.Join(s.dir, name, s.key), []byte("0"), 0o644)
		// No IPv6 conf dir: IPv6 is disabled on the node, so nothing to refuse.
		if err != nil && !(errors.Is(err, os.ErrNotExist) && s.dir == "/proc/sys/net/ipv6/conf") {
			return err
		}
	}
	return nil
}
