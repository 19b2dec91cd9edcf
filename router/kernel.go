package router

import (
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/router/dataplane"
)

// synced is what the kernel was last made to hold for one VPC.
type synced struct {
	vni uint32
	// dom is nil for a VPC with no routing domain here at that pass.
	dom *routing.Domain
	dev *dataplane.Device
	// remotes fingerprints the routes written.
	remotes remotesSum
	// neighs and fdb are the device's entries as last written.
	neighs, fdb []netlink.Neigh
}

// kernelStage is what the router made of the kernel: per VPC what its
// last sync wrote, the packet filter's VTEP set and the VPCs whose
// VXLAN device failed. A pass reads and writes only what moved since.
type kernelStage struct {
	plane    dataplane.Plane
	stateDir string
	log      *slog.Logger
	clock    clock.Clock
	metrics  *Metrics
	// marks are the kernel watch's; kick starts a pass.
	marks *kernelMarks
	kick  func()
	// synced is what each VPC's kernel state was made at its last sync,
	// vteps the packet filter's last VTEP set.
	synced map[string]synced
	vteps  []netip.Addr
	// deviceErrs are the VPCs whose VXLAN device could not be ensured on
	// the last pass.
	deviceErrs map[string]error
	// remove is RemoveKernelState but in unit tests.
	remove func() error
}

// passCost is what one pass did to the kernel.
type passCost struct {
	read, writes int
	locked       time.Duration
	vpcs         int
}

// kernelPass reads the kernel when a VPC may need a change, plans the
// writes without the node lock and takes the lock only to run them.
type kernelPass struct {
	ks      *kernelStage
	full    bool
	k       *dataplane.Kernel
	readErr error
	cost    passCost
	// dirty are the VPCs whose devices this pass reads and syncs, routes
	// those whose routes it does (dirty ones included), marked those
	// whose tables others changed.
	dirty, routes, marked map[string]bool
	plans                 map[string]*dataplane.Plan
	removes               []string
	next                  map[string]synced
	// failedBefore are the device errors the pass started with.
	failedBefore map[string]error
	// lockErr is set when the node lock could not be taken: nothing was
	// written and the pass ends there, to be retried.
	lockErr error
	// routesOnly is set when the pass read no devices: its VPCs'
	// neighbours are those it last wrote.
	routesOnly bool
}

// read reads the kernel but for the routes, which routesStage reads a
// few tables at a time for the VPCs it plans.
func (kp *kernelPass) read() {
	if kp.k != nil || kp.readErr != nil {
		return
	}
	kp.k, kp.readErr = kp.ks.plane.ReadDevices()
	if kp.readErr != nil {
		kp.ks.log.Error("reading the kernel", "error", kp.readErr)
		return
	}
	kp.cost.read = kp.k.Objects
}

// devicesStage picks the VPCs whose devices to read: every one on a full
// pass, else those that are new, changed VNI, failed last time, left, or
// any when the watches saw a device or domain change. It reads the kernel
// once for them, plans their devices and returns the devices the pass
// works with.
func (ks *kernelStage) devicesStage(vnis map[string]uint32, full bool) (*kernelPass, map[string]*dataplane.Device) {
	kp := &kernelPass{ks: ks, full: full, dirty: map[string]bool{}, routes: map[string]bool{}, marked: map[string]bool{}, plans: map[string]*dataplane.Plan{}, next: map[string]synced{},
		failedBefore: ks.deviceErrs}
	kp.pick(vnis, ks.marks.take())
	if len(kp.dirty) > 0 || full {
		kp.read()
	}
	var existing map[string]string
	if kp.k != nil {
		existing = kp.k.Devices()
	}
	devices := map[string]*dataplane.Device{}
	errs := map[string]error{}
	for vpc, vni := range vnis {
		if !kp.dirty[vpc] {
			if s := ks.synced[vpc]; s.dev != nil {
				devices[vpc] = s.dev
			}
			continue
		}
		if kp.readErr != nil {
			errs[vpc] = kp.readErr
			continue
		}
		dev, err := kp.planDevice(vpc, vni, existing)
		if err != nil {
			errs[vpc] = err
		} else if dev != nil {
			devices[vpc] = dev
		}
	}
	for vpc := range existing {
		if _, known := vnis[vpc]; !known {
			kp.removes = append(kp.removes, vpc)
		}
	}
	kp.carry(errs)
	return kp, devices
}

// pick marks dirty the VPCs whose devices the pass reads and marked
// those whose tables others changed, from the watch's marks mk.
func (kp *kernelPass) pick(vnis map[string]uint32, mk marked) {
	ks := kp.ks
	tables := mk.tables
	touched, devicesMoved := mk.touched(vnis)
	known := map[int]bool{}
	for _, s := range ks.synced {
		if s.dom != nil {
			known[s.dom.Table] = true
		}
	}
	// A table no VPC had yet may be a new VPC's domain.
	unknown := false
	for t := range tables {
		unknown = unknown || !known[t]
	}
	for vpc, vni := range vnis {
		s, ok := ks.synced[vpc]
		if kp.full || devicesMoved || touched[vpc] || !ok || s.vni != vni || ks.deviceErrs[vpc] != nil || s.dom == nil && unknown {
			kp.dirty[vpc] = true
		}
		if ok && s.dom != nil && tables[s.dom.Table] {
			kp.marked[vpc] = true
		}
	}
	for vpc := range ks.synced {
		if _, ok := vnis[vpc]; !ok {
			kp.dirty[vpc] = true
		}
	}
}

// planDevice plans vpc's device from the kernel read. A VPC without a
// routing domain here (or a VRF not made yet) has no device: nil, and
// the device of one whose domain went is removed.
func (kp *kernelPass) planDevice(vpc string, vni uint32, existing map[string]string) (*dataplane.Device, error) {
	ks := kp.ks
	dom, err := kp.k.Domain(vpc)
	if err != nil {
		ks.log.Error("reading the routing domain", "vpc", vpc, "error", err)
		return nil, fmt.Errorf("reading the routing domain: %w", err)
	}
	if dom == nil || (dom.Kind == routing.KindVRF && dom.Device == "") {
		kp.next[vpc] = synced{vni: vni}
		if _, has := existing[vpc]; has && dom == nil {
			kp.removes = append(kp.removes, vpc)
		}
		return nil, nil
	}
	pl := &dataplane.Plan{}
	dev, err := ks.plane.PlanDevice(vpc, vni, dom, kp.k, pl)
	if err != nil {
		if ks.deviceErrs[vpc] == nil || ks.deviceErrs[vpc].Error() != err.Error() {
			ks.log.Error("VXLAN device: keeping the VPC's routes announced and installed, retrying", "vpc", vpc, "error", err)
		}
		return nil, err
	}
	kp.plans[vpc] = pl
	kp.next[vpc] = synced{vni: vni, dom: dom, dev: dev}
	return dev, nil
}

// carry keeps the errors of the VPCs this pass did not read.
func (kp *kernelPass) carry(errs map[string]error) {
	for vpc, err := range kp.ks.deviceErrs {
		if !kp.dirty[vpc] {
			errs[vpc] = err
		}
	}
	kp.ks.deviceErrs = errs
}

// wanted is the routes a pass wants installed: per VPC, whether they may
// have changed since the last pass that synced the kernel, and the next
// hops of every VPC's routes.
type wanted interface {
	Routes(vpc string) []dataplane.Remote
	// Sum is sumOf(Routes(vpc)), without the copy.
	Sum(vpc string) remotesSum
	Changed(vpc string) bool
	VTEPs() []netip.Addr
}

// remoteMap is wanted from a map, every VPC possibly changed.
type remoteMap map[string][]dataplane.Remote

func (m remoteMap) Routes(vpc string) []dataplane.Remote { return m[vpc] }
func (m remoteMap) Sum(vpc string) remotesSum            { return sumOf(m[vpc]) }
func (m remoteMap) Changed(string) bool                  { return true }
func (m remoteMap) VTEPs() []netip.Addr                  { return vtepsOf(m) }

// routesStage plans the routes of the VPCs whose devices were read this
// pass, whose tables others changed, and whose desired routes differ from
// what was synced. With no device read it reads only those VPCs' tables
// and devices.
func (kp *kernelPass) routesStage(devices map[string]*dataplane.Device, w wanted) {
	ks := kp.ks
	// A VPC's routes are copied out of w only while its chunk is planned.
	sums := map[string]remotesSum{}
	for vpc := range devices {
		if !kp.dirty[vpc] && !kp.marked[vpc] && !w.Changed(vpc) {
			continue
		}
		sums[vpc] = w.Sum(vpc)
		if !kp.dirty[vpc] && !kp.marked[vpc] && ks.synced[vpc].remotes == sums[vpc] {
			continue
		}
		kp.routes[vpc] = true
		if !kp.dirty[vpc] {
			kp.next[vpc] = ks.synced[vpc]
		}
	}
	// The tables are read a few at a time and let go once planned, so a
	// pass over every VPC (a resync) holds a few tables' routes, not the
	// node's.
	vpcs := slices.Sorted(maps.Keys(kp.routes))
	for len(vpcs) > 0 && kp.readErr == nil {
		chunk := vpcs[:min(tablesPerRead, len(vpcs))]
		vpcs = vpcs[len(chunk):]
		tables := make([]int, 0, len(chunk))
		for _, vpc := range chunk {
			if s, ok := kp.next[vpc]; ok && s.dom != nil {
				tables = append(tables, s.dom.Table)
			}
		}
		kp.readTables(tables, chunk)
		if kp.readErr != nil {
			ks.log.Error("reading the kernel", "error", kp.readErr)
			break
		}
		for _, vpc := range chunk {
			pl := kp.plans[vpc]
			if pl == nil {
				pl = &dataplane.Plan{}
				kp.plans[vpc] = pl
			}
			s := kp.next[vpc]
			ks.plane.PlanRoutes(devices[vpc], s.dom, w.Routes(vpc), kp.k, pl)
			s.neighs, s.fdb = pl.Neighs, pl.FDB
			s.remotes = sums[vpc]
			kp.next[vpc] = s
		}
		kp.k.Forget(tables)
	}
	if kp.readErr != nil {
		for vpc := range kp.routes {
			delete(kp.next, vpc)
		}
	}
}

// tablesPerRead is how many VPC tables a pass holds at once.
const tablesPerRead = 32

// readTables reads the routes of tables, for the VPCs of chunk. A pass
// that read devices adds them to that read; one that did not reads only
// them, and takes the chunk's neighbours and FDB entries from what it
// last wrote.
func (kp *kernelPass) readTables(tables []int, chunk []string) {
	if kp.k != nil {
		kp.readErr = kp.k.ReadTables(tables)
	} else {
		kp.k, kp.readErr = kp.ks.plane.ReadRoutes(tables)
		kp.routesOnly = true
	}
	if kp.readErr != nil {
		return
	}
	kp.cost.read = kp.k.Objects
	if kp.routesOnly {
		for _, vpc := range chunk {
			s := kp.ks.synced[vpc]
			kp.k.Neighs[s.dev.Index], kp.k.FDB[s.dev.Index] = s.neighs, s.fdb
		}
	}
}

// remotesSum fingerprints a set of routes whatever their order: their
// number and the sum of their hashes. A pass compares it instead of
// keeping a second copy of every route; a resync writes from the kernel
// read, whatever the fingerprint says.
type remotesSum struct {
	n   int
	sum uint64
}

var remotesSeed = maphash.MakeSeed()

func sumOf(rs []dataplane.Remote) remotesSum {
	var s remotesSum
	for _, r := range rs {
		s.add(r.Prefix, r.NextHop, r.RouterMAC)
	}
	return s
}

// add counts one route in the sum; the order of the routes does not
// matter.
func (s *remotesSum) add(p netip.Prefix, nextHop netip.Addr, mac []byte) {
	var buf [64]byte
	b := append(buf[:0], p.Addr().AsSlice()...)
	b = append(b, byte(p.Bits()))
	b = append(b, nextHop.AsSlice()...)
	b = append(b, mac...)
	s.n++
	s.sum += maphash.Bytes(remotesSeed, b)
}

// vtepsOf is the next hops of remotes, sorted.
func vtepsOf(remotes map[string][]dataplane.Remote) []netip.Addr {
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	for _, rs := range remotes {
		for _, r := range rs {
			if !seen[r.NextHop] {
				seen[r.NextHop] = true
				out = append(out, r.NextHop)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// apply takes the node lock only when there is something to write, runs
// the plans and records what the kernel now holds. A VPC whose device
// could not be made leaves devices and joins the device errors.
func (kp *kernelPass) apply(devices map[string]*dataplane.Device, w wanted) {
	ks := kp.ks
	vteps, filterDue, writes := kp.due(w)
	for vpc := range kp.routes {
		kp.dirty[vpc] = true
	}
	kp.cost.vpcs = len(kp.dirty)
	failed := map[string]bool{}
	if writes > 0 {
		unlock, err := state.Lock(ks.stateDir)
		if err != nil {
			ks.log.Error("taking the node lock", "error", err)
			kp.lockErr = err
			return
		}
		began := ks.clock.Now()
		kp.runPlans(devices, failed)
		for _, vpc := range kp.removes {
			if err := ks.plane.RemoveVPC(vpc); err != nil {
				ks.log.Error("removing a VPC's VXLAN device", "vpc", vpc, "error", err)
			} else {
				ks.log.Info("removed VXLAN device", "vpc", vpc)
			}
		}
		if filterDue {
			// A failed sync is retried by the next pass that reads VTEPs.
			ks.vteps = nil
			if ks.syncFilter(vteps) {
				ks.vteps = vteps
			}
		}
		unlock()
		kp.cost.locked = ks.clock.Since(began)
		kp.cost.writes = writes
	}
	kp.record(failed)
}

// due is what apply writes: the VTEP set when the packet filter's is
// due, and how many writes the plans, removals and filter make.
func (kp *kernelPass) due(w wanted) (vteps []netip.Addr, filterDue bool, writes int) {
	// The VTEPs move only with a VPC's routes.
	if kp.full || len(kp.dirty) > 0 || len(kp.routes) > 0 {
		vteps = w.VTEPs()
		filterDue = kp.full || !slices.Equal(vteps, kp.ks.vteps)
	}
	// The filter's VXLAN decapsulation follows the devices too.
	devicesDue := len(kp.removes) > 0
	for _, pl := range kp.plans {
		devicesDue = devicesDue || pl.DeviceWrites() > 0
	}
	if devicesDue && !filterDue {
		vteps, filterDue = w.VTEPs(), true
	}
	writes = len(kp.removes)
	for _, pl := range kp.plans {
		writes += pl.Writes()
	}
	if filterDue {
		writes++
	}
	return vteps, filterDue, writes
}

// runPlans runs the plans with writes, with the node lock held, and adds
// the VPCs whose writes failed to failed.
func (kp *kernelPass) runPlans(devices map[string]*dataplane.Device, failed map[string]bool) {
	ks := kp.ks
	for vpc, pl := range kp.plans {
		if pl.Writes() == 0 {
			continue
		}
		devErr, err := pl.Apply()
		if devErr != nil {
			ks.log.Error("VXLAN device: keeping the VPC's routes announced and installed, retrying", "vpc", vpc, "error", devErr)
			ks.deviceErrs[vpc] = devErr
			delete(devices, vpc)
			failed[vpc] = true
			continue
		}
		if err != nil {
			ks.log.Error("installing remote routes", "vpc", vpc, "error", err)
			failed[vpc] = true
		}
		if ch := pl.Changes; ch != (dataplane.Changes{}) {
			ks.log.Info("remote routes", "vpc", vpc, "added", ch.Added, "replaced", ch.Replaced, "removed", ch.Removed)
			ks.metrics.kernelChanges.Add(float64(ch.Added + ch.Replaced + ch.Removed))
		}
		if pl.Skipped > 0 {
			// A route of galactic-cni's came after the read: read again.
			ks.marks.table(kp.next[vpc].dom.Table)
			ks.kick()
		}
	}
}

// record keeps what the pass made of each VPC it synced; a VPC that
// failed is synced again by the next pass.
func (kp *kernelPass) record(failed map[string]bool) {
	ks := kp.ks
	for vpc := range kp.dirty {
		s, ok := kp.next[vpc]
		switch {
		case !ok || failed[vpc]:
			delete(ks.synced, vpc)
		default:
			if kp.failedBefore[vpc] != nil && s.dev != nil && ks.deviceErrs[vpc] == nil {
				ks.log.Info("VXLAN device recovered", "vpc", vpc)
			}
			ks.synced[vpc] = s
		}
	}
}
