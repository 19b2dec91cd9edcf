package harness

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/handoff"
)

// Lease returns the handoff lease called name, nil when there is none.
func (e *Env) Lease(t testing.TB, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := e.API.Leases(Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// LeaseHolder is the lease's holder identity as pkg/handoff reads it;
// empty for a free or missing lease.
func LeaseHolder(l *coordinationv1.Lease) string {
	if l == nil {
		return ""
	}
	return handoff.RecordFromSpec(l.Spec).HolderIdentity
}

// LeaseToken is the lease's fencing token (leaseTransitions); 0 for a
// missing lease.
func LeaseToken(l *coordinationv1.Lease) int64 {
	if l == nil {
		return 0
	}
	return int64(handoff.RecordFromSpec(l.Spec).LeaseTransitions)
}
