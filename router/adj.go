package router

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/galactic-cni/galactic/router/speaker"
)

// Adj is every peer's paths as the peer sent them. A session that goes
// down withdraws nothing: its paths become stale, not gone (like
// long-lived graceful restart, RFC 9494), and stay until the session's
// next End-of-RIB sweeps what it did not send again, or until Stale has
// passed. Only a withdrawal received on a live session removes a path.
type Adj struct {
	// Stale bounds how long a lost session's paths are kept; 0 drops them
	// when the session goes down.
	Stale time.Duration
	// Sync is how long an established session may go without End-of-RIB
	// before it counts as synced (a peer that sends none).
	Sync  time.Duration
	peers map[string]*adjPeer
	// order is the peers' addresses, sorted: the preference among stale
	// copies.
	order []string
	// dirty are the keys whose merged copy may have changed since the
	// last TakeChanges, with the copy each had then.
	dirty map[pathKey]mergedPath
	// macs and targets are the router MACs and route-target lists the
	// paths share.
	macs    map[string][]byte
	targets map[string][]speaker.RouteTarget
}

type adjPeer struct {
	addr  string
	paths map[pathKey]adjPath
	// stale are the paths learnt before the current session.
	stale       map[pathKey]bool
	staleSince  time.Time
	established bool
	upSince     time.Time
	// synced is true once the current session sent its End-of-RIB.
	synced bool
}

func (a *Adj) peer(addr string) *adjPeer {
	if a.peers == nil {
		a.peers = map[string]*adjPeer{}
	}
	p := a.peers[addr]
	if p == nil {
		p = &adjPeer{addr: addr, paths: map[pathKey]adjPath{}, stale: map[pathKey]bool{}}
		a.peers[addr] = p
		a.order = append(a.order, addr)
		sort.Strings(a.order)
	}
	return p
}

// touch marks k's merged copy as possibly changing, keeping the copy it
// had at the last TakeChanges: call it before changing a peer's paths.
func (a *Adj) touch(k pathKey) {
	if a.dirty == nil {
		a.dirty = map[pathKey]mergedPath{}
	}
	if _, ok := a.dirty[k]; !ok {
		a.dirty[k] = a.lookup(k)
	}
}

// Apply records one event of the speaker's stream at now; changed is false
// for events that cannot change what is selected (session state changes
// other than to or from Established).
func (a *Adj) Apply(now time.Time, ev speaker.Event) (changed bool) {
	p := a.peer(ev.Peer)
	switch ev.Kind {
	case speaker.EventPeer:
		switch {
		case ev.State.Established && !p.established:
			p.established, p.upSince, p.synced = true, now, false
			return true
		case !ev.State.Established && p.established:
			p.established, p.synced = false, false
			// Another peer's current copy may win over a now stale one.
			for k := range p.paths {
				a.touch(k)
			}
			p.goStale(now, a.Stale)
			return true
		}
		return false
	case speaker.EventPaths:
		for _, r := range ev.Paths {
			k := packKey(r.Key())
			a.touch(k)
			if !r.Withdrawn {
				p.paths[k] = a.compact(r)
				delete(p.stale, k)
				continue
			}
			delete(p.paths, k)
			delete(p.stale, k)
			// A live session's withdrawal is newer than any stale copy.
			for _, o := range a.peers {
				if o.stale[k] {
					delete(o.paths, k)
					delete(o.stale, k)
				}
			}
		}
		return true
	case speaker.EventEndOfRIB:
		a.sweep(p)
		return true
	}
	return false
}

// goStale marks every path of the peer stale, keeping when that began if
// it already was.
func (p *adjPeer) goStale(now time.Time, bound time.Duration) {
	if bound <= 0 {
		p.paths = map[pathKey]adjPath{}
		p.stale = map[pathKey]bool{}
		return
	}
	if len(p.stale) == 0 {
		p.staleSince = now
	}
	for k := range p.paths {
		p.stale[k] = true
	}
}

// sweep ends the current session's sync: what it did not send again goes.
func (a *Adj) sweep(p *adjPeer) {
	for k := range p.stale {
		a.touch(k)
		delete(p.paths, k)
	}
	p.stale = map[pathKey]bool{}
	p.synced = p.established
}

// Expire applies the bounds at now: stale paths older than Stale go, and
// a session established for Sync without End-of-RIB counts as synced. next
// is when the next bound ends, zero when none runs.
func (a *Adj) Expire(now time.Time) (next time.Time) {
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, p := range a.peers {
		if p.established && !p.synced {
			if end := p.upSince.Add(a.Sync); now.Before(end) {
				soonest(end)
			} else {
				a.sweep(p)
			}
		}
		if len(p.stale) > 0 {
			if end := p.staleSince.Add(a.Stale); now.Before(end) {
				soonest(end)
			} else {
				for k := range p.stale {
					a.touch(k)
					delete(p.paths, k)
				}
				p.stale = map[pathKey]bool{}
			}
		}
	}
	return next
}

// ribChange is a key of the RIB view whose copy may have changed since
// the last TakeChanges, with the copy it had then (was.ok false when it
// had none); the Adj holds the new one.
type ribChange struct {
	key pathKey
	was mergedPath
}

// TakeChanges returns every key an event or bound touched since the last
// call, so the selection follows only what changed.
func (a *Adj) TakeChanges() []ribChange {
	if len(a.dirty) == 0 {
		return nil
	}
	out := make([]ribChange, 0, len(a.dirty))
	for k, was := range a.dirty {
		out = append(out, ribChange{key: k, was: was})
	}
	a.dirty = nil
	return out
}

// mergedPath is a key's copy in the RIB view and the peer it is from.
type mergedPath struct {
	adjPath
	peer string
	ok   bool
}

// lookup is k's copy in the RIB view: the first current copy in address
// order, else the first stale one, as RIB chooses.
func (a *Adj) lookup(k pathKey) mergedPath {
	var first mergedPath
	for _, addr := range a.order {
		p := a.peers[addr]
		r, ok := p.paths[k]
		if !ok {
			continue
		}
		if !p.stale[k] {
			return mergedPath{r, p.addr, true}
		}
		if !first.ok {
			first = mergedPath{r, p.addr, true}
		}
	}
	return first
}

// merged is k's copy in the RIB view.
func (a *Adj) merged(k pathKey) (speaker.Received, bool) {
	m := a.lookup(k)
	if !m.ok {
		return speaker.Received{}, false
	}
	return m.received(k.key(), m.peer), true
}

// RIB is the view selection works on: per key a current copy where a
// live session has one, else a stale one (of the lowest peer address, so
// the choice is stable).
func (a *Adj) RIB() RIB {
	addrs := make([]string, 0, len(a.peers))
	for addr := range a.peers {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	size := 0
	for _, p := range a.peers {
		size = max(size, len(p.paths))
	}
	out := make(RIB, size)
	// Which keys hold a stale copy, only where a later peer may replace it.
	staleCopy := map[speaker.Key]bool{}
	for i, addr := range addrs {
		p := a.peers[addr]
		for pk, r := range p.paths {
			k := pk.key()
			isStale := p.stale[pk]
			if _, have := out[k]; have && (!staleCopy[k] || isStale) {
				continue
			}
			out[k] = r.received(k, p.addr)
			if isStale && i < len(addrs)-1 {
				staleCopy[k] = true
			} else {
				delete(staleCopy, k)
			}
		}
	}
	return out
}

// Sessions reports for the configured peers whether any session is
// established, whether any has synced (sent its End-of-RIB) and whether
// every one has.
func (a *Adj) Sessions(peers []string) (anyUp, anySynced, allSynced bool) {
	allSynced = len(peers) > 0
	for _, addr := range peers {
		p := a.peers[addr]
		if p != nil && p.established {
			anyUp = true
		}
		if p != nil && p.synced {
			anySynced = true
		} else {
			allSynced = false
		}
	}
	return anyUp, anySynced, allSynced
}

// Current counts the paths live sessions sent that the RIB view holds:
// what the speaker's Adj-RIB-In holds of the member route targets.
func (a *Adj) Current() int {
	n := 0
	for _, p := range a.peers {
		if p.established {
			n += len(p.paths) - len(p.stale)
		}
	}
	return n
}

// Established reports each known peer's session.
func (a *Adj) Established() map[string]bool {
	out := map[string]bool{}
	for addr, p := range a.peers {
		out[addr] = p.established
	}
	return out
}

// adjPath is a received path as the Adj keeps it: its key is the map's,
// its peer the table's, and its router MAC and route targets are shared
// with every other path carrying the same.
type adjPath struct {
	nextHop        netip.Addr
	mac            net.HardwareAddr
	targets        []speaker.RouteTarget
	vni, gen       uint32
	rtASN          uint16
	drained, stale bool
}

// internMax bounds each table of shared values, so a peer sending ever
// new ones costs a copy per path, not a table without end.
const internMax = 1 << 16

func (a *Adj) compact(r speaker.Received) adjPath {
	if a.macs == nil {
		a.macs, a.targets = map[string][]byte{}, map[string][]speaker.RouteTarget{}
	}
	out := adjPath{nextHop: r.NextHop, vni: r.VNI, gen: r.Generation, rtASN: r.RTASN, drained: r.Drained, stale: r.Stale}
	if r.RouterMAC != nil {
		out.mac = intern(a.macs, string(r.RouterMAC), []byte(r.RouterMAC))
	}
	if r.Targets != nil {
		var buf [6 * 4]byte
		b := buf[:0]
		for _, t := range r.Targets {
			b = binary.BigEndian.AppendUint16(b, t.ASN)
			b = binary.BigEndian.AppendUint32(b, t.Value)
		}
		out.targets = intern(a.targets, string(b), r.Targets)
	}
	return out
}

// intern returns the table's copy of v, adding a copy of v when it has
// none: the caller's slice may be reused.
func intern[E any](table map[string][]E, key string, v []E) []E {
	if have, ok := table[key]; ok {
		return have
	}
	v = slices.Clone(v)
	if len(table) < internMax {
		table[key] = v
	}
	return v
}

func (p adjPath) received(k speaker.Key, peer string) speaker.Received {
	return speaker.Received{Route: speaker.Route{
		RD: k.RD, Prefix: k.Prefix, VNI: p.vni, RTASN: p.rtASN, NextHop: p.nextHop, RouterMAC: p.mac,
		Generation: p.gen, Drained: p.drained,
	}, Targets: p.targets, Stale: p.stale, Peer: peer}
}

// pathKey is a speaker.Key packed without pointers: the tables of every
// received path are keyed by it, at 36 bytes instead of 64.
type pathKey struct {
	prefix, admin [16]byte
	assigned      uint16
	bits          uint8
	// kinds are the prefix's and the admin's address kinds (addrKind).
	kinds uint8
}

func addrKind(a netip.Addr) uint8 {
	switch {
	case a.Is4():
		return 1
	case a.Is6():
		return 2
	}
	return 0
}

func addrOf(b [16]byte, kind uint8) netip.Addr {
	switch kind {
	case 1:
		return netip.AddrFrom16(b).Unmap()
	case 2:
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}

// noBits is the packed length of a prefix without one (Bits -1); a
// length is at most 128.
const noBits = 0xff

// packKey packs k; a prefix address or RD admin with a zone loses it
// (neither has one on the wire).
func packKey(k speaker.Key) pathKey {
	pa, aa := k.Prefix.Addr(), k.RD.Admin
	return pathKey{
		prefix: pa.As16(), admin: aa.As16(), assigned: k.RD.Assigned,
		bits: uint8(k.Prefix.Bits()), kinds: addrKind(pa) | addrKind(aa)<<2,
	}
}

func (k pathKey) key() speaker.Key {
	rd := speaker.RD{Admin: addrOf(k.admin, k.kinds>>2), Assigned: k.assigned}
	pa := addrOf(k.prefix, k.kinds&3)
	if !pa.IsValid() {
		return speaker.Key{RD: rd}
	}
	bits := int(k.bits)
	if k.bits == noBits {
		bits = -1
	}
	return speaker.Key{RD: rd, Prefix: netip.PrefixFrom(pa, bits)}
}
