package controller

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// refused asserts the API server refused a write as invalid, naming field.
func refused(t *testing.T, what string, err error, field string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Errorf("%s: want the API server to refuse it as invalid, got %v", what, err)
		return
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: the refusal does not name %s: %v", what, field, err)
	}
	t.Logf("%s: %v", what, err)
}

func TestBadInputIsRefusedOrReportedAndChangesNothingElse(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "bad-input")
	f.createVPC(t, vpcObject(ns, "blue", "10.20.0.0/16", "fd20::/48"))
	f.waitVPC(t, ns, "blue", readyVPC)
	good := f.createAttachment(t, attachmentObject(ns, "good", "blue", "10.20.0.5"))
	good = f.waitAttachment(t, ns, "good", readyAttachment)
	addrsBefore, err := f.api.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Refused by the API server, naming the field.
	vpcs, atts := f.api.VPCs(ns), f.api.VPCAttachments(ns)
	_, err = vpcs.Create(ctx, vpcObject(ns, "host-bits", "10.20.0.1/16"), metav1.CreateOptions{})
	refused(t, "a network with host bits", err, "spec.networks")
	_, err = vpcs.Create(ctx, vpcObject(ns, "not-a-cidr", "10.20.0.0"), metav1.CreateOptions{})
	refused(t, "a network that is not a CIDR", err, "spec.networks")
	_, err = vpcs.Create(ctx, vpcObject(ns, "overlap", "10.20.0.0/16", "10.20.5.0/24"), metav1.CreateOptions{})
	refused(t, "overlapping networks", err, "spec.networks")
	_, err = vpcs.Create(ctx, vpcObject(ns, "none"), metav1.CreateOptions{})
	refused(t, "no network", err, "spec.networks")
	_, err = atts.Create(ctx, attachmentObject(ns, "dup", "blue", "10.20.0.9", "10.20.0.9"), metav1.CreateOptions{})
	refused(t, "a duplicate request", err, "spec.addresses")
	_, err = atts.Create(ctx, attachmentObject(ns, "prefix", "blue", "10.20.0.9/16"), metav1.CreateOptions{})
	refused(t, "a request with a prefix length", err, "spec.addresses")
	_, err = atts.Create(ctx, attachmentObject(ns, "web.0", "blue"), metav1.CreateOptions{})
	refused(t, "a name that is not a DNS label", err, "metadata.name")
	bad := attachmentObject(ns, "bad-policy", "blue")
	bad.Spec.ReclaimPolicy = "Keep"
	_, err = atts.Create(ctx, bad, metav1.CreateOptions{})
	refused(t, "an unknown reclaim policy", err, "spec.reclaimPolicy")

	// The spec is immutable but for announce and allowedSourcePrefixes.
	changed := good.DeepCopy()
	changed.Spec.Addresses = []v1alpha1.IPAddress{"10.20.0.6"}
	_, err = atts.Update(ctx, changed, metav1.UpdateOptions{})
	refused(t, "a changed spec.addresses", err, "spec.addresses is immutable")
	changed = good.DeepCopy()
	changed.Spec.VPC = "red"
	_, err = atts.Update(ctx, changed, metav1.UpdateOptions{})
	refused(t, "a changed spec.vpc", err, "spec.vpc is immutable")
	changed = good.DeepCopy()
	changed.Spec.ReclaimPolicy = v1alpha1.ReclaimRetain
	_, err = atts.Update(ctx, changed, metav1.UpdateOptions{})
	refused(t, "a changed spec.reclaimPolicy", err, "spec.reclaimPolicy is immutable")
	vpc, err := vpcs.Get(ctx, "blue", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shrunk := vpc.DeepCopy()
	shrunk.Spec.Networks = shrunk.Spec.Networks[:1]
	_, err = vpcs.Update(ctx, shrunk, metav1.UpdateOptions{})
	refused(t, "a VPC losing a network", err, "spec.networks may gain networks but never lose")
	grown := vpc.DeepCopy()
	grown.Spec.Networks = append(grown.Spec.Networks, "10.21.0.0/16")
	if _, err := vpcs.Update(ctx, grown, metav1.UpdateOptions{}); err != nil {
		t.Errorf("a VPC may gain a network: %v", err)
	}
	changed = good.DeepCopy()
	changed.Spec.Announce = v1alpha1.AnnounceWhenAvailable
	changed.Spec.AllowedSourcePrefixes = []v1alpha1.Prefix{"192.0.2.0/24"}
	if _, err := atts.Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Errorf("announce and allowedSourcePrefixes may change: %v", err)
	}

	// Reported by a condition that says what to change.
	for _, c := range []struct {
		att    *v1alpha1.VPCAttachment
		reason string
		says   string
	}{
		{attachmentObject(ns, "outside", "blue", "10.99.0.5"), v1alpha1.ReasonOutsideVPC, "10.99.0.5 is outside VPC blue"},
		{attachmentObject(ns, "taken", "blue", "10.20.0.5"), v1alpha1.ReasonAddressInUse, "10.20.0.5 is held by VPCAttachment good"},
		{attachmentObject(ns, "gateway", "blue", "10.20.0.1"), v1alpha1.ReasonAddressInUse, "10.20.0.1 is the gateway of 10.20.0.0/16"},
		{attachmentObject(ns, "no-vpc", "green"), v1alpha1.ReasonVPCNotFound, "VPC green does not exist in namespace " + ns},
		{func() *v1alpha1.VPCAttachment {
			a := attachmentObject(ns, "no-family", "tiny4")
			a.Spec.IPFamilies = []v1alpha1.IPFamily{v1alpha1.IPv6}
			return a
		}(), v1alpha1.ReasonVPCNotFound, "VPC tiny4 does not exist"},
	} {
		f.createAttachment(t, c.att)
		got := f.waitAttachment(t, ns, c.att.Name, notReady(c.reason))
		if msg := readyMessage(got); !strings.Contains(msg, c.says) {
			t.Errorf("%s: Ready message %q does not say %q", c.att.Name, msg, c.says)
		} else {
			t.Logf("%s: %s: %s", c.att.Name, c.reason, msg)
		}
		if got.Status.Dataplane != nil || len(got.Status.Addresses) != 0 {
			t.Errorf("%s: a refused attachment has data-plane names %+v or addresses %v", c.att.Name, got.Status.Dataplane, got.Status.Addresses)
		}
	}
	// A missing VPC, once created, is used.
	f.createVPC(t, vpcObject(ns, "green", "10.22.0.0/16"))
	f.waitAttachment(t, ns, "no-vpc", readyAttachment)
	// A family the VPC has no network of.
	f.createVPC(t, vpcObject(ns, "tiny4", "10.23.0.0/24"))
	got := f.waitAttachment(t, ns, "no-family", notReady(v1alpha1.ReasonPoolExhausted))
	t.Logf("no-family: %s", readyMessage(got))

	// Nothing else changed: the good attachment and the addresses of blue.
	after, err := atts.Get(ctx, "good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Status.Addresses[0] != good.Status.Addresses[0] || readyAttachment(after) != nil {
		t.Errorf("the good attachment changed: %v", after.Status)
	}
	addrsAfter, err := f.api.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// green's attachment claimed one address; nothing else was claimed.
	if len(addrsAfter.Items) != len(addrsBefore.Items)+1 {
		var s []string
		for _, a := range addrsAfter.Items {
			s = append(s, a.Name)
		}
		t.Errorf("VPCAddresses before %d, after %d: %v", len(addrsBefore.Items), len(addrsAfter.Items), s)
	}
	for _, c := range f.ctrls {
		if c.Exited() {
			t.Errorf("controller %s exited:\n%s", c.Identity, c.LogTail(20))
		}
	}
}
