package soak

import (
	"fmt"
	"slices"
	"syscall"
	"time"
)

// Bugs are faults the simulation can plant, to show the checkers catch
// them.
type Bugs struct {
	// IgnoreGeneration: receivers pick the lowest node name among the
	// announced paths instead of the highest holderGeneration.
	IgnoreGeneration bool
	// GCSkipsOne: the GC never removes the first dead record it meets.
	GCSkipsOne bool
	// ReuseAddress: the controller allocates the first address of the
	// pool, whether an attachment holds it or not.
	ReuseAddress bool
}

// SimBounds are the windows for the simulation, where nothing lags.
var SimBounds = Bounds{WithdrawHold: WithdrawHold, Converge: 2 * time.Second, RoutingGrace: 30 * time.Second}

// Simulate runs the schedule of seed (its first steps steps, all when 0)
// on a simulated world with the bugs planted, through the same checkers
// and leak checks as Run, and returns the checker with its violations.
// It is pure and fast: time is simulated in 100 ms ticks.
func Simulate(seed uint64, duration time.Duration, steps int, bugs Bugs) *Checker {
	topo := DefaultTopology()
	topo.OutageMax = min(60*time.Second, max(5*time.Second, duration/8))
	sched := Schedule(seed, duration, topo)
	if steps > 0 && steps < len(sched) {
		sched = Prefix(sched, steps-1)
	}
	start := time.Unix(1e9, 0)
	w := &sim{topo: topo, bugs: bugs, now: start, nodes: map[string]*simNode{}, leases: map[string]*simLease{},
		routes: map[RouteKey]*simRoute{}, inst: map[string]*simInstance{}, alive: map[string]bool{},
		objects: map[string]*simObject{}, addresses: map[string]*simAddress{}}
	for _, n := range topo.Nodes {
		w.nodes[n] = &simNode{up: true, api: true, router: true, gc: true}
	}
	w.c = NewChecker(topo, SimBounds, start)
	for _, a := range append(slices.Clone(statics), topo.Attachments...) {
		if a.Namespace != "" {
			w.allocate(a.Key(), false, addrOf(a).String())
		}
	}
	w.allocate(keeper.Key(), true)
	for _, a := range topo.Attachments {
		if err := w.Create(a.Key(), topo.Initial[a.Key()]); err != nil {
			panic(err)
		}
	}
	w.advance(5 * time.Second)
	for _, s := range sched {
		if t := start.Add(s.At); t.After(w.now) {
			w.advance(t.Sub(w.now))
		}
		w.c.Begin(s, w.now)
		if err := RunStep(w, s); err != nil {
			w.c.Fail(w.now, "step failed", "%s: %v", s, err)
		}
		w.c.Done(s, w.now)
	}
	w.advance(WithdrawHold + 10*time.Second)
	for _, p := range w.c.QuietProblems(w.quietView()) {
		w.c.Fail(w.now, "leak", "%s", p)
	}
	return w.c
}

type simNode struct{ up, api, router, gc bool }

type simLease struct {
	holder    string
	token     int64
	available bool
	renewed   time.Time
}

type simInstance struct {
	key, node, cid string
	gen            int64
}

type simEntry struct {
	key, node, cid string
	gen            int64
}

type simRecord struct{ node, cid string }

type simRoute struct {
	via       string
	gen       int64
	withdrawn time.Time
}

type sim struct {
	topo   Topology
	bugs   Bugs
	c      *Checker
	now    time.Time
	nodes  map[string]*simNode
	leases map[string]*simLease
	// inst are the running instances by key; stale those replaced while
	// their node was cut off.
	inst      map[string]*simInstance
	stale     []*simInstance
	alive     map[string]bool
	entries   []simEntry
	records   []simRecord
	announced map[string][]simEntry
	routes    map[RouteKey]*simRoute
	reflector bool
	skipped   string
	nextID    int
	// objects are the tenant's attachments by key; addresses its
	// VPCAddresses by address.
	objects   map[string]*simObject
	addresses map[string]*simAddress
}

type simObject struct {
	uid    string
	retain bool
	addrs  []string
}

// simAddress is a VPCAddress: bound to uid, or retained for the
// attachment key.
type simAddress struct{ uid, retainedFor string }

// simVPC is VPC green's UID in the simulation.
const simVPC = "vpc-green"

func (w *sim) advance(d time.Duration) {
	for end := w.now.Add(d); w.now.Before(end); {
		w.now = w.now.Add(sampleEvery)
		w.tick()
		w.c.Observe(w.snapshot())
	}
}

// tick runs the daemons: GC (records, lease renewals), routers (export
// and import with the withdrawal hold).
func (w *sim) tick() {
	for name, n := range w.nodes {
		if !n.up || !n.gc {
			continue
		}
		w.records = slices.DeleteFunc(w.records, func(r simRecord) bool {
			if r.node != name || w.alive[r.cid] {
				return false
			}
			if w.bugs.GCSkipsOne && (w.skipped == "" || w.skipped == r.cid) {
				w.skipped = r.cid
				return false
			}
			return true
		})
		if !n.api {
			continue
		}
		w.entries = slices.DeleteFunc(w.entries, func(e simEntry) bool { return e.node == name && !w.alive[e.cid] })
		for _, in := range w.inst {
			if l := w.leases[in.key]; in.node == name && l.holder == in.node+"/"+in.cid {
				l.renewed = w.now
			}
		}
	}
	if w.announced == nil {
		w.announced = map[string][]simEntry{}
		w.reflector = true
	}
	for name, n := range w.nodes {
		switch {
		case !n.up:
			delete(w.announced, name)
		case n.api && n.router:
			var paths []simEntry
			for _, e := range w.entries {
				if e.node == name && w.alive[e.cid] && w.routable(e) {
					paths = append(paths, e)
				}
			}
			w.announced[name] = paths
		}
	}
	if !w.reflector {
		return
	}
	for name, n := range w.nodes {
		if !n.up || !n.router {
			continue
		}
		for _, a := range w.topo.Attachments {
			rk := RouteKey{Observer: name, Key: a.Key()}
			rt := w.routes[rk]
			if rt == nil {
				rt = &simRoute{}
				w.routes[rk] = rt
			}
			best, gen := w.best(name, a.Key())
			switch {
			case best != "":
				rt.via, rt.gen, rt.withdrawn = best, gen, time.Time{}
			case rt.via == "":
			case rt.withdrawn.IsZero():
				rt.withdrawn = w.now
			case w.now.Sub(rt.withdrawn) >= WithdrawHold:
				rt.via, rt.withdrawn = "", time.Time{}
			}
		}
	}
}

func (w *sim) routable(e simEntry) bool {
	if w.topo.attachment(e.key).Announce != "whenAvailable" {
		return true
	}
	l := w.leases[e.key]
	return l != nil && l.available && l.token == e.gen && l.holder == e.node+"/"+e.cid
}

// best is the path a receiver installs for key: the highest generation
// announced by another node (with the planted bug: the lowest node name).
func (w *sim) best(observer, key string) (string, int64) {
	var via string
	var gen int64 = -1
	for _, node := range sortedKeys(w.announced) {
		if node == observer {
			continue
		}
		for _, e := range w.announced[node] {
			if e.key != key {
				continue
			}
			better := e.gen > gen
			if w.bugs.IgnoreGeneration {
				better = via == ""
			}
			if better {
				via, gen = e.node, e.gen
			}
		}
	}
	return via, gen
}

func (w *sim) snapshot() Snapshot {
	s := Snapshot{At: w.now, Leases: map[string]LeaseView{}, Routes: map[RouteKey]string{}}
	for key, l := range w.leases {
		s.Leases[key] = LeaseView{Holder: l.holder, Token: l.token, Available: l.available && l.holder != ""}
	}
	for _, e := range w.entries {
		s.Entries = append(s.Entries, EntryView{Key: e.key, Node: e.node, ContainerID: e.cid, Generation: e.gen, Live: w.alive[e.cid]})
	}
	for _, r := range w.records {
		for _, e := range w.entries {
			if e.cid == r.cid {
				s.Records = append(s.Records, EntryView{Key: e.key, Node: r.node, ContainerID: r.cid, Generation: e.gen, Live: w.alive[r.cid]})
			}
		}
	}
	for rk, rt := range w.routes {
		if w.nodes[rk.Observer].up {
			s.Routes[rk] = rt.via
		}
	}
	s.Claims = w.claims()
	return s
}

func (w *sim) claims() []AddressClaim {
	var out []AddressClaim
	for _, addr := range sortedKeys(w.addresses) {
		if a := w.addresses[addr]; a.uid != "" {
			out = append(out, AddressClaim{VPC: simVPC, Address: addr, UID: a.uid, Source: "VPCAddress green." + addr})
		}
	}
	for _, key := range sortedKeys(w.objects) {
		for _, addr := range w.objects[key].addrs {
			out = append(out, AddressClaim{VPC: simVPC, Address: addr, UID: w.objects[key].uid, Source: "the status of " + key})
		}
	}
	return out
}

// allocate is the controller making attachment key: the addresses
// retained for it, else those requested, else the pool's first free one
// (with ReuseAddress the pool's first).
func (w *sim) allocate(key string, retain bool, requested ...string) *simObject {
	w.nextID++
	o := &simObject{uid: fmt.Sprintf("uid-%d", w.nextID), retain: retain}
	for _, addr := range sortedKeys(w.addresses) {
		if w.addresses[addr].retainedFor == key {
			o.addrs = append(o.addrs, addr)
		}
	}
	switch {
	case len(o.addrs) > 0:
	case len(requested) > 0:
		o.addrs = requested
	default:
		for i := 10; ; i++ {
			addr := fmt.Sprintf("10.30.0.%d", i)
			if w.addresses[addr] == nil || w.bugs.ReuseAddress {
				o.addrs = []string{addr}
				break
			}
		}
	}
	for _, addr := range o.addrs {
		w.addresses[addr] = &simAddress{uid: o.uid}
	}
	w.objects[key] = o
	return o
}

// reclaim is the controller letting deleted attachment key go: Delete
// frees its addresses, Retain keeps them for the name.
func (w *sim) reclaim(key string) {
	o := w.objects[key]
	delete(w.objects, key)
	for _, addr := range o.addrs {
		if a := w.addresses[addr]; a != nil && a.uid == o.uid {
			if o.retain {
				a.uid, a.retainedFor = "", key
			} else {
				delete(w.addresses, addr)
			}
		}
	}
}

func (w *sim) CycleAttachment(key, node string) error {
	w.allocate(key, false)
	w.advance(sampleEvery)
	if node != "" {
		w.advance(sampleEvery)
	}
	w.reclaim(key)
	w.advance(sampleEvery)
	return nil
}

func (w *sim) RebindRetained(key, node string) error {
	old := w.objects[key]
	w.reclaim(key)
	w.advance(sampleEvery)
	o := w.allocate(key, true)
	if o.uid == old.uid || !slices.Equal(o.addrs, old.addrs) {
		return fmt.Errorf("the rebound %s: %+v, its predecessor %+v", key, o, old)
	}
	w.advance(sampleEvery)
	return nil
}

func (w *sim) quietView() QuietView {
	v := QuietView{Snapshot: w.snapshot(), Advertisements: map[string]int{}, HolderLive: map[string]bool{},
		Records: map[string][]RecordView{}, Devices: map[string][]string{}}
	for key, l := range w.leases {
		if l.holder != "" {
			live := false
			for _, in := range w.inst {
				live = live || in.node+"/"+in.cid == l.holder
			}
			v.HolderLive[key] = live
		}
	}
	for _, r := range w.records {
		v.Records[r.node] = append(v.Records[r.node], RecordView{ContainerID: r.cid, HostInterface: r.cid, Live: w.alive[r.cid]})
		if w.alive[r.cid] {
			v.Devices[r.node] = append(v.Devices[r.node], r.cid)
		}
	}
	return v
}

// acquire waits (in simulated time) until key's lease is free or expired
// and takes it for holder.
func (w *sim) acquire(key, holder string) (int64, error) {
	l := w.leases[key]
	if l == nil {
		l = &simLease{}
		w.leases[key] = l
	}
	for waited := time.Duration(0); l.holder != "" && w.now.Sub(l.renewed) < time.Duration(w.topo.LeaseSeconds)*time.Second; waited += sampleEvery {
		if waited > 30*time.Second {
			return 0, fmt.Errorf("lease of %s held by %s", key, l.holder)
		}
		w.advance(sampleEvery)
	}
	l.holder, l.token, l.available, l.renewed = holder, l.token+1, false, w.now
	return l.token, nil
}

func (w *sim) Create(key, node string) error {
	w.nextID++
	cid := fmt.Sprintf("c%d", w.nextID)
	if !w.nodes[node].api {
		return fmt.Errorf("%s cannot reach the API", node)
	}
	gen, err := w.acquire(key, node+"/"+cid)
	if err != nil {
		return err
	}
	w.alive[cid] = true
	w.records = append(w.records, simRecord{node, cid})
	// galactic-bgp's fallback: this attachment's entries on other nodes go.
	w.entries = slices.DeleteFunc(w.entries, func(e simEntry) bool { return e.key == key && e.node != node })
	w.entries = append(w.entries, simEntry{key, node, cid, gen})
	in := &simInstance{key, node, cid, gen}
	w.inst[key] = in
	if w.topo.attachment(key).Announce == "whenAvailable" {
		w.leases[key].available = true
	}
	w.advance(sampleEvery)
	return nil
}

func (w *sim) stop(in *simInstance) {
	w.entries = slices.DeleteFunc(w.entries, func(e simEntry) bool { return e.cid == in.cid })
	w.records = slices.DeleteFunc(w.records, func(r simRecord) bool { return r.cid == in.cid })
	if l := w.leases[in.key]; l.holder == in.node+"/"+in.cid {
		l.holder, l.available = "", false
	}
	delete(w.alive, in.cid)
}

func (w *sim) Delete(key string) error {
	in := w.inst[key]
	if in == nil {
		return fmt.Errorf("%s is not running", key)
	}
	delete(w.inst, key)
	w.stop(in)
	w.advance(sampleEvery)
	return nil
}

func (w *sim) Upgrade(key string) error {
	in := w.inst[key]
	if in == nil {
		return fmt.Errorf("%s is not running", key)
	}
	if err := w.Delete(key); err != nil {
		return err
	}
	return w.Create(key, in.node)
}

func (w *sim) Move(key, to string) error {
	if err := w.Delete(key); err != nil {
		return err
	}
	return w.Create(key, to)
}

// Migrate releases the source's lease (its token stays), promotes a new
// instance on to with the next token, then deletes the source.
func (w *sim) Migrate(key, to string) error {
	in := w.inst[key]
	if in == nil {
		return fmt.Errorf("%s is not running", key)
	}
	if l := w.leases[key]; l.holder == in.node+"/"+in.cid {
		l.holder, l.available = "", false
	}
	w.advance(sampleEvery)
	return w.Move(key, to)
}

func (w *sim) Flip(key string, available bool) error {
	in := w.inst[key]
	if in == nil {
		return fmt.Errorf("%s is not running", key)
	}
	w.leases[key].available = available
	w.advance(sampleEvery)
	return nil
}

func (w *sim) KillPlugin(key, node, verb string, after time.Duration) error {
	if verb == "del" {
		return w.Delete(key)
	}
	return w.Create(key, node)
}

func (w *sim) StopRouter(node string, sig syscall.Signal) error {
	w.nodes[node].router = false
	return nil
}
func (w *sim) StartRouter(node string) error                { w.nodes[node].router = true; return nil }
func (w *sim) StopGC(node string, sig syscall.Signal) error { w.nodes[node].gc = false; return nil }
func (w *sim) StartGC(node string) error                    { w.nodes[node].gc = true; return nil }

func (w *sim) takeover(moves map[string]string) error {
	for _, key := range sortedKeys(moves) {
		if err := w.Create(key, moves[key]); err != nil {
			return err
		}
	}
	return nil
}

func (w *sim) Crash(node string, moves map[string]string) error {
	n := w.nodes[node]
	n.up, n.api, n.router, n.gc = false, false, false, false
	for key, in := range w.inst {
		if in.node == node {
			delete(w.alive, in.cid)
			delete(w.inst, key)
		}
	}
	return w.takeover(moves)
}

func (w *sim) Return(node string) error {
	n := w.nodes[node]
	n.up, n.api, n.router, n.gc = true, true, true, true
	return nil
}

func (w *sim) CutOff(node string, moves map[string]string) error {
	w.nodes[node].api = false
	for key, in := range w.inst {
		if in.node == node {
			w.stale = append(w.stale, in)
			delete(w.inst, key)
		}
	}
	return w.takeover(moves)
}

func (w *sim) Reconnect(node string) error {
	w.nodes[node].api = true
	for _, in := range w.stale {
		w.stop(in)
	}
	w.stale = nil
	return nil
}

func (w *sim) SetAPI(up bool) error {
	for _, n := range w.nodes {
		if n.up {
			n.api = up
		}
	}
	return nil
}

func (w *sim) StopReflector() error  { w.reflector = false; return nil }
func (w *sim) StartReflector() error { w.reflector = true; return nil }
func (w *sim) SetLoss(int) error     { return nil }
