package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
)

// Options configure a Controller.
type Options struct {
	// Clients reach the API server.
	Clients *client.Clients
	// Namespace holds the handoff leases and advertisements (the nodes'
	// namespace, galactic-system).
	Namespace string
	// VNIMin and VNIMax bound the VNIs the controller allocates; a
	// requested VNI may lie outside.
	VNIMin, VNIMax int32
	// VNIHold is how long a released VNI is kept from reuse.
	VNIHold time.Duration
	// Workers reconcile attachments in parallel (VPCs, addresses and VNIs
	// get fewer).
	Workers int
	// Resync re-queues every object this often, as a safety net; 0 never.
	Resync time.Duration
	// StatusBatch is how long a change of a lease or an advertisement
	// waits before the controller projects it into its attachment's
	// status (holder, HolderAvailable, Programmed): the changes of one
	// CNI operation, and an ADD and DEL that undo each other, make at most
	// one status write, after the operation. An attachment being deleted
	// is not delayed. 0 projects at once.
	StatusBatch time.Duration
	Log         *slog.Logger
	// Clock is nil for the real one.
	Clock clock.WithTicker
	// Metrics is nil for a fresh registry.
	Metrics *Metrics
}

// Defaults of Options.
const (
	DefaultVNIMin  = 100000
	DefaultVNIMax  = 16777215
	DefaultVNIHold = 10 * time.Minute
	// DefaultWorkers: an attachment's writes are sequential round trips,
	// so a burst of creates finishes sooner with more of them in flight
	// while the API server has CPU to spare.
	DefaultWorkers = 16
	// DefaultStatusBatch outlasts a CNI ADD or DEL, whose API round trips
	// the status write would otherwise compete with.
	DefaultStatusBatch = time.Second
)

// Controller reconciles VPCs, VPCAttachments, VPCAddresses and VNIs.
// Its informers run from Start, leader or not, so a standby takes over
// with a warm cache; its workers run only in Lead.
type Controller struct {
	o     Options
	log   *slog.Logger
	clock clock.WithTicker
	m     *Metrics

	vpcInf, attInf, addrInf, vniInf, leaseInf, advInf cache.SharedIndexInformer
	synced                                            atomic.Bool

	vpcQ, attQ, addrQ, vniQ workqueue.TypedRateLimitingInterface[string]

	attWrites *overlay[*v1alpha1.VPCAttachment]
	vpcWrites *overlay[*v1alpha1.VPC]
	addrClaim *claims[v1alpha1.VPCAddress]
	vniClaim  *claims[v1alpha1.VNI]
	leaseSeen observations
	// poolWait are attachments waiting for an address of a VPC to be
	// freed (group: the VPC's key); vniWait VPCs waiting for a VNI.
	poolWait, vniWait waiters
	pools             pools
	attUIDs           uids

	leading atomic.Bool
	// events counts informer events, for trimMemory.
	events atomic.Uint64
}

// Index names of the informers.
const (
	byVPC           = "vpc"           // attachments: "<namespace>/<spec.vpc>"
	byUID           = "uid"           // VPCs: metadata.uid
	byAttachmentUID = "attachmentUID" // addresses, leases, advertisements: the label
	byVPCUID        = "vpcUID"        // addresses: the label; VNIs: spec.vpcUID
	byRetained      = "retained"      // Retained addresses: "<vpcUID>/<spec.attachment>"
	byVNI           = "vni"           // advertisements: spec.vni
)

// New builds a controller; nothing runs before Start.
func New(o Options) (*Controller, error) {
	if o.Clients == nil {
		return nil, errors.New("controller: no API clients")
	}
	if o.Namespace == "" {
		return nil, errors.New("controller: the galactic namespace is empty")
	}
	if o.VNIMin == 0 && o.VNIMax == 0 {
		o.VNIMin, o.VNIMax = DefaultVNIMin, DefaultVNIMax
	}
	if o.VNIMin < 1 || o.VNIMax > DefaultVNIMax || o.VNIMin > o.VNIMax {
		return nil, fmt.Errorf("controller: VNI range %d-%d is not within 1-%d", o.VNIMin, o.VNIMax, DefaultVNIMax)
	}
	if o.VNIHold < 0 {
		return nil, fmt.Errorf("controller: VNI hold %s is negative", o.VNIHold)
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	c := &Controller{o: o, log: o.Log, clock: o.Clock, m: o.Metrics,
		attWrites: newOverlay[*v1alpha1.VPCAttachment](), vpcWrites: newOverlay[*v1alpha1.VPC](),
		addrClaim: newClaims[v1alpha1.VPCAddress](o.Clock.Now), vniClaim: newClaims[v1alpha1.VNI](o.Clock.Now),
	}
	// Retries back off from 10 ms to 30 s: an API error is retried soon,
	// and nothing that keeps failing waits longer than half a minute.
	limiter := func() workqueue.TypedRateLimiter[string] {
		return workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, 30*time.Second)
	}
	q := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(limiter(), workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	c.vpcQ, c.attQ, c.addrQ, c.vniQ = q("vpcs"), q("vpcattachments"), q("vpcaddresses"), q("vnis")
	c.m.queues(map[string]workqueue.TypedRateLimitingInterface[string]{
		"VPC": c.vpcQ, "VPCAttachment": c.attQ, "VPCAddress": c.addrQ, "VNI": c.vniQ})
	c.m.leader(&c.leading)

	cs := o.Clients
	c.vpcInf = informer(cs.VPCs(""), &v1alpha1.VPC{}, o.Resync, cache.Indexers{byUID: uidIndex})
	c.attInf = informer(cs.VPCAttachments(""), &v1alpha1.VPCAttachment{}, o.Resync, cache.Indexers{byVPC: func(obj any) ([]string, error) {
		a := obj.(*v1alpha1.VPCAttachment)
		return []string{a.Namespace + "/" + a.Spec.VPC}, nil
	}})
	c.addrInf = informer(cs.VPCAddresses(""), &v1alpha1.VPCAddress{}, o.Resync, cache.Indexers{
		byAttachmentUID: labelIndex(v1alpha1.LabelAttachmentUID),
		byVPCUID:        labelIndex(v1alpha1.LabelVPCUID),
		byRetained: func(obj any) ([]string, error) {
			a := obj.(*v1alpha1.VPCAddress)
			if a.Spec.State != v1alpha1.AddressRetained {
				return nil, nil
			}
			return []string{string(a.Spec.VPCUID) + "/" + a.Spec.Attachment}, nil
		}})
	c.vniInf = informer(cs.VNIs(), &v1alpha1.VNI{}, o.Resync, cache.Indexers{byVPCUID: func(obj any) ([]string, error) {
		return []string{string(obj.(*v1alpha1.VNI).Spec.VPCUID)}, nil
	}})
	// Only the leases of object-backed attachments: the leader election
	// lease and inline attachments' leases carry no attachment UID.
	c.leaseInf = selectedInformer(cs.Leases(o.Namespace), &coordinationv1.Lease{}, o.Resync, v1alpha1.LabelAttachmentUID,
		cache.Indexers{byAttachmentUID: labelIndex(v1alpha1.LabelAttachmentUID)})
	c.advInf = informer(cs.BGPAdvertisements(o.Namespace), &v1alpha1.BGPAdvertisement{}, o.Resync, cache.Indexers{
		byAttachmentUID: labelIndex(v1alpha1.LabelAttachmentUID),
		byVNI: func(obj any) ([]string, error) {
			if v := obj.(*v1alpha1.BGPAdvertisement).Spec.VNI; v != 0 {
				return []string{strconv.Itoa(int(v))}, nil
			}
			return nil, nil
		}})
	if err := c.handle(); err != nil {
		return nil, err
	}
	c.m.Registry.MustRegister(readiness{
		desc: prometheus.NewDesc(metricsNamespace+"_objects", "VPCs and VPCAttachments in the controller's cache, by kind and Ready reason (empty before the controller wrote one).",
			[]string{"kind", "reason"}, nil),
		count: c.countReady,
	})
	return c, nil
}

// lister is the part of a typed client an informer needs.
type lister[T, L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

func informer[T, L runtime.Object](cl lister[T, L], example T, resync time.Duration, idx cache.Indexers) cache.SharedIndexInformer {
	return selectedInformer(cl, example, resync, "", idx)
}

// selectedInformer watches the objects with a label selector (empty: all)
// and keeps them slimmed (slim).
func selectedInformer[T, L runtime.Object](cl lister[T, L], example T, resync time.Duration, selector string, idx cache.Indexers) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return cl.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return cl.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, example, resync, idx)
	_ = inf.SetTransform(slim)
	return inf
}

func uidIndex(obj any) ([]string, error) {
	return []string{string(obj.(metav1.Object).GetUID())}, nil
}

func labelIndex(label string) cache.IndexFunc {
	return func(obj any) ([]string, error) {
		if v := obj.(metav1.Object).GetLabels()[label]; v != "" {
			return []string{v}, nil
		}
		return nil, nil
	}
}

// Start runs the informers until ctx ends; Synced reports when their
// caches are filled.
func (c *Controller) Start(ctx context.Context) {
	infs := []cache.SharedIndexInformer{c.vpcInf, c.attInf, c.addrInf, c.vniInf, c.leaseInf, c.advInf}
	for _, inf := range infs {
		go inf.RunWithContext(ctx)
	}
	go func() {
		synced := make([]cache.InformerSynced, len(infs))
		for i, inf := range infs {
			synced[i] = inf.HasSynced
		}
		if cache.WaitForCacheSync(ctx.Done(), synced...) {
			c.synced.Store(true)
			c.log.Info("caches synced")
		}
	}()
	go c.trimMemory(ctx)
	go func() {
		<-ctx.Done()
		for _, q := range []workqueue.TypedRateLimitingInterface[string]{c.vpcQ, c.attQ, c.addrQ, c.vniQ} {
			q.ShutDown()
		}
	}()
}

// Memory a burst leaves behind is returned to the system once the
// controller has been idle for trimIdle after at least trimAfter events:
// otherwise the heap keeps the size the burst needed until the runtime's
// slow scavenger gets to it.
const (
	trimIdle  = 5 * time.Second
	trimAfter = 1000
)

func (c *Controller) trimMemory(ctx context.Context) {
	t := c.clock.NewTicker(trimIdle)
	defer t.Stop()
	var seen, trimmed uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		c.addrClaim.sweep()
		c.vniClaim.sweep()
		n := c.events.Load()
		idle := n == seen && c.attQ.Len() == 0 && c.vpcQ.Len() == 0 && c.addrQ.Len() == 0
		if idle && n-trimmed >= trimAfter {
			debug.FreeOSMemory()
			var ms goruntime.MemStats
			goruntime.ReadMemStats(&ms)
			c.log.Info("idle after a burst: returned free memory to the system", "events", n-trimmed,
				"heapInUse", ms.HeapInuse, "heapReleased", ms.HeapReleased, "sys", ms.Sys)
			trimmed = n
		}
		seen = n
	}
}

// Synced reports whether every cache has been filled.
func (c *Controller) Synced() bool { return c.synced.Load() }

// Lead reconciles until ctx ends: what a leader does. It waits for the
// caches first, and queues every object once, since the previous leader
// may have stopped anywhere.
func (c *Controller) Lead(ctx context.Context) {
	c.leading.Store(true)
	defer c.leading.Store(false)
	for !c.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-c.clock.After(20 * time.Millisecond):
		}
	}
	c.log.Info("leading: reconciling")
	for _, k := range c.vpcInf.GetStore().ListKeys() {
		c.vpcQ.Add(k)
	}
	for _, k := range c.attInf.GetStore().ListKeys() {
		c.attQ.Add(k)
	}
	for _, k := range c.addrInf.GetStore().ListKeys() {
		c.addrQ.Add(k)
	}
	for _, k := range c.vniInf.GetStore().ListKeys() {
		c.vniQ.Add(k)
	}
	var wg sync.WaitGroup
	run := func(q workqueue.TypedRateLimitingInterface[string], kind string, n int, sync func(context.Context, string) (time.Duration, error)) {
		for range n {
			wg.Go(func() { c.work(ctx, q, kind, sync) })
		}
	}
	run(c.vpcQ, "VPC", 2, c.syncVPC)
	run(c.attQ, "VPCAttachment", c.o.Workers, c.syncAttachment)
	run(c.addrQ, "VPCAddress", 2, c.syncAddress)
	run(c.vniQ, "VNI", 1, c.syncVNI)
	<-ctx.Done()
	wg.Wait()
}

// work processes one queue until ctx ends. A sync that fails is retried
// with backoff; one that panics is logged and retried the same way, so no
// object can stop the controller.
func (c *Controller) work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], kind string, sync func(context.Context, string) (time.Duration, error)) {
	stop := context.AfterFunc(ctx, q.ShutDown)
	defer stop()
	for {
		key, quit := q.Get()
		if quit || ctx.Err() != nil {
			if !quit {
				q.Done(key)
			}
			return
		}
		start := c.clock.Now()
		after, err := c.safely(ctx, kind, key, sync)
		c.m.reconciled(kind, c.clock.Since(start), err)
		switch {
		case err != nil:
			c.log.Warn("reconcile failed; retrying", "kind", kind, "key", key, "error", err)
			q.AddRateLimited(key)
		default:
			q.Forget(key)
			if after > 0 {
				q.AddAfter(key, after)
			}
		}
		q.Done(key)
	}
}

func (c *Controller) safely(ctx context.Context, kind, key string, sync func(context.Context, string) (time.Duration, error)) (after time.Duration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic reconciling %s %s: %v", kind, key, r)
		}
	}()
	return sync(ctx, key)
}

// key is the cache key of a namespaced object.
func key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// byIndex returns the cached objects of an index value, typed.
func byIndex[T any](inf cache.SharedIndexInformer, index, value string) []T {
	objs, err := inf.GetIndexer().ByIndex(index, value)
	if err != nil {
		return nil
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// cached returns the cached object of key, typed; nil when absent.
func cached[T any](inf cache.SharedIndexInformer, k string) *T {
	obj, ok, err := inf.GetIndexer().GetByKey(k)
	if err != nil || !ok {
		return nil
	}
	t, _ := obj.(*T)
	return t
}

// attachmentByUID is the cached attachment of a UID.
func (c *Controller) attachmentByUID(uid types.UID) *v1alpha1.VPCAttachment {
	k, ok := c.attUIDs.get(uid)
	if !ok {
		return nil
	}
	if a := cached[v1alpha1.VPCAttachment](c.attInf, k); a != nil && a.UID == uid {
		return a
	}
	return nil
}
