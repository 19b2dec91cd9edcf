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
	_, err := e.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var created *v1alpha1.VPC
	createOrWait(t, "VPC "+ns+"/"+vpc, func() (err error) {
		created, err = e.API.VPCs(ns).Create(ctx, &v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VPCSpec{Networks: networks}}, metav1.CreateOptions{})
		return err
	})
	if !lasting {
		t.Cleanup(func() {
			uid := created.UID
			_ = e.API.VPCs(ns).Delete(ctx, vpc, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		})
	}
	var v *v1alpha1.VPC
	waitObject(t, 30*time.Second, "VPC "+ns+"/"+vpc+" Ready", func() error {
		if v, err = e.API.VPCs(ns).Get(ctx, vpc, metav1.GetOptions{}); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.ConditionReady) || v.Status.DataplaneName == "" {
			return fmt.Errorf("status %+v", v.Status)
		}
		return nil
	})
	return &Tenant{Env: e, Namespace: ns, VPC: v, lasting: lasting}
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
	spec := v1alpha1.VPCAttachmentSpec{VPC: vpc, ReclaimPolicy: policy}
	for _, a := range addrs {
		spec.Addresses = append(spec.Addresses, v1alpha1.IPAddress(a))
	}
	var created *v1alpha1.VPCAttachment
	createOrWait(t, "VPCAttachment "+tn.Namespace+"/"+name, func() (err error) {
		created, err = tn.Env.API.VPCAttachments(tn.Namespace).Create(context.Background(),
			&v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if !tn.lasting {
		t.Cleanup(func() { tn.forget(t, created) })
	}
}

// WaitReady waits until attachment name is Ready, with addresses and
// data-plane names, and returns it.
func (tn *Tenant) WaitReady(t testing.TB, name string) *v1alpha1.VPCAttachment {
	t.Helper()
	var a *v1alpha1.VPCAttachment
	waitObject(t, 30*time.Second, "VPCAttachment "+tn.Namespace+"/"+name+" Ready", func() error {
		var err error
		if a, err = tn.Env.API.VPCAttachments(tn.Namespace).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.ConditionReady) || a.Status.Dataplane == nil || len(a.Status.Addresses) == 0 {
			return fmt.Errorf("status %+v", a.Status)
		}
		return nil
	})
	return a
}

// WaitGone waits until deleted attachment name is gone: the controller
// lets it go once nothing uses it.
func (tn *Tenant) WaitGone(t testing.TB, name string, limit time.Duration) {
	t.Helper()
	waitObject(t, limit, "VPCAttachment "+tn.Namespace+"/"+name+" gone", func() error {
		a, err := tn.Env.API.VPCAttachments(tn.Namespace).Get(context.Background(), name, metav1.GetOptions{})
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

// createOrWait runs create until it does not answer AlreadyExists: an
// earlier test's object of the same name may still be on its way out.
func createOrWait(t testing.TB, what string, create func() error) {
	t.Helper()
	waitObject(t, 2*time.Minute, what+" created (an earlier one of the name gone)", func() error {
		err := create()
		if apierrors.IsAlreadyExists(err) {
			return err
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
}

// waitObject polls cond every 50 ms until it returns nil or limit passes.
func waitObject(t testing.TB, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
