// Package hostif does the host-side kernel work of an attachment: it puts a
// tap (VMs) or a veth (containers) into the VPC's routing domain with its
// gateway addresses and host routes, records it in the node's state dir,
// and undoes all of it. galactic-cni calls Setup, Teardown and Check; the
// node GC calls Teardown and RemoveInterface to reclaim what DEL missed.
//
// Every change runs under the node lock (state.Lock), so the set of records
// and host interfaces a decision reads cannot change under it: whether a
// replacement still uses a tap, or whether an attachment was the last of its
// VPC so the routing domain goes too.
package hostif

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/pkg/tap"
)

// Spec is one attachment of a container as ADD asks for it.
type Spec struct {
	Network     string
	ContainerID string
	IfName      string
	Netns       string
	VPC         string
	Attachment  string
	// Mode is names.ModeTap or names.ModeVeth; Routing is routing.KindVRF
	// or routing.KindTable.
	Mode    string
	Routing string
	// Addresses are the workload's addresses with their prefix length.
	Addresses []netip.Prefix
	// AllowedSourcePrefixes are sources the workload may use beyond its
	// addresses (a router or NAT appliance).
	AllowedSourcePrefixes []netip.Prefix
	// MTU of the host interface (and the container end); 0 keeps the
	// kernel's default.
	MTU int
	// Holder, HolderGeneration and LeaseSeconds describe the handoff lease
	// this ADD holds; empty without handoff.
	Holder           string
	HolderGeneration int64
	LeaseSeconds     int32
	// Standby builds the interface of a live-migration target without
	// its host routes (see Activate); WaitSeconds is recorded for its
	// promotion.
	Standby     bool
	WaitSeconds int32
	// Namespace, AttachmentName and AttachmentUID are an object-backed
	// attachment's VPCAttachment (VPC and Attachment are then its
	// data-plane names); VNI and Announce are recorded for galactic-bgp.
	Namespace      string
	AttachmentName string
	AttachmentUID  string
	VNI            int32
	Announce       string
	// ChainIfName is the CNI_IFNAME of the ADD when IfName is a pod's
	// further attachment (net1, ...): its container end gets routes to
	// its networks instead of default routes (Routes).
	ChainIfName string
}

// HostInterface is the spec's host-side interface name.
func (s Spec) HostInterface() string { return names.HostInterface(s.Mode, s.VPC, s.Attachment) }

// Alias is the ifalias of the spec's host interface.
func (s Spec) Alias() string { return names.AliasOf(s.VPC, s.Attachment, s.AttachmentUID) }

// secondary says whether the spec is a pod's further attachment.
func (s Spec) secondary() bool { return s.ChainIfName != "" && s.ChainIfName != s.IfName }

// recordAlias is the ifalias of a record's host interface.
func recordAlias(r state.Record) string { return names.AliasOf(r.VPC, r.Attachment, r.AttachmentUID) }

// Iface is an interface as the CNI result reports it.
type Iface struct {
	Name  string
	Index int
	MAC   string
}

// Attached is what Setup put in place.
type Attached struct {
	Record state.Record
	Host   Iface
	// Sandbox is the container end of a veth; nil for a tap.
	Sandbox *Iface
	Domain  routing.Domain
	// AdoptedTap is set when an existing tap of the attachment was reused.
	AdoptedTap bool
}

// BusyError says that another runtime holds the attachment's interface.
type BusyError struct {
	Interface string
	// Holders are PIDs with the tap open; Container is the live container
	// whose veth it is. Either may be empty.
	Holders   []int
	Container string
}

func (e *BusyError) Error() string {
	switch {
	case len(e.Holders) > 0:
		return fmt.Sprintf("another runtime holds interface %s (processes %v have it open); retry once it has let go", e.Interface, e.Holders)
	case e.Container != "":
		return fmt.Sprintf("another runtime holds interface %s (container %s, which is still running); retry once it has been deleted", e.Interface, e.Container)
	}
	return fmt.Sprintf("another runtime holds interface %s (it has carrier, so a process is attached); retry once it has let go", e.Interface)
}

// Host does the host-side work of one node.
type Host struct {
	StateDir string
	// Live reports whether a container's netns still exists (liveness.Netns).
	Live func(netns string) bool
	Now  func() time.Time
	// Filter is the node's packet filter; nil is the kernel's
	// (filter.New).
	Filter filter.Filter
}

// Store is the node record store.
func (h Host) Store() state.Store { return state.NewStore(h.StateDir) }

func (h Host) lock() (func(), error) {
	unlock, err := state.Lock(h.StateDir)
	if err != nil {
		return nil, fmt.Errorf("taking the node lock: %w", err)
	}
	return unlock, nil
}

// undo collects what a Setup created, to remove it again if a later step fails.
type undo []func() error

func (u *undo) push(f func() error) { *u = append(*u, f) }

func (u undo) run() error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		errs = append(errs, u[i]())
	}
	return errors.Join(errs...)
}

// Setup creates or adopts the spec's host interface in its VPC's routing
// domain and writes the node record. On error it removes only what this
// call created; the returned error is a *BusyError when another runtime
// holds the interface, and wraps routing.ErrNoVRF or
// routing.ErrKindMismatch when the routing the spec asks for cannot be had.
func (h Host) Setup(spec Spec) (att *Attached, err error) {
	unlock, err := h.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()

	var rollback undo
	defer func() {
		if err != nil {
			if rerr := rollback.run(); rerr != nil {
				err = fmt.Errorf("%w (rolling back: %v)", err, rerr)
			}
		}
	}()

	d, created, err := routing.Ensure(spec.VPC, spec.Routing)
	if err != nil {
		return nil, err
	}
	if created {
		rollback.push(func() error { return routing.Remove(spec.VPC) })
	}
	att = &Attached{Domain: *d}
	var own []netip.Addr
	for _, p := range spec.Addresses {
		own = append(own, p.Addr())
	}
	if err := d.ClaimAddresses(own); err != nil {
		return nil, err
	}

	// The filter's elements need no interface: they are written while it
	// is made, once it is this ADD's to make.
	var adding filter.Adding
	defer func() {
		if adding != nil {
			_ = adding.Wait() // Finish reported it, or the ADD failed first
		}
	}()
	startFilter := func(sandboxMAC net.HardwareAddr, adopted bool) {
		name := spec.HostInterface()
		adding = h.filter().StartAdd(spec.filterAttachment(sandboxMAC), h.recordedFilters(name)...)
		if !adopted {
			rollback.push(func() error {
				_ = adding.Wait()
				return h.filter().Remove(name)
			})
		}
	}
	var link netlink.Link
	switch spec.Mode {
	case names.ModeTap:
		link, att.AdoptedTap, err = h.setupTap(spec, &rollback, startFilter)
	case names.ModeVeth:
		link, att.Sandbox, err = h.setupVeth(spec, &rollback, startFilter)
	default:
		err = fmt.Errorf("unknown mode %q", spec.Mode)
	}
	if err != nil {
		return nil, err
	}
	att.Host = Iface{Name: link.Attrs().Name, Index: link.Attrs().Index, MAC: link.Attrs().HardwareAddr.String()}
	adding.Attach(att.Host.Index)

	if err := d.AddInterface(link); err != nil {
		return nil, err
	}
	if !att.AdoptedTap {
		rollback.push(func() error { return d.RemoveInterface(link.Attrs().Name) })
	}
	if !att.AdoptedTap {
		rollback.push(func() error { return d.RemoveGateways(link.Attrs().Index) })
	}
	for _, gw := range Gateways(spec.Addresses) {
		if err := addHostAddress(link, gw); err != nil {
			return nil, err
		}
		if err := d.AddGateway(link, gw); err != nil {
			return nil, err
		}
	}
	for _, p := range spec.Addresses {
		if spec.Standby {
			break
		}
		if err := d.AddHostRoute(link, p.Addr()); err != nil {
			return nil, err
		}
		if !att.AdoptedTap {
			addr := p.Addr()
			rollback.push(func() error { return d.RemoveHostRoute(addr) })
		}
	}
	if spec.Mode == names.ModeVeth {
		mac, _ := net.ParseMAC(att.Sandbox.MAC)
		for _, p := range spec.Addresses {
			n := &netlink.Neigh{LinkIndex: link.Attrs().Index, IP: p.Addr().AsSlice(), HardwareAddr: mac, State: netlink.NUD_PERMANENT, Family: family(p.Addr())}
			if err := netlink.NeighSet(n); err != nil {
				return nil, fmt.Errorf("adding neighbour %s lladdr %s dev %s: %w", p.Addr(), mac, link.Attrs().Name, err)
			}
		}
	}

	if err := adding.Finish(att.Host.Index); err != nil {
		return nil, fmt.Errorf("adding %s to the packet filter: %w", att.Host.Name, err)
	}
	var sandboxMAC net.HardwareAddr
	if att.Sandbox != nil {
		sandboxMAC, _ = net.ParseMAC(att.Sandbox.MAC)
	}

	att.Record = state.Record{
		Network: spec.Network, ContainerID: spec.ContainerID, IfName: spec.IfName, Netns: spec.Netns,
		VPC: spec.VPC, Attachment: spec.Attachment, Mode: spec.Mode, Routing: spec.Routing,
		HostInterface: att.Host.Name, HostIfIndex: att.Host.Index, Table: d.Table,
		Addresses: prefixStrings(spec.Addresses), AllowedSourcePrefixes: prefixStrings(spec.AllowedSourcePrefixes),
		SandboxMAC: sandboxMAC.String(),
		Holder:     spec.Holder, HolderGeneration: spec.HolderGeneration, LeaseSeconds: spec.LeaseSeconds,
		Standby: spec.Standby, WaitSeconds: spec.WaitSeconds,
		Namespace: spec.Namespace, AttachmentName: spec.AttachmentName, AttachmentUID: spec.AttachmentUID,
		VNI: spec.VNI, Announce: spec.Announce,
		Created: h.now(),
	}
	if spec.secondary() {
		att.Record.ChainIfName = spec.ChainIfName
	}
	if err := h.Store().Put(att.Record); err != nil {
		return nil, fmt.Errorf("writing the node record: %w", err)
	}
	return att, nil
}

func (h Host) now() time.Time {
	if h.Now == nil {
		return time.Now()
	}
	return h.Now()
}

func (h Host) live(netns string) bool { return h.Live != nil && h.Live(netns) }

func (h Host) filter() filter.Filter {
	if h.Filter == nil {
		return filter.New()
	}
	return h.Filter
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func linkByName(name string) (netlink.Link, error) {
	l, err := netlinksafe.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, nil
	}
	return l, err
}

// linkGone tells a deletion that found the device already gone: a veth
// whose container's namespace was just deleted goes in the kernel's own
// time, between the lookup and the deletion (ENODEV).
func linkGone(err error) bool {
	return errors.As(err, &netlink.LinkNotFoundError{}) || errors.Is(err, unix.ENODEV)
}

// ours checks that an existing device is the attachment's host interface
// (alias) and not someone else's device that happens to have the name.
func ours(l netlink.Link, alias, kind string) error {
	if l.Type() != kind || l.Attrs().Alias != alias {
		return fmt.Errorf("device %s exists but is not the %s of attachment %s (type %s, alias %q); remove it or rename the attachment",
			l.Attrs().Name, kind, strings.TrimPrefix(alias, "galactic:"), l.Type(), l.Attrs().Alias)
	}
	return nil
}

// kinship says how an existing device of the spec's name relates to the
// spec's attachment: its own (same alias), adoptable (the inline alias of
// the same names, for an object-backed spec: an adopted attachment's
// interface), or a predecessor's (a galactic alias of the same names with
// another identity), which is never reattached.
type kinship int

const (
	foreign kinship = iota
	own
	adoptable
	predecessor
)

func (s Spec) kinship(l netlink.Link, kind string) kinship {
	alias := l.Attrs().Alias
	if l.Type() != kind {
		return foreign
	}
	if alias == s.Alias() {
		return own
	}
	vpc, att, _, ok := names.ParseAliasUID(alias)
	switch {
	case !ok || vpc != s.VPC || att != s.Attachment:
		return foreign
	case s.AttachmentUID != "" && alias == names.Alias(s.VPC, s.Attachment):
		return adoptable
	}
	return predecessor
}

// setupTap and setupVeth call startFilter once the interface is theirs
// to create or adopt, before they make it.
func (h Host) setupTap(spec Spec, rollback *undo, startFilter func(sandboxMAC net.HardwareAddr, adopted bool)) (netlink.Link, bool, error) {
	name := spec.HostInterface()
	l, err := linkByName(name)
	if err != nil {
		return nil, false, err
	}
	if l != nil {
		kin := spec.kinship(l, "tuntap")
		if kin == foreign {
			return nil, false, ours(l, spec.Alias(), "tuntap")
		}
		st, err := tap.InspectLink(l)
		if err != nil {
			return nil, false, fmt.Errorf("inspecting tap %s: %w", name, err)
		}
		if st.Held() {
			return nil, false, &BusyError{Interface: name, Holders: st.Holders}
		}
		if kin == predecessor {
			// Another identity's tap that no VMM holds: removed, never
			// reattached; this attachment gets a tap of its own.
			if err := h.replacePredecessor(l, spec); err != nil {
				return nil, false, err
			}
			l = nil
		}
	}
	if l != nil {
		startFilter(nil, true)
		if err := configureLink(l, spec); err != nil {
			return nil, false, err
		}
		return l, true, nil
	}
	startFilter(nil, false)
	t := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: name},
		Mode:      netlink.TUNTAP_MODE_TAP,
		// EXCL makes a concurrent creator fail instead of sharing the tap.
		Flags: netlink.TUNTAP_NO_PI | netlink.TuntapFlag(unix.IFF_TUN_EXCL),
	}
	if err := netlink.LinkAdd(t); err != nil {
		return nil, false, fmt.Errorf("creating tap %s: %w", name, err)
	}
	rollback.push(func() error { return deleteLink(name) })
	if l, err = netlinksafe.LinkByName(name); err != nil {
		return nil, false, err
	}
	if err := configureLink(l, spec); err != nil {
		return nil, false, err
	}
	return l, false, nil
}

// replacePredecessor removes a host interface of the spec's name that a
// predecessor (another UID) left, unless a live record still uses it.
// Callers hold the node lock.
func (h Host) replacePredecessor(l netlink.Link, spec Spec) error {
	name := l.Attrs().Name
	other, err := h.liveHolder(name, spec.ContainerID, spec.IfName)
	if err != nil {
		return err
	}
	if other != nil {
		return &BusyError{Interface: name, Container: other.ContainerID}
	}
	vpc, _, _, _ := names.ParseAliasUID(l.Attrs().Alias)
	return h.removeInterface(name, vpc, l.Attrs().Alias, nil, h.recordedFilters(name), nil)
}

// configureLink sets the alias and MTU and brings the host interface up.
func configureLink(l netlink.Link, spec Spec) error {
	name := l.Attrs().Name
	if err := netlink.LinkSetAlias(l, spec.Alias()); err != nil {
		return fmt.Errorf("setting the alias of %s: %w", name, err)
	}
	if spec.MTU != 0 && l.Attrs().MTU != spec.MTU {
		if err := netlink.LinkSetMTU(l, spec.MTU); err != nil {
			return fmt.Errorf("setting MTU %d on %s: %w", spec.MTU, name, err)
		}
	}
	if mac := names.TapMAC(spec.VPC, spec.Attachment); spec.Mode == names.ModeTap && l.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("setting MAC %s on %s: %w", mac, name, err)
		}
	}
	if err := setHostSysctls(name); err != nil {
		return fmt.Errorf("refusing router advertisements and redirects on %s: %w", name, err)
	}
	// A VM that configures its address with the subnet's prefix ARPs for
	// its neighbours directly; the host answers for those its VPC routes.
	if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", name, "proxy_arp"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enabling proxy ARP on %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bringing %s up: %w", name, err)
	}
	return nil
}

// randomMAC is a random unicast, locally administered MAC address.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, fmt.Errorf("choosing a MAC address: %w", err)
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}

func deleteLink(name string) error {
	l, err := linkByName(name)
	if err != nil || l == nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !linkGone(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// liveHolder returns another live record that uses the host interface
// called hostIf: a replacement of the same attachment in the same mode.
func (h Host) liveHolder(hostIf, containerID, ifName string) (*state.Record, error) {
	recs, err := h.Store().List()
	if r := h.liveHolderIn(recs, hostIf, containerID, ifName); r != nil {
		return r, nil
	}
	return nil, err
}

// liveHolderIn is liveHolder among recs.
func (h Host) liveHolderIn(recs []state.Record, hostIf, containerID, ifName string) *state.Record {
	for _, r := range recs {
		if recordInterface(r) == hostIf && (r.ContainerID != containerID || r.IfName != ifName) && h.live(r.Netns) {
			return &r
		}
	}
	return nil
}

// recordInterface is the host interface a record describes.
func recordInterface(r state.Record) string {
	if r.HostInterface != "" {
		return r.HostInterface
	}
	return names.HostInterface(r.Mode, r.VPC, r.Attachment)
}

// halfMade reports whether l is the pair an earlier ADD of this very
// container created and did not live to name: a veth without an alias
// (the kernel takes none at creation, so the alias comes a step later)
// whose peer is spec.IfName in spec.Netns. A killed ADD leaves one, and
// the runtime's retry replaces it.
func halfMade(l netlink.Link, spec Spec) bool {
	if l.Type() != "veth" || l.Attrs().Alias != "" {
		return false
	}
	netns, err := ns.GetNS(spec.Netns)
	if err != nil {
		return false
	}
	defer netns.Close()
	peered := false
	_ = netns.Do(func(ns.NetNS) error {
		p, err := netlinksafe.LinkByName(spec.IfName)
		peered = err == nil && p.Type() == "veth" && p.Attrs().ParentIndex == l.Attrs().Index && l.Attrs().ParentIndex == p.Attrs().Index
		return nil
	})
	return peered
}

func (h Host) setupVeth(spec Spec, rollback *undo, startFilter func(sandboxMAC net.HardwareAddr, adopted bool)) (netlink.Link, *Iface, error) {
	name := spec.HostInterface()
	old, err := linkByName(name)
	if err != nil {
		return nil, nil, err
	}
	if old != nil {
		if spec.kinship(old, "veth") == foreign && !halfMade(old, spec) {
			return nil, nil, ours(old, spec.Alias(), "veth")
		}
		other, err := h.liveHolder(name, spec.ContainerID, spec.IfName)
		if err != nil {
			return nil, nil, err
		}
		if other != nil {
			return nil, nil, &BusyError{Interface: name, Container: other.ContainerID}
		}
		// A predecessor whose DEL never ran (of this identity or another),
		// or an earlier ADD of this container: its end is replaced by a
		// fresh pair.
		if err := deleteLink(name); err != nil {
			return nil, nil, err
		}
	}

	netns, err := ns.GetNS(spec.Netns)
	if err != nil {
		return nil, nil, fmt.Errorf("opening container netns %s: %w", spec.Netns, err)
	}
	defer netns.Close()
	if err := netns.Do(func(ns.NetNS) error {
		if l, _ := linkByName(spec.IfName); l != nil {
			return fmt.Errorf("container netns %s already has an interface %s", spec.Netns, spec.IfName)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}

	// The container end's MAC is chosen here, as the kernel would choose
	// it, so that the filter can bind it before the pair exists.
	mac, err := randomMAC()
	if err != nil {
		return nil, nil, err
	}
	startFilter(mac, false)
	v := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: name, MTU: spec.MTU},
		PeerName:         spec.IfName,
		PeerNamespace:    netlink.NsFd(int(netns.Fd())),
		PeerMTU:          uint32(spec.MTU),
		PeerHardwareAddr: mac,
	}
	if err := netlink.LinkAdd(v); err != nil {
		return nil, nil, fmt.Errorf("creating veth %s (peer %s in %s): %w", name, spec.IfName, spec.Netns, err)
	}
	// Deleting the host end takes the container end with it.
	rollback.push(func() error { return deleteLink(name) })
	host, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, nil, err
	}
	if err := configureLink(host, spec); err != nil {
		return nil, nil, err
	}

	var sandbox *Iface
	err = netns.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(spec.IfName)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing %s up in the container: %w", spec.IfName, err)
		}
		// No prefix route: the veth is point-to-point to the host, so even
		// neighbours in the workload's subnet are reached via the gateway,
		// which routes them in the VPC's table.
		for _, p := range spec.Addresses {
			a := &netlink.Addr{IPNet: routing.IPNet(p), Flags: unix.IFA_F_NOPREFIXROUTE}
			if p.Addr().Is6() {
				a.Flags |= unix.IFA_F_NODAD
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("adding %s to %s in the container: %w", p, spec.IfName, err)
			}
		}
		for _, def := range Routes(spec.Addresses, spec.secondary()) {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: routing.IPNet(def.Dst), Gw: def.Via.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("adding route %s via %s in the container: %w", def.Dst, def.Via, err)
			}
		}
		sandbox = &Iface{Name: spec.IfName, Index: l.Attrs().Index, MAC: l.Attrs().HardwareAddr.String()}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return host, sandbox, nil
}

// addHostAddress puts a gateway on the host interface as a /32 or /128:
// no prefix route (the domain's host routes do the routing) and no DAD (a
// tap has no carrier until its VMM attaches).
func addHostAddress(l netlink.Link, gw netip.Addr) error {
	a := &netlink.Addr{IPNet: routing.IPNet(routing.HostPrefix(gw)), Flags: unix.IFA_F_NOPREFIXROUTE}
	if gw.Is6() {
		a.Flags |= unix.IFA_F_NODAD
	}
	if err := netlink.AddrReplace(l, a); err != nil {
		return fmt.Errorf("adding gateway %s to %s: %w", gw, l.Attrs().Name, err)
	}
	return nil
}

// Teardown undoes a record: it removes the host interface (a veth takes
// its container end along), its rules and host routes, the record, and
// the VPC's routing domain when this was its last attachment on the node.
// The host interface is kept when another live record uses it: a
// replacement of the same attachment whose ADD ran first. What is already
// gone is not an error.
func (h Host) Teardown(rec state.Record) error { return h.TeardownThen(rec, nil) }

// TeardownThen is Teardown calling stopped once, under the node lock, as
// soon as the host interface carries no more packets: it is down and no
// route leads to it, but the kernel has yet to delete it, which is most
// of a teardown's time. stopped is called at the end instead when there
// was no interface to stop, or stopping it failed. A successor on this
// node takes the node lock before it attaches, so it never meets the
// interface stopped leaves behind. stopped must not block.
func (h Host) TeardownThen(rec state.Record, stopped func()) error {
	if stopped == nil {
		stopped = func() {}
	}
	stopped = sync.OnceFunc(stopped)
	unlock, err := h.lock()
	if err != nil {
		stopped()
		return err
	}
	defer unlock()
	defer stopped()

	// The records are read once: under the node lock only this call
	// changes them, and a node of many workloads takes milliseconds a
	// read.
	recs, listErr := h.Store().List()
	var errs []error
	name := recordInterface(rec)
	other := h.liveHolderIn(recs, name, rec.ContainerID, rec.IfName)
	if other == nil && listErr != nil {
		errs = append(errs, listErr)
	}
	if other == nil && listErr == nil {
		known := append(filtersOf(recs, name), RecordFilter(rec))
		errs = append(errs, h.removeInterface(name, rec.VPC, recordAlias(rec), parseAddrs(rec.Addresses), known, stopped))
	}
	if err := h.Store().Delete(rec.ContainerID, rec.IfName); err != nil {
		errs = append(errs, fmt.Errorf("deleting the node record: %w", err))
	} else {
		recs = slices.DeleteFunc(recs, func(r state.Record) bool { return r.ContainerID == rec.ContainerID && r.IfName == rec.IfName })
	}
	errs = append(errs, h.removeDomainIfUnusedIn(rec.VPC, recs, listErr))
	return errors.Join(errs...)
}

// RemoveInterface removes a galactic host interface that no record
// describes (a leaked tap), with its rules and host routes, and the routing
// domain if nothing else of its VPC is left. A tap a process holds is not
// removed: the error is a *BusyError. A missing interface is not an error.
func (h Host) RemoveInterface(name string) error {
	unlock, err := h.lock()
	if err != nil {
		return err
	}
	defer unlock()
	l, err := linkByName(name)
	if err != nil || l == nil {
		return err
	}
	vpc, _, ok := names.ParseAlias(l.Attrs().Alias)
	if !ok {
		return fmt.Errorf("%s has no galactic alias (%q); not removing it", name, l.Attrs().Alias)
	}
	if _, isTap := l.(*netlink.Tuntap); isTap {
		st, err := tap.InspectLink(l)
		if err != nil {
			return err
		}
		if st.Held() {
			return &BusyError{Interface: name, Holders: st.Holders}
		}
	}
	return errors.Join(h.removeInterface(name, vpc, l.Attrs().Alias, nil, nil, nil), h.removeDomainIfUnused(vpc))
}

// removeInterface deletes the host interface of vpc whose ifalias is
// alias, the rules and host routes that lead to it (those of addrs and
// those the domain's table routes to it) and its packet filter elements
// (known: what the records say they are). A device of the name with
// another alias is not removed. stopped, if set, is called once the
// interface is down and unrouted, before it is deleted.
func (h Host) removeInterface(name, vpc, alias string, addrs []netip.Addr, known []filter.Attachment, stopped func()) error {
	d, err := routing.Find(vpc)
	if err != nil {
		return err
	}
	l, err := linkByName(name)
	if err != nil {
		return err
	}
	if l != nil && l.Attrs().Alias != alias {
		v, a, _ := names.ParseAlias(alias)
		if hv, ha, ok := names.ParseAlias(l.Attrs().Alias); ok && hv == v && ha == a {
			// Another identity's interface of the same names (a successor
			// replaced a predecessor's): nothing of this one is left.
			return nil
		}
		return fmt.Errorf("%s belongs to %q, not to %q; not removing it", name, l.Attrs().Alias, alias)
	}
	// Deleting the interface is most of a DEL; the filter's elements go
	// meanwhile.
	filtered := h.filter().StartRemove(name, known...)
	var errs []error
	if l != nil {
		if d != nil {
			routed, err := routedAddrs(d.Table, l.Attrs().Index)
			errs = append(errs, err)
			addrs = append(addrs, routed...)
			// The kernel would drop them with the interface; removing
			// them first leaves nothing to chance.
			errs = append(errs, d.RemoveGateways(l.Attrs().Index))
		}
		if stopped != nil {
			// Setting a link down takes the kernel a fraction of
			// deleting it.
			if err := netlink.LinkSetDown(l); err == nil || linkGone(err) {
				stopped()
			}
		}
		if err := netlink.LinkDel(l); err != nil && !linkGone(err) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", name, err))
		}
	}
	errs = append(errs, filtered())
	if d != nil {
		errs = append(errs, d.RemoveInterface(name))
		slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
		for _, a := range slices.Compact(addrs) {
			errs = append(errs, d.RemoveHostRoute(a))
		}
	}
	return errors.Join(errs...)
}

// routedAddrs are the host routes a table has to an interface; its
// gateways' local routes are not among them.
func routedAddrs(table, linkIndex int) ([]netip.Addr, error) {
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table, LinkIndex: linkIndex}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil {
		return nil, fmt.Errorf("listing table %d: %w", table, err)
	}
	var addrs []netip.Addr
	for _, r := range routes {
		if r.Dst == nil || r.Type != unix.RTN_UNICAST {
			continue
		}
		if ones, bits := r.Dst.Mask.Size(); ones == bits {
			if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
				addrs = append(addrs, a.Unmap())
			}
		}
	}
	return addrs, nil
}

func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// removeDomainIfUnused removes the VPC's domain when neither a record nor a
// host interface of the VPC is left on the node.
func (h Host) removeDomainIfUnused(vpc string) error {
	recs, err := h.Store().List()
	return h.removeDomainIfUnusedIn(vpc, recs, err)
}

// removeDomainIfUnusedIn is removeDomainIfUnused with the node's records
// already read: recs, and err when reading some of them failed.
func (h Host) removeDomainIfUnusedIn(vpc string, recs []state.Record, err error) error {
	if err != nil {
		return fmt.Errorf("keeping VPC %s's routing domain: cannot read every record: %w", vpc, err)
	}
	for _, r := range recs {
		if r.VPC == vpc {
			return nil
		}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		if v, _, ok := names.ParseAlias(l.Attrs().Alias); ok && v == vpc {
			return nil
		}
	}
	return routing.Remove(vpc)
}

// Check reports what differs between the kernel and what Setup would have
// put in place for spec; nil when nothing does.
func (h Host) Check(spec Spec) error {
	name := spec.HostInterface()
	l, err := linkByName(name)
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("host interface %s does not exist", name)
	}
	kind := map[string]string{names.ModeTap: "tuntap", names.ModeVeth: "veth"}[spec.Mode]
	var diffs []string
	if err := ours(l, spec.Alias(), kind); err != nil {
		diffs = append(diffs, err.Error())
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		diffs = append(diffs, name+" is down")
	}
	if spec.MTU != 0 && l.Attrs().MTU != spec.MTU {
		diffs = append(diffs, fmt.Sprintf("%s has MTU %d, the config asks for %d", name, l.Attrs().MTU, spec.MTU))
	}
	have, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return err
	}
	for _, gw := range Gateways(spec.Addresses) {
		if !slices.ContainsFunc(have, func(a netlink.Addr) bool { return a.IP.Equal(gw.AsSlice()) }) {
			diffs = append(diffs, fmt.Sprintf("%s lacks gateway address %s", name, gw))
		}
	}
	d, err := routing.Find(spec.VPC)
	switch {
	case err != nil:
		return err
	case d == nil:
		diffs = append(diffs, fmt.Sprintf("VPC %s has no routing domain", spec.VPC))
	case d.Kind != spec.Routing:
		diffs = append(diffs, fmt.Sprintf("VPC %s uses routing %s, the config asks for %s", spec.VPC, d.Kind, spec.Routing))
	default:
		var addrs []netip.Addr
		for _, p := range spec.Addresses {
			if !spec.Standby {
				addrs = append(addrs, p.Addr())
			}
		}
		if err := d.Verify(l, addrs, Gateways(spec.Addresses)); err != nil {
			diffs = append(diffs, err.Error())
		}
	}
	var mac net.HardwareAddr
	if spec.Mode == names.ModeVeth {
		var sandboxDiffs []string
		sandboxDiffs, mac = checkSandbox(spec, l)
		diffs = append(diffs, sandboxDiffs...)
	}
	if err := h.filter().Check(spec.filterAttachment(mac)); err != nil {
		diffs = append(diffs, "packet filter: "+err.Error())
	}
	for _, s := range hostSysctls {
		p := filepath.Join(s.dir, name, s.key)
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) != "0" {
			diffs = append(diffs, fmt.Sprintf("%s is %s, not 0", strings.TrimPrefix(p, "/proc/sys/"), strings.TrimSpace(string(b))))
		}
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

// checkSandbox reports what differs in the container of a veth, and the
// container end's MAC.
func checkSandbox(spec Spec, host netlink.Link) ([]string, net.HardwareAddr) {
	var diffs []string
	var mac net.HardwareAddr
	err := ns.WithNetNSPath(spec.Netns, func(ns.NetNS) error {
		l, err := linkByName(spec.IfName)
		if err != nil {
			return err
		}
		if l == nil {
			diffs = append(diffs, fmt.Sprintf("container has no interface %s", spec.IfName))
			return nil
		}
		mac = l.Attrs().HardwareAddr
		if l.Attrs().Flags&net.FlagUp == 0 {
			diffs = append(diffs, fmt.Sprintf("container interface %s is down", spec.IfName))
		}
		have, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, p := range spec.Addresses {
			if !slices.ContainsFunc(have, func(a netlink.Addr) bool {
				ones, _ := a.Mask.Size()
				return a.IP.Equal(p.Addr().AsSlice()) && ones == p.Bits()
			}) {
				diffs = append(diffs, fmt.Sprintf("container interface %s lacks %s", spec.IfName, p))
			}
		}
		routes, err := netlinksafe.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, def := range Routes(spec.Addresses, spec.secondary()) {
			if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
				dst := def.Dst.Bits() == 0 && (r.Dst == nil || r.Dst.IP.IsUnspecified())
				if r.Dst != nil && def.Dst.Bits() > 0 {
					ones, _ := r.Dst.Mask.Size()
					dst = r.Dst.IP.Equal(def.Dst.Addr().AsSlice()) && ones == def.Dst.Bits()
				}
				return dst && r.Gw.Equal(def.Via.AsSlice())
			}) {
				diffs = append(diffs, fmt.Sprintf("container lacks route %s via %s", def.Dst, def.Via))
			}
		}
		return nil
	})
	if err != nil {
		return append(diffs, fmt.Sprintf("container netns %s: %v", spec.Netns, err)), nil
	}
	if mac == nil {
		return diffs, nil
	}
	neighs, err := netlink.NeighList(host.Attrs().Index, netlink.FAMILY_ALL)
	if err != nil {
		return append(diffs, err.Error()), mac
	}
	for _, p := range spec.Addresses {
		if !slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
			return n.IP.Equal(p.Addr().AsSlice()) && n.HardwareAddr.String() == mac.String() && n.State&netlink.NUD_PERMANENT != 0
		}) {
			diffs = append(diffs, fmt.Sprintf("%s lacks permanent neighbour %s lladdr %s", host.Attrs().Name, p.Addr(), mac))
		}
	}
	return diffs, mac
}
