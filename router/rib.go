package router

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/galactic-cni/galactic/router/speaker"
)

// Importer keeps the selection of the RIB view up to date from the Adj's
// changes: a pass recomputes only the prefixes whose paths changed, with
// the same rules as Select, and everything after a change of the VPCs'
// VNIs or on a resync.
type Importer struct {
	RTASN uint16
	// RouterID and Underlay are this node's, to find other nodes' paths
	// that carry its router ID.
	RouterID, Underlay netip.Addr

	rib RIB
	// index is the keys of the paths carrying each route target's VNI for
	// each prefix: the candidates of one VPC's prefix.
	index    map[vniPrefix][]speaker.Key
	vnis     map[string]uint32
	byVNI    map[uint32]string
	selected map[string]map[netip.Prefix]speaker.Received
	fences   Fences
	// dupRefs counts the paths of other VTEPs that carry this node's
	// router ID, per VTEP.
	dupRefs map[netip.Addr]int
	// touched are the (VNI, prefix) pairs whose paths changed since the
	// last Select; all asks for everything.
	touched map[vniPrefix]struct{}
	all     bool
	// moved are the VPCs whose VNI changed, that came or that went since
	// the last Select: all of their prefixes are recomputed.
	moved map[string]bool
}

type vniPrefix struct {
	vni    uint32
	prefix netip.Prefix
}

func (im *Importer) init() {
	if im.rib == nil {
		im.rib = RIB{}
		im.index = map[vniPrefix][]speaker.Key{}
		im.selected = map[string]map[netip.Prefix]speaker.Received{}
		im.fences = Fences{}
		im.dupRefs = map[netip.Addr]int{}
		im.touched = map[vniPrefix]struct{}{}
		im.all = true
	}
}

// Apply records the RIB view's changes.
func (im *Importer) Apply(changes []ribChange) {
	im.init()
	for _, c := range changes {
		// A fence stays only while the drained path it names is absent or
		// still drained, whatever route targets the path comes back with.
		for vpc, ps := range im.fences {
			if f, ok := ps[c.key.Prefix]; ok && f.By == c.key {
				if vni, ok := im.vnis[vpc]; ok {
					im.touched[vniPrefix{vni, c.key.Prefix}] = struct{}{}
				}
			}
		}
		if old, ok := im.rib[c.key]; ok {
			im.unindex(c.key, old)
			delete(im.rib, c.key)
		}
		if c.ok {
			im.rib[c.key] = c.path
			im.indexPath(c.key, c.path)
		}
	}
}

func (im *Importer) isDup(r speaker.Received) bool {
	return r.RD.Admin == im.RouterID && r.NextHop != im.Underlay && r.NextHop.IsValid()
}

func (im *Importer) indexPath(k speaker.Key, r speaker.Received) {
	if im.isDup(r) {
		im.dupRefs[r.NextHop]++
	}
	for _, vni := range r.TargetVNIs(im.RTASN) {
		vp := vniPrefix{vni, k.Prefix}
		im.touched[vp] = struct{}{}
		if !slices.Contains(im.index[vp], k) {
			im.index[vp] = append(im.index[vp], k)
		}
	}
}

func (im *Importer) unindex(k speaker.Key, r speaker.Received) {
	if im.isDup(r) {
		if im.dupRefs[r.NextHop]--; im.dupRefs[r.NextHop] <= 0 {
			delete(im.dupRefs, r.NextHop)
		}
	}
	for _, vni := range r.TargetVNIs(im.RTASN) {
		vp := vniPrefix{vni, k.Prefix}
		im.touched[vp] = struct{}{}
		keys := slices.DeleteFunc(im.index[vp], func(o speaker.Key) bool { return o == k })
		if len(keys) == 0 {
			delete(im.index, vp)
		} else {
			im.index[vp] = keys
		}
	}
}

// Len is how many paths the RIB view holds.
func (im *Importer) Len() int { return len(im.rib) }

// RIB is the RIB view; callers must not change it.
func (im *Importer) RIB() RIB { im.init(); return im.rib }

// Duplicates are the VTEPs of other nodes' paths that carry this node's
// router ID, sorted.
func (im *Importer) Duplicates() []netip.Addr {
	out := slices.Collect(maps.Keys(im.dupRefs))
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// SetVNIs sets the VPCs' VNIs; the VPCs that came, went or changed VNI
// are recomputed.
func (im *Importer) SetVNIs(vnis map[string]uint32) {
	im.init()
	if maps.Equal(vnis, im.vnis) && im.byVNI != nil {
		return
	}
	if im.moved == nil {
		im.moved = map[string]bool{}
	}
	for vpc, v := range vnis {
		if old, ok := im.vnis[vpc]; !ok || old != v {
			im.moved[vpc] = true
		}
	}
	for vpc := range im.vnis {
		if _, ok := vnis[vpc]; !ok {
			im.moved[vpc] = true
		}
	}
	im.vnis = maps.Clone(vnis)
	im.byVNI = map[uint32]string{}
	for vpc, v := range vnis {
		im.byVNI[v] = vpc
	}
}

// Resync makes the next Select recompute everything.
func (im *Importer) Resync() { im.init(); im.all = true }

// Select brings the selection and the fences up to date and returns the
// (VPC, prefix) pairs whose selection or fence may have changed; all is
// true when every pair may have.
func (im *Importer) Select() (changed map[vpcPrefix]struct{}, all bool) {
	im.init()
	changed = map[vpcPrefix]struct{}{}
	if im.all {
		im.all, im.moved = false, nil
		im.touched = map[vniPrefix]struct{}{}
		old := im.fences
		im.selected = map[string]map[netip.Prefix]speaker.Received{}
		im.fences = Fences{}
		for vp := range im.index {
			if vpc, ok := im.byVNI[vp.vni]; ok {
				im.selectPrefix(vpc, vp, old[vpc][vp.prefix], hasFence(old, vpc, vp.prefix))
			}
		}
		return changed, true
	}
	if len(im.moved) > 0 {
		old := Fences{}
		for vpc := range im.moved {
			for p := range im.selected[vpc] {
				changed[vpcPrefix{vpc, p}] = struct{}{}
			}
			for p := range im.fences[vpc] {
				changed[vpcPrefix{vpc, p}] = struct{}{}
			}
			old[vpc] = im.fences[vpc]
			delete(im.selected, vpc)
			delete(im.fences, vpc)
		}
		for vp := range im.index {
			if vpc, ok := im.byVNI[vp.vni]; ok && im.moved[vpc] {
				changed[vpcPrefix{vpc, vp.prefix}] = struct{}{}
				im.selectPrefix(vpc, vp, old[vpc][vp.prefix], hasFence(old, vpc, vp.prefix))
			}
		}
		im.moved = nil
	}
	for vp := range im.touched {
		vpc, ok := im.byVNI[vp.vni]
		if !ok {
			continue
		}
		changed[vpcPrefix{vpc, vp.prefix}] = struct{}{}
		prev, had := im.fences[vpc][vp.prefix]
		im.selectPrefix(vpc, vp, prev, had)
	}
	im.touched = map[vniPrefix]struct{}{}
	return changed, false
}

func hasFence(f Fences, vpc string, p netip.Prefix) bool {
	_, ok := f[vpc][p]
	return ok
}

// selectPrefix is Select for one VPC's prefix: prev is its fence of the
// last selection, if had.
func (im *Importer) selectPrefix(vpc string, vp vniPrefix, prev Fence, had bool) {
	var fence Fence
	fenced, live := false, false
	raise := func(d Fence) {
		if !fenced || d.stronger(fence) {
			fence, fenced = d, true
		}
	}
	keys := im.index[vp]
	for _, k := range keys {
		r := im.rib[k]
		if !r.NextHop.IsValid() || len(r.RouterMAC) != 6 {
			continue
		}
		if r.Drained {
			raise(Fence{Gen: r.Generation, By: k})
			continue
		}
		live = true
	}
	if had && live {
		if back, ok := im.rib[prev.By]; !ok || back.Drained {
			raise(prev)
		}
	}
	var best speaker.Received
	found := false
	for _, k := range keys {
		r := im.rib[k]
		if !r.NextHop.IsValid() || len(r.RouterMAC) != 6 || r.Drained || fenced && r.Generation <= fence.Gen {
			continue
		}
		if !found || better(r, best) {
			best, found = r, true
		}
	}
	setIn(im.fences, vpc, vp.prefix, fence, fenced)
	setIn(im.selected, vpc, vp.prefix, best, found)
}

// setIn sets or, when !ok, deletes m[vpc][p], dropping an emptied VPC.
func setIn[V any](m map[string]map[netip.Prefix]V, vpc string, p netip.Prefix, v V, ok bool) {
	if !ok {
		if ps := m[vpc]; ps != nil {
			delete(ps, p)
			if len(ps) == 0 {
				delete(m, vpc)
			}
		}
		return
	}
	if m[vpc] == nil {
		m[vpc] = map[netip.Prefix]V{}
	}
	m[vpc][p] = v
}

// Selected is the selection and Fences the fences of the last Select;
// callers must not change them.
func (im *Importer) Selected() map[string]map[netip.Prefix]speaker.Received {
	return im.selected
}

func (im *Importer) Fences() Fences { return im.fences }
