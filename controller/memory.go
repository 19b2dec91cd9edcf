package controller

import (
	"net/netip"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What the controller remembers beside the informers' caches: its own
// writes the caches have not shown yet, and a few hints. None of it is
// authoritative; each piece only avoids a write the cache would make
// look necessary, or a claim the API server would refuse.

// claimTTL bounds how long a claim the cache never showed is believed.
const claimTTL = 2 * time.Minute

// claims are values (VPCAddress or VNI object keys) this process claimed,
// or learnt are taken, before its cache showed them.
type claims[T any] struct {
	mu      sync.Mutex
	m       map[string]claim[T]
	byOwner map[types.UID]map[string]struct{}
	now     func() time.Time
}

type claim[T any] struct {
	owner types.UID
	// obj is the created object; nil while the create is in flight or
	// when the value is only known to be taken.
	obj *T
	at  time.Time
}

func newClaims[T any](now func() time.Time) *claims[T] {
	return &claims[T]{m: map[string]claim[T]{}, byOwner: map[types.UID]map[string]struct{}{}, now: now}
}

// reserve marks key as being claimed for owner; false when it is already.
func (c *claims[T]) reserve(key string, owner types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.get(key); ok {
		return false
	}
	c.put(key, claim[T]{owner: owner, at: c.now()})
	return true
}

// created records the object a claim made.
func (c *claims[T]) created(key string, owner types.UID, obj *T) {
	_, _ = slim(any(obj))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(key, claim[T]{owner: owner, obj: obj, at: c.now()})
}

// taken records that someone else holds key (the API server said so).
func (c *claims[T]) taken(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.put(key, claim[T]{at: c.now()})
}

// drop forgets key: its create failed, or the cache shows it now.
func (c *claims[T]) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remove(key)
}

// has reports whether key is claimed or known taken.
func (c *claims[T]) has(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.get(key)
	return ok
}

// owned are the objects created for owner that the cache has not shown.
func (c *claims[T]) owned(owner types.UID) []*T {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*T
	for key := range c.byOwner[owner] {
		if cl, ok := c.get(key); ok && cl.obj != nil {
			out = append(out, cl.obj)
		}
	}
	return out
}

func (c *claims[T]) get(key string) (claim[T], bool) {
	cl, ok := c.m[key]
	if ok && c.now().Sub(cl.at) > claimTTL {
		c.remove(key)
		return cl, false
	}
	return cl, ok
}

func (c *claims[T]) put(key string, cl claim[T]) {
	c.remove(key)
	c.m[key] = cl
	if cl.owner != "" {
		if c.byOwner[cl.owner] == nil {
			c.byOwner[cl.owner] = map[string]struct{}{}
		}
		c.byOwner[cl.owner][key] = struct{}{}
	}
}

func (c *claims[T]) remove(key string) {
	if cl, ok := c.m[key]; ok {
		delete(c.m, key)
		if o := c.byOwner[cl.owner]; o != nil {
			delete(o, key)
			if len(o) == 0 {
				delete(c.byOwner, cl.owner)
			}
		}
	}
	// A map never shrinks: once a burst is over, start small again.
	if len(c.m) == 0 {
		c.m, c.byOwner = map[string]claim[T]{}, map[types.UID]map[string]struct{}{}
	}
}

// sweep forgets the claims the cache never showed within claimTTL.
func (c *claims[T]) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.m {
		c.get(key)
	}
}

// overlay keeps the objects this process wrote until the cache shows
// them, so a pass that runs before the watch delivers its own write does
// not write again. An entry answers for the resourceVersions it replaced;
// any other version in the cache is newer, and wins.
type overlay[T metav1.Object] struct {
	mu sync.Mutex
	m  map[string]overlayEntry[T]
}

type overlayEntry[T metav1.Object] struct {
	replaced map[string]bool
	obj      T
}

func newOverlay[T metav1.Object]() *overlay[T] {
	return &overlay[T]{m: map[string]overlayEntry[T]{}}
}

// wrote records that the write of key over resourceVersion old returned obj.
func (o *overlay[T]) wrote(key, old string, obj T) {
	_, _ = slim(any(obj))
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.m[key]
	if !ok || e.obj.GetResourceVersion() != old {
		e = overlayEntry[T]{replaced: map[string]bool{}}
	}
	e.replaced[old] = true
	e.obj = obj
	o.m[key] = e
}

// resolve returns the newest known version of key: ours while the cache
// still holds one our writes replaced, else the cache's.
func (o *overlay[T]) resolve(key string, cached T) T {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.m[key]
	if !ok {
		return cached
	}
	if e.replaced[cached.GetResourceVersion()] {
		return e.obj
	}
	o.remove(key)
	return cached
}

func (o *overlay[T]) forget(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.remove(key)
}

func (o *overlay[T]) remove(key string) {
	delete(o.m, key)
	if len(o.m) == 0 {
		o.m = map[string]overlayEntry[T]{}
	}
}

// observations are when this process first saw each lease's current
// version: a holder's expiry is judged by this process's clock from
// there, never by the writer's timestamps.
type observations struct {
	mu sync.Mutex
	m  map[string]observation
}

type observation struct {
	rv   string
	seen time.Time
}

func (o *observations) observe(key, rv string, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]observation{}
	}
	if cur, ok := o.m[key]; !ok || cur.rv != rv {
		o.m[key] = observation{rv: rv, seen: now}
	}
}

// seen is when key's version rv was first seen; now when it was not.
func (o *observations) seen(key, rv string, now time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if cur, ok := o.m[key]; ok && cur.rv == rv {
		return cur.seen
	}
	return now
}

func (o *observations) forget(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, key)
}

// waiters are keys waiting for something of a group to change: the
// attachments of a VPC waiting for a free address, the VPCs waiting for
// a VNI to be released.
type waiters struct {
	mu sync.Mutex
	m  map[string]map[string]struct{}
}

func (w *waiters) set(group, key string, waiting bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]map[string]struct{}{}
	}
	if !waiting {
		if g := w.m[group]; g != nil {
			delete(g, key)
			if len(g) == 0 {
				delete(w.m, group)
			}
		}
		return
	}
	if w.m[group] == nil {
		w.m[group] = map[string]struct{}{}
	}
	w.m[group][key] = struct{}{}
}

// take returns the group's waiting keys and forgets them: each is
// reconciled, and waits again if it must.
func (w *waiters) take(group string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.m[group]
	delete(w.m, group)
	out := make([]string, 0, len(g))
	for k := range g {
		out = append(out, k)
	}
	return out
}

// pools serialise the choice of a new address per VPC inside this
// process and remember where the lowest free address may be, so that a
// burst of attachments neither collides on one candidate nor rescans the
// taken ones each time.
type pools struct {
	mu sync.Mutex
	m  map[types.UID]*pool
}

type pool struct {
	mu sync.Mutex
	// hints are, per network, an address at or below the lowest free one.
	hints map[netip.Prefix]netip.Addr
}

func (p *pools) get(vpc types.UID) *pool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[types.UID]*pool{}
	}
	if p.m[vpc] == nil {
		p.m[vpc] = &pool{hints: map[netip.Prefix]netip.Addr{}}
	}
	return p.m[vpc]
}

// reset forgets a VPC's hints: an address of it was freed.
func (p *pools) reset(vpc types.UID) {
	p.mu.Lock()
	pl := p.m[vpc]
	p.mu.Unlock()
	if pl != nil {
		pl.mu.Lock()
		clear(pl.hints)
		pl.mu.Unlock()
	}
}

// forget drops a deleted VPC's pool.
func (p *pools) forget(vpc types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, vpc)
}

// uids map attachment UIDs to their cache keys: what leases, addresses
// and advertisements name an attachment by. One map instead of an
// informer index, whose one set per value would cost more than the
// attachment.
type uids struct {
	mu sync.RWMutex
	m  map[types.UID]string
}

func (u *uids) set(uid types.UID, key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[types.UID]string{}
	}
	u.m[uid] = key
}

func (u *uids) drop(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, uid)
}

func (u *uids) get(uid types.UID) (string, bool) {
	u.mu.RLock()
	defer u.mu.RUnlock()
	k, ok := u.m[uid]
	return k, ok
}
