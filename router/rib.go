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

	// rib is the RIB view.
	rib map[speaker.Key]ribPath
	// index is, per route target's VNI and prefix, the keys of the paths
	// carrying it: the candidates of one VPC's prefix. The selection is
	// not kept: Best reads it from there.
	index  map[uint32]map[netip.Prefix][]speaker.Key
	vnis   map[string]uint32
	byVNI  map[uint32]string
	fences Fences
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

// ribPath is a path of the RIB view and the peer it came from.
type ribPath struct {
	adjPath
	peer string
}

func (im *Importer) path(k speaker.Key) (speaker.Received, bool) {
	p, ok := im.rib[k]
	if !ok {
		return speaker.Received{}, false
	}
	return p.received(k, p.peer), true
}

type vniPrefix struct {
	vni    uint32
	prefix netip.Prefix
}

func (im *Importer) init() {
	if im.rib == nil {
		im.rib = map[speaker.Key]ribPath{}
		im.index = map[uint32]map[netip.Prefix][]speaker.Key{}
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
		if old, ok := im.path(c.key); ok {
			im.unindex(c.key, old)
			delete(im.rib, c.key)
		}
		if c.ok {
			im.rib[c.key] = ribPath{compactOf(c.path), c.path.Peer}
			im.indexPath(c.key, c.path)
		}
	}
}

func (im *Importer) isDup(r speaker.Received) bool {
	return carriesRouterID(r, im.RouterID, im.Underlay)
}

func (im *Importer) indexPath(k speaker.Key, r speaker.Received) {
	if im.isDup(r) {
		im.dupRefs[r.NextHop]++
	}
	for _, vni := range r.TargetVNIs(im.RTASN) {
		im.touched[vniPrefix{vni, k.Prefix}] = struct{}{}
		ps := im.index[vni]
		if ps == nil {
			ps = map[netip.Prefix][]speaker.Key{}
			im.index[vni] = ps
		}
		if !slices.Contains(ps[k.Prefix], k) {
			ps[k.Prefix] = append(ps[k.Prefix], k)
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
		im.touched[vniPrefix{vni, k.Prefix}] = struct{}{}
		ps := im.index[vni]
		keys := slices.DeleteFunc(ps[k.Prefix], func(o speaker.Key) bool { return o == k })
		switch {
		case len(keys) > 0:
			ps[k.Prefix] = keys
		case len(ps) > 1:
			delete(ps, k.Prefix)
		default:
			delete(im.index, vni)
		}
	}
}

// Len is how many paths the RIB view holds.
func (im *Importer) Len() int { return len(im.rib) }

// RIB is a copy of the RIB view.
func (im *Importer) RIB() RIB {
	out := RIB{}
	for k := range im.rib {
		out[k], _ = im.path(k)
	}
	return out
}

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

// Changes are what a Select may have changed: the selection or fence of
// these (VPC, prefix) pairs, of every prefix of these VPCs, or of all.
type Changes struct {
	Keys map[vpcPrefix]struct{}
	VPCs map[string]bool
	All  bool
}

// Select brings the fences up to date and returns what of the selection
// may have changed.
func (im *Importer) Select() Changes {
	im.init()
	changed := map[vpcPrefix]struct{}{}
	if im.all {
		im.all, im.moved = false, nil
		im.touched = map[vniPrefix]struct{}{}
		old := im.fences
		im.fences = Fences{}
		for vni, ps := range im.index {
			if vpc, ok := im.byVNI[vni]; ok {
				for p := range ps {
					im.fence(vpc, vni, p, old)
				}
			}
		}
		return Changes{All: true}
	}
	moved := im.moved
	if len(moved) > 0 {
		old := Fences{}
		for vpc := range moved {
			old[vpc] = im.fences[vpc]
			delete(im.fences, vpc)
			if vni, ok := im.vnis[vpc]; ok && im.byVNI[vni] == vpc {
				for p := range im.index[vni] {
					im.fence(vpc, vni, p, old)
				}
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
		im.fence(vpc, vp.vni, vp.prefix, im.fences)
	}
	im.touched = map[vniPrefix]struct{}{}
	return Changes{Keys: changed, VPCs: moved}
}

// fence is Select's fencing for one VPC's prefix: a drained path fences
// its generation and below, and the last selection's fence (in prev)
// stays while a live path of the prefix remains and the drained path has
// not come back undrained.
func (im *Importer) fence(vpc string, vni uint32, p netip.Prefix, prev Fences) {
	var fence Fence
	fenced, live := false, false
	raise := func(d Fence) {
		if !fenced || d.stronger(fence) {
			fence, fenced = d, true
		}
	}
	for _, k := range im.index[vni][p] {
		r := im.rib[k]
		if !r.nextHop.IsValid() || len(r.mac) != 6 {
			continue
		}
		if r.drained {
			raise(Fence{Gen: r.gen, By: k})
			continue
		}
		live = true
	}
	if was, had := prev[vpc][p]; had && live {
		if back, ok := im.rib[was.By]; !ok || back.drained {
			raise(was)
		}
	}
	setIn(im.fences, vpc, p, fence, fenced)
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

// Best is the path selected for vpc's prefix p: the best live path its
// fence lets through.
func (im *Importer) Best(vpc string, p netip.Prefix) (best speaker.Received, found bool) {
	vni, ok := im.vnis[vpc]
	if !ok || im.byVNI[vni] != vpc {
		return best, false
	}
	fence, fenced := im.fences[vpc][p]
	for _, k := range im.index[vni][p] {
		r, _ := im.path(k)
		if !r.NextHop.IsValid() || len(r.RouterMAC) != 6 || r.Drained || fenced && r.Generation <= fence.Gen {
			continue
		}
		if !found || better(r, best) {
			best, found = r, true
		}
	}
	return best, found
}

// Each calls f for every prefix of vpc with paths, selected or not.
func (im *Importer) Each(vpc string, f func(netip.Prefix)) {
	vni, ok := im.vnis[vpc]
	if !ok || im.byVNI[vni] != vpc {
		return
	}
	for p := range im.index[vni] {
		f(p)
	}
}

// VPCs calls f for every VPC with paths.
func (im *Importer) VPCs(f func(string)) {
	for vni := range im.index {
		if vpc, ok := im.byVNI[vni]; ok {
			f(vpc)
		}
	}
}

// Selected is the whole selection, as Select returns it.
func (im *Importer) Selected() map[string]map[netip.Prefix]speaker.Received {
	out := map[string]map[netip.Prefix]speaker.Received{}
	im.VPCs(func(vpc string) {
		im.Each(vpc, func(p netip.Prefix) {
			if r, ok := im.Best(vpc, p); ok {
				setIn(out, vpc, p, r, true)
			}
		})
	})
	return out
}

// Fences are the fences of the last Select; callers must not change them.
func (im *Importer) Fences() Fences { return im.fences }
