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
	// Adj holds the RIB view the Importer selects from, read in place: it
	// must not change between its TakeChanges and the Importer's reads.
	Adj *Adj

	// paths is how many keys the RIB view holds.
	paths int
	// index is, per route target's VNI and prefix, the keys of the paths
	// carrying it: the candidates of one VPC's prefix. The selection is
	// not kept: Best reads it from there.
	index  map[uint32]map[netip.Prefix][]pathKey
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

func (im *Importer) path(k pathKey) (speaker.Received, bool) { return im.Adj.merged(k) }

type vniPrefix struct {
	vni    uint32
	prefix netip.Prefix
}

func (im *Importer) init() {
	if im.index == nil {
		im.index = map[uint32]map[netip.Prefix][]pathKey{}
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
		key := c.key.key()
		// A fence stays only while the drained path it names is absent or
		// still drained, whatever route targets the path comes back with.
		for vpc, ps := range im.fences {
			if f, ok := ps[key.Prefix]; ok && f.By == key {
				if vni, ok := im.vnis[vpc]; ok {
					im.touched[vniPrefix{vni, key.Prefix}] = struct{}{}
				}
			}
		}
		if c.was.ok {
			im.unindex(c.key, c.was.received(key, c.was.peer))
			im.paths--
		}
		if now, ok := im.path(c.key); ok {
			im.indexPath(c.key, now)
			im.paths++
		}
	}
}

func (im *Importer) isDup(r speaker.Received) bool {
	return carriesRouterID(r, im.RouterID, im.Underlay)
}

func (im *Importer) indexPath(k pathKey, r speaker.Received) {
	if im.isDup(r) {
		im.dupRefs[r.NextHop]++
	}
	for _, vni := range r.TargetVNIs(im.RTASN) {
		im.touched[vniPrefix{vni, r.Prefix}] = struct{}{}
		ps := im.index[vni]
		if ps == nil {
			ps = map[netip.Prefix][]pathKey{}
			im.index[vni] = ps
		}
		if !slices.Contains(ps[r.Prefix], k) {
			ps[r.Prefix] = append(ps[r.Prefix], k)
		}
	}
}

func (im *Importer) unindex(k pathKey, r speaker.Received) {
	if im.isDup(r) {
		if im.dupRefs[r.NextHop]--; im.dupRefs[r.NextHop] <= 0 {
			delete(im.dupRefs, r.NextHop)
		}
	}
	for _, vni := range r.TargetVNIs(im.RTASN) {
		im.touched[vniPrefix{vni, r.Prefix}] = struct{}{}
		ps := im.index[vni]
		keys := slices.DeleteFunc(ps[r.Prefix], func(o pathKey) bool { return o == k })
		switch {
		case len(keys) > 0:
			ps[r.Prefix] = keys
		case len(ps) > 1:
			delete(ps, r.Prefix)
		default:
			delete(im.index, vni)
		}
	}
}

// Len is how many paths the RIB view holds.
func (im *Importer) Len() int { return im.paths }

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
		r := im.Adj.lookup(k)
		if !r.nextHop.IsValid() || len(r.mac) != 6 {
			continue
		}
		if r.drained {
			raise(Fence{Gen: r.gen, By: k.key()})
			continue
		}
		live = true
	}
	if was, had := prev[vpc][p]; had && live {
		if back := im.Adj.lookup(packKey(was.By)); !back.ok || back.drained {
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
