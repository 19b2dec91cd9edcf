package harness

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// Tenant is a namespace with one VPC that galactic-controller made
// Ready; its attachments are made Ready by the controller too.
type Tenant struct {
	Env       *Env
	Namespace string
	VPC       *v1alpha1.VPC
	// lasting tenants' objects outlive the test that made them.
	lasting bool
}

// NewTenant makes namespace ns (unless it exists) with VPC vpc over
// networks and waits until galactic-controller made it Ready: the
// controller must run (StartController, or a cluster's Deployment). When t
// ends the VPC is deleted; the controller lets it go once its attachments
// are gone, and a later NewTenant of the same names waits for that.
func (e *Env) NewTenant(t testing.TB, ns, vpc string, networks ...v1alpha1.CIDR) *Tenant {
	t.Helper()
	return e.newTenant(t, ns, vpc, false, networks)
}

// NewLastingTenant is NewTenant for tests that share one cluster in
// order: neither the VPC nor the attachments made through the tenant are
// deleted when t ends.
func (e *Env) NewLastingTenant(t testing.TB, ns, vpc string, networks ...v1alpha1.CIDR) *Tenant {
	t.Helper()
	return e.newTenant(t, ns, vpc, true, networks)
}

func (e *Env) newTenant(t testing.TB, ns, vpc string, lasting bool, networks []v1alpha1.CIDR) *Tenant {
	t.Helper()
	ctx := context.Background()
	created, err := e.createVPC(ctx, ns, vpc, networks)
	if err != nil {
		t.Fatal(err)
	}
	if !lasting {
		t.Cleanup(func() {
			uid := created.UID
			_ = e.API.VPCs(ns).Delete(ctx, vpc, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		})
	}
	tn, err := e.waitTenant(ctx, ns, vpc)
	if err != nil {
		t.Fatal(err)
	}
	tn.lasting = lasting
	return tn
}

// CreateTenant is NewLastingTenant outside a test: the caller deletes the
// VPC and the attachments it makes through the tenant (Delete).
func (e *Env) CreateTenant(ctx context.Context, ns, vpc string, networks ...v1alpha1.CIDR) (*Tenant, error) {
	if _, err := e.createVPC(ctx, ns, vpc, networks); err != nil {
		return nil, err
	}
	tn, err := e.waitTenant(ctx, ns, vpc)
	if err != nil {
		return nil, err
	}
	tn.lasting = true
	return tn, nil
}

// createVPC makes namespace ns (unless it exists) and VPC vpc in it.
func (e *Env) createVPC(ctx context.Context, ns, vpc string, networks []v1alpha1.CIDR) (*v1alpha1.VPC, error) {
	_, err := e.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	var created *v1alpha1.VPC
	err = createRetrying(ctx, "VPC "+ns+"/"+vpc, func() (err error) {
		created, err = e.API.VPCs(ns).Create(ctx, &v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VPCSpec{Networks: networks}}, metav1.CreateOptions{})
		return err
	})
	return created, err
}

// waitTenant waits until galactic-controller made VPC vpc Ready.
func (e *Env) waitTenant(ctx context.Context, ns, vpc string) (*Tenant, error) {
	var v *v1alpha1.VPC
	err := Poll(ctx, 30*time.Second, "VPC "+ns+"/"+vpc+" Ready", func() (err error) {
		if v, err = e.API.VPCs(ns).Get(ctx, vpc, metav1.GetOptions{}); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.ConditionReady) || v.Status.DataplaneName == "" {
			return fmt.Errorf("status %+v", v.Status)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Tenant{Env: e, Namespace: ns, VPC: v}, nil
}

// Delete deletes attachments as (these objects, not successors of their
// names), waits until the controller let them go (nothing may use them
// any more: their workloads' DELs come first), then deletes the VPC and
// waits until it is gone.
func (tn *Tenant) Delete(ctx context.Context, as ...*v1alpha1.VPCAttachment) error {
	for _, a := range as {
		uid := a.UID
		err := tn.Env.API.VPCAttachments(tn.Namespace).Delete(ctx, a.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	for _, a := range as {
		if err := tn.waitGone(ctx, a.Name, 30*time.Second); err != nil {
			return err
		}
	}
	uid := tn.VPC.UID
	err := tn.Env.API.VPCs(tn.Namespace).Delete(ctx, tn.VPC.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return Poll(ctx, 30*time.Second, "VPC "+tn.Namespace+"/"+tn.VPC.Name+" gone", func() error {
		v, err := tn.Env.API.VPCs(tn.Namespace).Get(ctx, tn.VPC.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: %+v", v.Status)
	})
}

// Attach makes VPCAttachment name in the tenant's VPC under policy (""
// is the default, Delete), requesting addrs (IPs; none: one address of
// each of the VPC's families), and waits until the controller made it
// Ready. When t ends it is deleted: the controller lets it go once nothing
// uses it (the pods' DELs), and a later Attach of the name waits for that.
func (tn *Tenant) Attach(t testing.TB, name string, policy v1alpha1.ReclaimPolicy, addrs ...string) *v1alpha1.VPCAttachment {
	t.Helper()
	tn.create(t, name, tn.VPC.Name, policy, addrs)
	return tn.WaitReady(t, name)
}

// CreateAttachment is Attach outside a test: the attachment is not
// deleted by anything but the caller (Delete).
func (tn *Tenant) CreateAttachment(ctx context.Context, name string, policy v1alpha1.ReclaimPolicy, addrs ...string) (*v1alpha1.VPCAttachment, error) {
	if _, err := tn.createAttachment(ctx, name, tn.VPC.Name, policy, addrs); err != nil {
		return nil, err
	}
	return tn.waitReady(ctx, name)
}

// AttachUnready makes VPCAttachment name of VPC vpc (a name the tenant
// may not have) and waits until the controller reports it not Ready for
// reason.
func (tn *Tenant) AttachUnready(t testing.TB, name, vpc, reason string) {
	t.Helper()
	tn.create(t, name, vpc, "", nil)
	waitObject(t, 30*time.Second, "VPCAttachment "+tn.Namespace+"/"+name+" not Ready ("+reason+")", func() error {
		a, err := tn.Env.API.VPCAttachments(tn.Namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
}

func (tn *Tenant) create(t testing.TB, name, vpc string, policy v1alpha1.ReclaimPolicy, addrs []string) {
	t.Helper()
	created, err := tn.createAttachment(context.Background(), name, vpc, policy, addrs)
	if err != nil {
		t.Fatal(err)
	}
	if !tn.lasting {
		t.Cleanup(func() { tn.forget(t, created) })
	}
}

func (tn *Tenant) createAttachment(ctx context.Context, name, vpc string, policy v1alpha1.ReclaimPolicy, addrs []string) (*v1alpha1.VPCAttachment, error) {
	spec := v1alpha1.VPCAttachmentSpec{VPC: vpc, ReclaimPolicy: policy}
	for _, a := range addrs {
		spec.Addresses = append(spec.Addresses, v1alpha1.IPAddress(a))
	}
	var created *v1alpha1.VPCAttachment
	err := createRetrying(ctx, "VPCAttachment "+tn.Namespace+"/"+name, func() (err error) {
		created, err = tn.Env.API.VPCAttachments(tn.Namespace).Create(ctx,
			&v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		return err
	})
	return created, err
}

// WaitReady waits until attachment name is Ready, with addresses and
// data-plane names, and returns it.
func (tn *Tenant) WaitReady(t testing.TB, name string) *v1alpha1.VPCAttachment {
	t.Helper()
	a, err := tn.waitReady(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (tn *Tenant) waitReady(ctx context.Context, name string) (*v1alpha1.VPCAttachment, error) {
	var a *v1alpha1.VPCAttachment
	err := Poll(ctx, 30*time.Second, "VPCAttachment "+tn.Namespace+"/"+name+" Ready", func() (err error) {
		if a, err = tn.Env.API.VPCAttachments(tn.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.ConditionReady) || a.Status.Dataplane == nil || len(a.Status.Addresses) == 0 {
			return fmt.Errorf("status %+v", a.Status)
		}
		return nil
	})
	return a, err
}

// WaitGone waits until deleted attachment name is gone: the controller
// lets it go once nothing uses it.
func (tn *Tenant) WaitGone(t testing.TB, name string, limit time.Duration) {
	t.Helper()
	if err := tn.waitGone(context.Background(), name, limit); err != nil {
		t.Fatal(err)
	}
}

func (tn *Tenant) waitGone(ctx context.Context, name string, limit time.Duration) error {
	return Poll(ctx, limit, "VPCAttachment "+tn.Namespace+"/"+name+" gone", func() error {
		a, err := tn.Env.API.VPCAttachments(tn.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: %+v", a.Status)
	})
}

// forget deletes attachment a (not a successor of its name). A test that
// failed half way may leave it in use (a lease held, an entry advertised)
// where a node's DEL or galactic-gc would have released it: then its
// leases and advertisements go too, so that the controller lets it go.
func (tn *Tenant) forget(t testing.TB, a *v1alpha1.VPCAttachment) {
	ctx := context.Background()
	uid := a.UID
	_ = tn.Env.API.VPCAttachments(tn.Namespace).Delete(ctx, a.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if t.Failed() {
		sel := metav1.ListOptions{LabelSelector: v1alpha1.LabelAttachmentUID + "=" + string(uid)}
		_ = tn.Env.API.Leases(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
		_ = tn.Env.API.BGPAdvertisements(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel)
	}
}

// createRetrying runs create until it does not answer AlreadyExists (an
// earlier object of the same name may still be on its way out) and
// returns its answer.
func createRetrying(ctx context.Context, what string, create func() error) error {
	var final error
	err := Poll(ctx, 2*time.Minute, what+" created (an earlier one of the name gone)", func() error {
		final = create()
		if apierrors.IsAlreadyExists(final) {
			return final
		}
		return nil
	})
	if err != nil {
		return err
	}
	return final
}

// waitObject polls cond until it returns nil or limit passes.
func waitObject(t testing.TB, limit time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(context.Background(), limit, what, cond); err != nil {
		t.Fatal(err)
	}
}
