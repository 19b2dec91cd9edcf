package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The decapsulation fast path (bpf/decap.c), a tc program on the ingress
// of the underlay interface: its filter's name, and a priority after the
// small ones other agents' filters take, so that theirs see the underlay's
// packets first.
const (
	decapFilterName = "gxdecap"
	decapPriority   = 0xc000
)

// The VNI map's value, by VNI (its three bytes and a zero, as the VXLAN
// header carries them), struct vxlan_device in the C source:
//
//	0   u32 the device's ifindex
//	4   the device's local IPv4 address
//	8   the device's MAC
//
// The VTEP map is keyed by IPv4 address.
const (
	decapValIndex = 0
	decapValLocal = 4
	decapValMAC   = 8
	decapValSize  = 16
)

// decapper is a namespace's decapsulation program and its maps. Each
// process loads its own and puts it in place of the one attached: a
// replaced filter swaps programs atomically, and the maps are filled
// before.
type decapper struct {
	prog        *ebpf.Program
	id          ebpf.ProgramID
	vnis, vteps *ebpf.Map
}

var decappers = map[uint64]*decapper{}

func currentDecapper() (*decapper, error) {
	ns, err := currentNetns()
	if err != nil {
		return nil, err
	}
	classifiersMu.Lock()
	defer classifiersMu.Unlock()
	if d := decappers[ns]; d != nil {
		return d, nil
	}
	d, err := loadDecapper()
	if err != nil {
		return nil, err
	}
	decappers[ns] = d
	return d, nil
}

func loadDecapper() (*decapper, error) {
	spec, err := loadDecap()
	if err != nil {
		return nil, err
	}
	spec.Maps[decapMapVnis].Name = "gxvni"
	spec.Maps[decapMapVteps].Name = "gxvtep"
	spec.Programs[decapProgDecap].Name = "galactic_decap"
	var objs decapObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogDisabled: true}}); err != nil {
		return nil, fmt.Errorf("loading the VXLAN decapsulation program: %w", err)
	}
	info, err := objs.Decap.Info()
	if err != nil {
		objs.Close()
		return nil, err
	}
	id, _ := info.ID()
	return &decapper{prog: objs.Decap, id: id, vnis: objs.Vnis, vteps: objs.Vteps}, nil
}

// vxlanDevice is what the program needs of one of galactic-router's
// VXLAN devices.
type vxlanDevice struct {
	vni   uint32
	index int
	mac   []byte
	local netip.Addr
}

func vniKey(vni uint32) []byte { return []byte{byte(vni >> 16), byte(vni >> 8), byte(vni), 0} }

func (v vxlanDevice) value() []byte {
	b := make([]byte, decapValSize)
	binary.LittleEndian.PutUint32(b[decapValIndex:], uint32(v.index))
	l := v.local.As4()
	copy(b[decapValLocal:], l[:])
	copy(b[decapValMAC:], v.mac)
	return b
}

// galacticVXLAN lists galactic-router's VXLAN devices with an IPv4 local
// address: the ones the program decapsulates for.
func galacticVXLAN(links []netlink.Link) []vxlanDevice {
	var out []vxlanDevice
	for _, l := range links {
		v, ok := l.(*netlink.Vxlan)
		if !ok || !strings.HasPrefix(v.Name, vxlanPrefix) || v.Port != VXLANPort || v.Learning || len(v.HardwareAddr) != 6 {
			continue
		}
		local, ok := netip.AddrFromSlice(v.SrcAddr)
		if local = local.Unmap(); ok && local.Is4() {
			out = append(out, vxlanDevice{vni: uint32(v.VxlanId), index: v.Index, mac: v.HardwareAddr, local: local})
		}
	}
	return out
}

// syncDecap makes the decapsulation program's maps hold the namespace's
// galactic VXLAN devices and the IPv4 VTEPs, and attaches the program to
// the interfaces that hold the devices' local addresses (and to no other).
// Without devices nothing is attached.
func syncDecap(vteps []netip.Addr) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing interfaces: %w", err)
	}
	devs := galacticVXLAN(links)
	if len(devs) == 0 {
		return detachDecap(links, nil)
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing addresses: %w", err)
	}
	underlay := map[int]bool{}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		for _, d := range devs {
			if d.local == ip.Unmap() {
				underlay[a.LinkIndex] = true
			}
		}
	}
	d, err := currentDecapper()
	if err != nil {
		return err
	}
	want := map[string][]byte{}
	for _, v := range devs {
		want[string(vniKey(v.vni))] = v.value()
	}
	if err := syncMap(d.vnis, want, decapValSize); err != nil {
		return fmt.Errorf("writing the VXLAN decapsulation's VNIs: %w", err)
	}
	want = map[string][]byte{}
	for _, v := range vteps {
		if v = v.Unmap(); v.Is4() {
			want[string(v.AsSlice())] = []byte{1}
		}
	}
	if err := syncMap(d.vteps, want, 1); err != nil {
		return fmt.Errorf("writing the VXLAN decapsulation's VTEPs: %w", err)
	}
	var errs []error
	for _, l := range links {
		// Never one of galactic's interfaces, as the vxlan chain's rules.
		if !underlay[l.Attrs().Index] || strings.HasPrefix(l.Attrs().Name, galacticPrefix) {
			continue
		}
		f, err := decapFilter(l)
		if err == nil && (f == nil || f.Id != int(d.id)) {
			err = d.attach(l)
		}
		errs = append(errs, err)
	}
	return errors.Join(append(errs, detachDecap(links, underlay))...)
}

// syncMap makes m's entries exactly want, writing only the entries that
// differ.
func syncMap(m *ebpf.Map, want map[string][]byte, valueSize int) error {
	unchanged := map[string]bool{}
	err := pruneMap(m, valueSize, func(k, v []byte) bool {
		w, ok := want[string(k)]
		unchanged[string(k)] = ok && string(w) == string(v)
		return ok
	})
	if err != nil {
		return err
	}
	for key, val := range want {
		if unchanged[key] {
			continue
		}
		if err := m.Put([]byte(key), val); err != nil {
			return err
		}
	}
	return nil
}

// pruneMap deletes the entries of m (4-byte keys) that keep refuses.
func pruneMap(m *ebpf.Map, valueSize int, keep func(k, v []byte) bool) error {
	var stale [][]byte
	k, v := make([]byte, 4), make([]byte, valueSize)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !keep(k, v) {
			stale = append(stale, slices.Clone(k))
		}
	}
	// What was read before a failed iteration is still pruned.
	errs := []error{it.Err()}
	for _, key := range stale {
		errs = append(errs, ignoreMissing(m.Delete(key)))
	}
	return errors.Join(errs...)
}

// decapFilter returns the decapsulation filter on link's ingress, nil if
// none.
func decapFilter(link netlink.Link) (*netlink.BpfFilter, error) {
	return ingressFilter(link, func(name string) bool { return name == decapFilterName })
}

func (d *decapper) attach(link netlink.Link) error {
	if err := addClsact(&netlink.Handle{}, link); err != nil {
		return err
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Handle: netlink.MakeHandle(0, 1), Protocol: unix.ETH_P_IP, Priority: decapPriority},
		Fd:          d.prog.FD(), Name: decapFilterName, DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("attaching the VXLAN decapsulation to %s (the kernel needs cls_bpf): %w", link.Attrs().Name, err)
	}
	return nil
}

// detachDecap removes the decapsulation filter from the interfaces of
// links that are not galactic's own and not in keep.
func detachDecap(links []netlink.Link, keep map[int]bool) error {
	var errs []error
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, galacticPrefix) || keep[l.Attrs().Index] {
			continue
		}
		f, err := decapFilter(l)
		if err == nil && f != nil {
			if err = netlink.FilterDel(f); errors.Is(err, unix.ENOENT) {
				err = nil
			}
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
