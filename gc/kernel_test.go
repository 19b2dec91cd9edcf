package gc

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
)

// fakeLeaseClient keeps leases in memory with the API server's
// resourceVersion checks.
type fakeLeaseClient struct {
	rv     int
	leases map[string]*coordinationv1.Lease
}

var leaseResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func (f *fakeLeaseClient) Get(_ context.Context, name string, _ metav1.GetOptions) (*coordinationv1.Lease, error) {
	l, ok := f.leases[name]
	if !ok {
		return nil, apierrors.NewNotFound(leaseResource, name)
	}
	return l.DeepCopy(), nil
}

func (f *fakeLeaseClient) Create(_ context.Context, l *coordinationv1.Lease, _ metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if _, ok := f.leases[l.Name]; ok {
		return nil, apierrors.NewAlreadyExists(leaseResource, l.Name)
	}
	return f.store(l), nil
}

func (f *fakeLeaseClient) Update(_ context.Context, l *coordinationv1.Lease, _ metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	cur, ok := f.leases[l.Name]
	if !ok {
		return nil, apierrors.NewNotFound(leaseResource, l.Name)
	}
	if cur.ResourceVersion != l.ResourceVersion {
		return nil, apierrors.NewConflict(leaseResource, l.Name, nil)
	}
	return f.store(l), nil
}

func (f *fakeLeaseClient) store(l *coordinationv1.Lease) *coordinationv1.Lease {
	f.rv++
	l = l.DeepCopy()
	l.ResourceVersion = strconv.Itoa(f.rv)
	f.leases[l.Name] = l
	return l.DeepCopy()
}

func TestARenewalKeepsTheHoldersAvailabilityReportAndNodeLabel(t *testing.T) {
	ctx := context.Background()
	leases := &fakeLeaseClient{leases: map[string]*coordinationv1.Lease{}}
	name := names.Lease("blue", "web-0-net0")
	lock, err := handoff.New(leases, "galactic-system", name, handoff.Options{LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g, err := lock.TryAcquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.SetAvailable(ctx, g.Holder, g.Token, true, "Serving"); err != nil {
		t.Fatal(err)
	}
	before, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	h := HandoffLeases{Leases: leases, Namespace: "galactic-system"}
	rec := state.Record{VPC: "blue", Attachment: "web-0-net0", Holder: g.Holder, HolderGeneration: g.Token, LeaseSeconds: 60}
	if err := h.Renew(ctx, rec); err != nil {
		t.Fatal(err)
	}
	after, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion == before.ResourceVersion {
		t.Fatal("the lease was not renewed")
	}
	if !reflect.DeepEqual(after.Annotations, before.Annotations) || !reflect.DeepEqual(after.Labels, before.Labels) {
		t.Errorf("renewal changed the lease's metadata:\nbefore %v %v\n after %v %v", before.Labels, before.Annotations, after.Labels, after.Annotations)
	}
	if s, reason, _ := handoff.Availability(after, g.Holder, g.Token); s != metav1.ConditionTrue || reason != "Serving" {
		t.Errorf("after the renewal: %s %s, want True Serving", s, reason)
	}
	if after.Labels[names.LabelHolderNode] != "node-a" {
		t.Errorf("holder-node label %q", after.Labels[names.LabelHolderNode])
	}
}

func TestALeaseOfAnotherUIDIsNeitherRenewedNorReleasedForARecord(t *testing.T) {
	ctx := context.Background()
	leases := &fakeLeaseClient{leases: map[string]*coordinationv1.Lease{}}
	name := names.Lease("blue", "web-0-net0")
	// The successor (UID "new") holds the lease of the same names, with
	// the holder and token the predecessor's record remembers.
	lock, err := handoff.New(leases, "galactic-system", name, handoff.Options{LeaseDuration: time.Minute,
		Identity: handoff.Identity{Namespace: "tenant-a", UID: "new"}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := lock.TryAcquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	before, _ := leases.Get(ctx, name, metav1.GetOptions{})

	h := HandoffLeases{Leases: leases, Namespace: "galactic-system"}
	rec := state.Record{VPC: "blue", Attachment: "web-0-net0", Namespace: "tenant-a", AttachmentUID: "old",
		Holder: g.Holder, HolderGeneration: g.Token, LeaseSeconds: 60}
	if err := h.Renew(ctx, rec); !errors.Is(err, handoff.ErrLost) {
		t.Errorf("renewing another UID's lease: %v, want ErrLost", err)
	}
	if err := h.Release(ctx, rec); !errors.Is(err, handoff.ErrLost) {
		t.Errorf("releasing another UID's lease: %v, want ErrLost", err)
	}
	if after, _ := leases.Get(ctx, name, metav1.GetOptions{}); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the successor's lease was written: %+v", after.Spec)
	}
	// Its own record renews it.
	rec.AttachmentUID = "new"
	if err := h.Renew(ctx, rec); err != nil {
		t.Errorf("renewing its own UID's lease: %v", err)
	}
}
