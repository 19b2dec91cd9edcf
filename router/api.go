package router

import (
	"context"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// apiStage is the router's view of the API server: informers of the
// node's advertisements, of the leases its holders hold and of the
// VPCAttachments, whose lists and watches are retried every
// reconnectEvery while the server cannot be reached. Until they sync a
// pass keeps what it has.
type apiStage struct {
	node, namespace string
	judge           Judge
	clock           clock.Clock
	// kick starts a pass; leaseEvents counts the lease watch's events.
	kick        func()
	leaseEvents prometheus.Counter
	adv, lease  cache.SharedIndexInformer
	// att caches every VPCAttachment, slimmed to what a judgement reads
	// and indexed by UID; nil without an attachment client.
	att cache.SharedIndexInformer
	// events counts the informers' events that can change what is
	// announced; listed is the last listing of the advertisements.
	events atomic.Uint64
	listed struct {
		adverts          []*v1alpha1.BGPAdvertisement
		vnis             map[string]uint32
		events, savedGen uint64
	}
}

// start runs the informers until ctx ends.
func (a *apiStage) start(ctx context.Context, o Options) error {
	// The router's own status writes come back as updates: only a changed
	// spec or labels can change what is announced.
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { a.changed() },
		UpdateFunc: func(o, n any) {
			x, okX := o.(*v1alpha1.BGPAdvertisement)
			y, okY := n.(*v1alpha1.BGPAdvertisement)
			if okX && okY && x.Generation == y.Generation && x.Generation != 0 && maps.Equal(x.Labels, y.Labels) {
				return
			}
			a.changed()
		},
		DeleteFunc: func(any) { a.changed() },
	}
	a.adv = cache.NewSharedIndexInformer(listWatch(a.clock, o.Adverts.List, o.Adverts.Watch, names.NodeSelector(a.node)),
		&v1alpha1.BGPAdvertisement{}, 0, cache.Indexers{byAttachmentUID: advertUIDs})
	if _, err := a.adv.AddEventHandler(handler); err != nil {
		return err
	}
	go a.adv.RunWithContext(ctx)
	if err := a.startAttachments(ctx, o.Attachments); err != nil {
		return err
	}
	if o.Leases == nil || o.LeaseSelector == "" {
		return nil
	}
	a.lease = cache.NewSharedIndexInformer(listWatch(a.clock, o.Leases.List, o.Leases.Watch, o.LeaseSelector),
		&coordinationv1.Lease{}, 0, cache.Indexers{})
	counted := func() { a.leaseEvents.Inc(); a.changed() }
	// A renewal changes only the renew time, which no judgement reads.
	leaseHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { counted() },
		UpdateFunc: func(o, n any) {
			x, okX := o.(*coordinationv1.Lease)
			y, okY := n.(*coordinationv1.Lease)
			if okX && okY && sameJudgement(x, y) {
				return
			}
			counted()
		},
		DeleteFunc: func(any) { counted() },
	}
	if _, err := a.lease.AddEventHandler(leaseHandler); err != nil {
		return err
	}
	go a.lease.RunWithContext(ctx)
	return nil
}

// changed notes an informer event that can change what is announced and
// starts a pass.
func (a *apiStage) changed() {
	a.events.Add(1)
	a.kick()
}

func (a *apiStage) synced() bool {
	return a.adv.HasSynced() && (a.lease == nil || a.lease.HasSynced()) && (a.att == nil || a.att.HasSynced())
}

func (a *apiStage) adverts() []*v1alpha1.BGPAdvertisement {
	var out []*v1alpha1.BGPAdvertisement
	for _, o := range a.adv.GetStore().List() {
		if adv, ok := o.(*v1alpha1.BGPAdvertisement); ok && adv.Spec.Node == a.node {
			out = append(out, adv)
		}
	}
	return out
}

// list is the node's advertisements and the VPCs' VNIs (from the saved
// ones, savedGen the count of saves), listed again only when the
// informers saw a change, the saved VNIs changed or on a resync (full);
// moved says whether they were. Until the informers sync it is the saved
// VNIs alone.
func (a *apiStage) list(synced, full bool, saved map[string]uint32, savedGen uint64) (adverts []*v1alpha1.BGPAdvertisement, vnis map[string]uint32, moved bool) {
	if !synced {
		return nil, saved, false
	}
	ev := a.events.Load()
	if full || a.listed.adverts == nil || ev != a.listed.events || a.listed.savedGen != savedGen {
		a.listed.adverts = a.adverts()
		a.listed.vnis = ResolveVNIs(Granted(a.listed.adverts, a.lookup()), saved)
		a.listed.events, a.listed.savedGen = ev, savedGen
		moved = true
	}
	return a.listed.adverts, a.listed.vnis, moved
}

// available judges a whenAvailable advertisement from the lease of its
// attachment, as cached by the lease watch.
func (a *apiStage) available(adv *v1alpha1.BGPAdvertisement, e v1alpha1.ContainerEntry) (metav1.ConditionStatus, string, string) {
	if a.judge == nil || a.lease == nil {
		return metav1.ConditionUnknown, "NoLeaseWatch", "the router does not watch handoff leases"
	}
	var lease *coordinationv1.Lease
	if o, ok, _ := a.lease.GetStore().GetByKey(a.namespace + "/" + names.Lease(adv.Spec.VPC, adv.Spec.Attachment)); ok {
		lease, _ = o.(*coordinationv1.Lease)
	}
	return judgeLease(a.judge, lease, adv, names.Holder(a.node, e.ContainerID), e.HolderGeneration)
}

// judgeLease judges holder by lease when the lease is the advertisement's
// attachment's (its attachment-uid label the advertisement's, both absent
// when inline). Another's, a predecessor's say, is judged as no lease at
// all: it never makes this attachment's holder available.
func judgeLease(judge Judge, lease *coordinationv1.Lease, adv *v1alpha1.BGPAdvertisement, holder string, token int64) (metav1.ConditionStatus, string, string) {
	if lease == nil || lease.Labels[v1alpha1.LabelAttachmentUID] == AttachmentUID(adv) {
		return judge(lease, holder, token)
	}
	status, reason, _ := judge(nil, holder, token)
	return status, reason, fmt.Sprintf("lease %s is VPCAttachment UID %q's, not this advertisement's %q",
		lease.Name, lease.Labels[v1alpha1.LabelAttachmentUID], AttachmentUID(adv))
}

// sameJudgement reports whether two versions of a lease judge a holder
// alike: same holder, token and annotations.
func sameJudgement(a, b *coordinationv1.Lease) bool {
	return ptrEqual(a.Spec.HolderIdentity, b.Spec.HolderIdentity) && ptrEqual(a.Spec.LeaseTransitions, b.Spec.LeaseTransitions) &&
		maps.Equal(a.Annotations, b.Annotations) && maps.Equal(a.Labels, b.Labels)
}

func ptrEqual[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func listWatch[T runtime.Object](clk clock.Clock, list func(context.Context, metav1.ListOptions) (T, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error), selector string) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return untilReached(ctx, clk, reconnectEvery, func(ctx context.Context) (T, error) { return list(ctx, o) })
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return untilReached(ctx, clk, reconnectEvery, func(ctx context.Context) (watch.Interface, error) { return w(ctx, o) })
		},
	}
}

// reconnectEvery is how often a list or watch is retried while the API
// server cannot be reached.
const reconnectEvery = 500 * time.Millisecond

// untilReached retries call every interval while it fails for want of the
// API server (connection errors, timeouts, 5xx, 429), so an informer
// resyncs within an interval of the server's return. An informer that
// sees those failures backs off exponentially up to 30 s before it asks
// again, and what changed right after an outage (an upgrade's new entry)
// would wait that long. Other errors are returned.
func untilReached[T any](ctx context.Context, clk clock.Clock, interval time.Duration, call func(context.Context) (T, error)) (T, error) {
	for {
		v, err := call(ctx)
		if err == nil || !unreachable(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-clk.After(interval):
		}
	}
}

func unreachable(err error) bool {
	if apierrors.ReasonForError(err) == metav1.StatusReasonUnknown {
		// Not a status from the server: it was not reached.
		return true
	}
	return apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err)
}
