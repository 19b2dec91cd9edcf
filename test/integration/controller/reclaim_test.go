package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func addrOf(p v1alpha1.Prefix) string {
	return netip.MustParsePrefix(string(p)).Addr().String()
}

func TestAnAttachmentInUseIsKeptUntilItsHolderLetsGoThenItsAddressIsFreed(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "in-use")
	f.createVPC(t, vpcObject(ns, "blue", "10.20.0.0/16"))
	f.waitVPC(t, ns, "blue", readyVPC)
	// installer/manifests/attachment-admission.yaml protects it from its
	// creation on, before the controller has seen it.
	if created := f.createAttachment(t, attachmentObject(ns, "web", "blue")); !slices.Contains(created.Finalizers, v1alpha1.FinalizerAttachment) {
		t.Errorf("the created attachment has finalizers %q, want %s from the admission policy", created.Finalizers, v1alpha1.FinalizerAttachment)
	}
	att := f.waitAttachment(t, ns, "web", readyAttachment)
	addr := addrOf(att.Status.Addresses[0])

	lock := f.attachmentLock(t, att)
	grant, err := lock.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	adv := f.advertise(t, att, "node-a", grant.Token)
	f.waitAttachment(t, ns, "web", func(a *v1alpha1.VPCAttachment) error {
		if a.Status.Holder == nil || a.Status.Holder.Node != "node-a" {
			return fmt.Errorf("holder %+v", a.Status.Holder)
		}
		return nil
	})

	if err := f.api.VPCAttachments(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	held := f.waitAttachment(t, ns, "web", func(a *v1alpha1.VPCAttachment) error {
		if a == nil || a.DeletionTimestamp == nil {
			return errors.New("not being deleted")
		}
		return condition(a.Status.Conditions, v1alpha1.ConditionHolderAvailable, metav1.ConditionFalse, v1alpha1.ReasonHolderTerminating)
	})
	t.Logf("deleted while held: HolderAvailable %s", condMessage(held, v1alpha1.ConditionHolderAvailable))
	// Kept while held: a while later it is still there, its address too.
	time.Sleep(2 * time.Second)
	if _, err := f.api.VPCAttachments(ns).Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Fatalf("the held attachment went: %v", err)
	}
	if _, err := f.api.VPCAddresses(ns).Get(ctx, names.VPCAddressName("blue", netip.MustParseAddr(addr)), metav1.GetOptions{}); err != nil {
		t.Fatalf("the held attachment's address went: %v", err)
	}

	// The holder's DEL: its lease released, its entry gone.
	if err := lock.Release(ctx, grant); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if _, err := f.api.VPCAttachments(ns).Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Fatalf("the attachment went while its advertisement still had an entry: %v", err)
	}
	cur, err := f.api.BGPAdvertisements(harness.Namespace).Get(ctx, adv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Containers, cur.Spec.Prefixes = nil, nil
	if _, err := f.api.BGPAdvertisements(harness.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	f.waitAttachment(t, ns, "web", gone)
	waitObject(t, waitLimit, "the address freed", func() (*v1alpha1.VPCAddress, error) {
		return f.api.VPCAddresses(ns).Get(ctx, names.VPCAddressName("blue", netip.MustParseAddr(addr)), metav1.GetOptions{})
	}, gone)
	leaseName := names.Lease(att.Status.Dataplane.VPC, att.Status.Dataplane.Attachment)
	waitObject(t, waitLimit, "the lease deleted", func() (*coordinationv1.Lease, error) {
		return f.kube.CoordinationV1().Leases(harness.Namespace).Get(ctx, leaseName, metav1.GetOptions{})
	}, gone)
	waitObject(t, waitLimit, "the advertisement deleted", func() (*v1alpha1.BGPAdvertisement, error) {
		return f.api.BGPAdvertisements(harness.Namespace).Get(ctx, adv.Name, metav1.GetOptions{})
	}, gone)

	// Another attachment may have the address now.
	f.createAttachment(t, attachmentObject(ns, "next", "blue", addr))
	f.waitAttachment(t, ns, "next", readyAttachment)
}

func condMessage(a *v1alpha1.VPCAttachment, typ string) string {
	for _, c := range a.Status.Conditions {
		if c.Type == typ {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

func TestRetainKeepsTheAddressesForTheNextAttachmentOfTheNameUntilTheReservationIsDeleted(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "retain")
	f.createVPC(t, vpcObject(ns, "blue", "10.20.0.0/16", "fd20::/48"))
	f.waitVPC(t, ns, "blue", readyVPC)
	db := attachmentObject(ns, "db", "blue")
	db.Spec.ReclaimPolicy = v1alpha1.ReclaimRetain
	f.createAttachment(t, db)
	first := f.waitAttachment(t, ns, "db", readyAttachment)

	if err := f.api.VPCAttachments(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitAttachment(t, ns, "db", gone)
	var reservations []string
	for _, p := range first.Status.Addresses {
		a := waitObject(t, waitLimit, "a reservation of "+string(p), func() (*v1alpha1.VPCAddress, error) {
			return f.api.VPCAddresses(ns).Get(ctx, names.VPCAddressName("blue", netip.MustParsePrefix(string(p)).Addr()), metav1.GetOptions{})
		}, func(a *v1alpha1.VPCAddress) error {
			if a == nil || a.Spec.State != v1alpha1.AddressRetained || a.Spec.AttachmentUID != "" || a.Spec.Attachment != "db" || len(a.Finalizers) != 0 {
				return fmt.Errorf("%+v", a)
			}
			return nil
		})
		reservations = append(reservations, a.Name)
	}
	out, err := f.c.Kubectl(ctx, "get", "vpcaddresses", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the reservations, as kubectl lists them:\n%s", out)
	if !strings.Contains(string(out), "Retained") {
		t.Error("kubectl does not show the reservation as Retained")
	}

	// Another name may not take a reserved address.
	v4 := addrOf(first.Status.Addresses[0])
	f.createAttachment(t, attachmentObject(ns, "intruder", "blue", v4))
	f.waitAttachment(t, ns, "intruder", notReady(v1alpha1.ReasonAddressInUse))

	// The next db gets exactly those addresses, under a new UID.
	again := attachmentObject(ns, "db", "blue")
	again.Spec.ReclaimPolicy = v1alpha1.ReclaimRetain
	f.createAttachment(t, again)
	second := f.waitAttachment(t, ns, "db", readyAttachment)
	if second.UID == first.UID {
		t.Fatal("the recreated attachment has its predecessor's UID")
	}
	if !slices.Equal(second.Status.Addresses, first.Status.Addresses) {
		t.Errorf("recreated: addresses %v, its predecessor had %v", second.Status.Addresses, first.Status.Addresses)
	}
	if second.Status.Dataplane.Attachment == first.Status.Dataplane.Attachment {
		t.Errorf("the recreated attachment shares its predecessor's data-plane name %s", first.Status.Dataplane.Attachment)
	}
	for _, name := range reservations {
		a, err := f.api.VPCAddresses(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || a.Spec.State != v1alpha1.AddressBound || a.Spec.AttachmentUID != second.UID {
			t.Errorf("%s after the recreate: %+v, %v", name, a, err)
		}
	}

	// Deleted again, then its reservations deleted: the addresses are free.
	if err := f.api.VPCAttachments(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitAttachment(t, ns, "db", gone)
	for _, name := range reservations {
		waitObject(t, waitLimit, name+" retained", func() (*v1alpha1.VPCAddress, error) {
			return f.api.VPCAddresses(ns).Get(ctx, name, metav1.GetOptions{})
		}, func(a *v1alpha1.VPCAddress) error {
			if a == nil || a.Spec.State != v1alpha1.AddressRetained {
				return fmt.Errorf("%+v", a)
			}
			return nil
		})
		if err := f.api.VPCAddresses(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got := f.waitAttachment(t, ns, "intruder", readyAttachment)
	t.Logf("reservation released: intruder got %v", got.Status.Addresses)
}

func TestADeletedVPCWaitsForItsAttachmentsThenReleasesItsVNI(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "vpc-delete")
	f.createVPC(t, vpcObject(ns, "blue", "10.20.0.0/16"))
	vpc := f.waitVPC(t, ns, "blue", readyVPC)
	f.createAttachment(t, attachmentObject(ns, "web", "blue"))
	f.waitAttachment(t, ns, "web", readyAttachment)
	if err := f.api.VPCs(ns).Delete(ctx, "blue", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waiting := f.waitVPC(t, ns, "blue", func(v *v1alpha1.VPC) error {
		if v == nil || v.DeletionTimestamp == nil {
			return errors.New("not being deleted")
		}
		for _, c := range v.Status.Conditions {
			if strings.Contains(c.Message, "waiting for VPCAttachment web") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", v.Status.Conditions)
	})
	t.Logf("VPC being deleted: %s", waiting.Status.Conditions[0].Message)
	// A new attachment of a VPC being deleted is not given anything.
	f.createAttachment(t, attachmentObject(ns, "late", "blue"))
	f.waitAttachment(t, ns, "late", notReady(v1alpha1.ReasonVPCNotReady))

	for _, name := range []string{"web", "late"} {
		if err := f.api.VPCAttachments(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitVPC(t, ns, "blue", gone)
	vni := waitObject(t, waitLimit, "the VNI released", func() (*v1alpha1.VNI, error) {
		return f.api.VNIs().Get(ctx, names.VNIName(vpc.Status.VNI), metav1.GetOptions{})
	}, func(v *v1alpha1.VNI) error {
		if v == nil {
			return nil // the hold (5 s here) may have passed already
		}
		if v.Spec.ReleasedAt == nil {
			return errors.New("not released")
		}
		return nil
	})
	if vni != nil {
		t.Logf("VNI %s released at %s, held for the controller's --vni-hold", vni.Name, vni.Spec.ReleasedAt)
	}
	waitObject(t, waitLimit, "the VNI freed after its hold", func() (*v1alpha1.VNI, error) {
		return f.api.VNIs().Get(ctx, names.VNIName(vpc.Status.VNI), metav1.GetOptions{})
	}, gone)
	addrs, err := f.api.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(addrs.Items) != 0 {
		t.Errorf("VPCAddresses left: %v %v", addrs, err)
	}
}
