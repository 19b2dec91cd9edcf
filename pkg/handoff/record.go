package handoff

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// Record is the handoff state of one Lease, flat and free of API types.
type Record struct {
	// HolderIdentity is "<node>/<containerID>"; empty when the lease is free.
	HolderIdentity string
	// LeaseDurationSeconds is how long the holder may go without renewing.
	LeaseDurationSeconds int32
	// AcquireTime and RenewTime are the writer's clock readings. Other
	// machines use them only as a change signal, never as a clock.
	AcquireTime time.Time
	RenewTime   time.Time
	// LeaseTransitions counts acquisitions: the fencing token.
	LeaseTransitions int32
	// Report is the holder's availability report (the lease's annotations).
	Report Report
	// Identity is the VPCAttachment the lease belongs to (its labels);
	// zero for an inline attachment's lease.
	Identity Identity
}

// Identity is a VPCAttachment's namespace and UID. A lease of one UID is
// never taken, renewed or released for another.
type Identity struct {
	Namespace string
	UID       string
}

func identityFromLabels(l map[string]string) Identity {
	return Identity{Namespace: l[v1alpha1.LabelNamespace], UID: l[v1alpha1.LabelAttachmentUID]}
}

// Observed is a Record as read from or written to the API, with the
// resourceVersion that guards the next write.
type Observed struct {
	Record          Record
	ResourceVersion string
}

// Store reads and writes the one Lease a Lock guards. Errors follow the API
// server's: Get of a missing lease is NotFound, Create of an existing one
// AlreadyExists, and Update with a stale resourceVersion Conflict (NotFound
// when the lease is gone), as told by k8s.io/apimachinery/pkg/api/errors.
type Store interface {
	Get(ctx context.Context) (Observed, error)
	Create(ctx context.Context, r Record) (Observed, error)
	Update(ctx context.Context, resourceVersion string, r Record) (Observed, error)
}

// Watcher is a Store that can also watch its lease. Watch reports the
// changes after resourceVersion on the returned channel: each report is
// the lease as the change left it, or an Observed without a
// resourceVersion when it is gone (read it again). Reports not yet taken
// are replaced by newer ones. The channel is closed when the watch ends,
// by an error of the API server or ctx ending.
type Watcher interface {
	Watch(ctx context.Context, resourceVersion string) (<-chan Observed, error)
}

// RecordFromSpec converts a Lease spec into a Record; absent fields read as
// zero values.
func RecordFromSpec(spec coordinationv1.LeaseSpec) Record {
	var r Record
	if spec.HolderIdentity != nil {
		r.HolderIdentity = *spec.HolderIdentity
	}
	if spec.LeaseDurationSeconds != nil {
		r.LeaseDurationSeconds = *spec.LeaseDurationSeconds
	}
	if spec.AcquireTime != nil {
		r.AcquireTime = spec.AcquireTime.Time
	}
	if spec.RenewTime != nil {
		r.RenewTime = spec.RenewTime.Time
	}
	if spec.LeaseTransitions != nil {
		r.LeaseTransitions = *spec.LeaseTransitions
	}
	return r
}

// SpecFromRecord converts a Record into a Lease spec. Zero values become
// absent fields, so a free lease carries no holderIdentity at all.
func SpecFromRecord(r Record) coordinationv1.LeaseSpec {
	var spec coordinationv1.LeaseSpec
	if r.HolderIdentity != "" {
		spec.HolderIdentity = &r.HolderIdentity
	}
	if r.LeaseDurationSeconds != 0 {
		spec.LeaseDurationSeconds = &r.LeaseDurationSeconds
	}
	if !r.AcquireTime.IsZero() {
		spec.AcquireTime = &metav1.MicroTime{Time: r.AcquireTime}
	}
	if !r.RenewTime.IsZero() {
		spec.RenewTime = &metav1.MicroTime{Time: r.RenewTime}
	}
	if r.LeaseTransitions != 0 {
		spec.LeaseTransitions = &r.LeaseTransitions
	}
	return spec
}

// RecordFromLease converts a Lease: its spec and its availability
// annotations.
func RecordFromLease(l *coordinationv1.Lease) Record {
	r := RecordFromSpec(l.Spec)
	r.Report = reportFromAnnotations(l.Annotations)
	r.Identity = identityFromLabels(l.Labels)
	return r
}

// ObservedFromLease converts a Lease read from the API.
func ObservedFromLease(l *coordinationv1.Lease) Observed {
	return Observed{Record: RecordFromLease(l), ResourceVersion: l.ResourceVersion}
}

// LeaseFromRecord builds the Lease object that stores r; resourceVersion
// empty means an unconditional object (for Create). A held lease is
// labelled with its holder's node (names.LabelHolderNode), a free one is
// not; an object-backed attachment's lease carries its identity labels,
// held or free.
func LeaseFromRecord(namespace, name, resourceVersion string, r Record) *coordinationv1.Lease {
	labels := names.IdentityLabels(r.Identity.Namespace, r.Identity.UID)
	if node, _, ok := names.ParseHolder(r.HolderIdentity); ok {
		if labels == nil {
			labels = map[string]string{}
		}
		labels[names.LabelHolderNode] = names.NodeLabelValue(node)
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, ResourceVersion: resourceVersion,
			Labels: labels, Annotations: annotationsFromReport(r.Report),
		},
		Spec: SpecFromRecord(r),
	}
}

// leaseStore is the Store over the API server; it is a Watcher when its
// client can watch.
type leaseStore struct {
	leases          LeaseClient
	namespace, name string
}

// leaseWatcher is a Lease client that can watch, as client-go's typed
// clients and client.Clients.Leases can.
type leaseWatcher interface {
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// watchingStore is a leaseStore whose client watches.
type watchingStore struct {
	*leaseStore
	watcher leaseWatcher
}

// Watch watches the one lease by name from resourceVersion.
func (s watchingStore) Watch(ctx context.Context, resourceVersion string) (<-chan Observed, error) {
	w, err := s.watcher.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", s.name).String(),
		ResourceVersion: resourceVersion,
	})
	if err != nil {
		return nil, err
	}
	changes := make(chan Observed, 1)
	go func() {
		defer close(changes)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok || ev.Type == watch.Error {
					return
				}
				var o Observed
				if l, isLease := ev.Object.(*coordinationv1.Lease); isLease && ev.Type != watch.Deleted {
					o = ObservedFromLease(l)
				}
				// The newest report replaces one not taken yet.
				select {
				case <-changes:
				default:
				}
				changes <- o
			}
		}
	}()
	return changes, nil
}

func (s *leaseStore) Get(ctx context.Context) (Observed, error) {
	return s.get(ctx, metav1.GetOptions{})
}

// GetCached reads the lease from the API server's watch cache.
func (s *leaseStore) GetCached(ctx context.Context) (Observed, error) {
	return s.get(ctx, metav1.GetOptions{ResourceVersion: "0"})
}

func (s *leaseStore) get(ctx context.Context, opts metav1.GetOptions) (Observed, error) {
	l, err := s.leases.Get(ctx, s.name, opts)
	if err != nil {
		return Observed{}, err
	}
	return ObservedFromLease(l), nil
}

func (s *leaseStore) Create(ctx context.Context, r Record) (Observed, error) {
	l, err := s.leases.Create(ctx, LeaseFromRecord(s.namespace, s.name, "", r), metav1.CreateOptions{})
	if err != nil {
		return Observed{}, err
	}
	return ObservedFromLease(l), nil
}

// Update replaces the lease as a whole, labels and annotations included:
// the object belongs to this package, so there is no metadata of others to
// keep.
func (s *leaseStore) Update(ctx context.Context, resourceVersion string, r Record) (Observed, error) {
	if resourceVersion == "" {
		return Observed{}, fmt.Errorf("lease %s/%s: refusing an update without a resourceVersion", s.namespace, s.name)
	}
	l, err := s.leases.Update(ctx, LeaseFromRecord(s.namespace, s.name, resourceVersion, r), metav1.UpdateOptions{})
	if err != nil {
		return Observed{}, err
	}
	return ObservedFromLease(l), nil
}
