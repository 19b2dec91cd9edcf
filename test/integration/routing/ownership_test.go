package routing

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// tenant is a namespace with one VPC, whose objects the test writes as
// the tenant (spec) and as galactic-controller (status) would.
type tenant struct {
	t         *testing.T
	env       *harness.Env
	namespace string
	vpc       *v1alpha1.VPC
	vni       int32
}

func newTenant(t *testing.T, env *harness.Env, namespace, vpc string, vni int32, networks ...v1alpha1.CIDR) *tenant {
	t.Helper()
	ctx := context.Background()
	_, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	v, err := env.API.VPCs(namespace).Create(ctx, &v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Name: vpc},
		Spec: v1alpha1.VPCSpec{Networks: networks}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.API.VPCs(namespace).Delete(context.Background(), vpc, metav1.DeleteOptions{}) })
	v.Status = v1alpha1.VPCStatus{VNI: vni, DataplaneName: names.DataplaneName(vpc, string(v.UID)), ObservedGeneration: v.Generation,
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllocated,
			Message: "allocated", LastTransitionTime: metav1.Now(), ObservedGeneration: v.Generation}}}
	if v, err = env.API.VPCs(namespace).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &tenant{t: t, env: env, namespace: namespace, vpc: v, vni: vni}
}

// attachment creates a VPCAttachment of the VPC requesting addresses,
// without status yet: its data-plane names as an inline attachment of the
// conflist, and the object.
func (tn *tenant) attachment(name string, addresses ...string) (harness.Attachment, *v1alpha1.VPCAttachment) {
	t := tn.t
	t.Helper()
	spec := v1alpha1.VPCAttachmentSpec{VPC: tn.vpc.Name}
	for _, a := range addresses {
		spec.Addresses = append(spec.Addresses, v1alpha1.IPAddress(netip.MustParsePrefix(a).Addr().String()))
	}
	obj, err := tn.env.API.VPCAttachments(tn.namespace).Create(context.Background(),
		&v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tn.env.API.VPCAttachments(tn.namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	att := harness.Attachment{VPC: tn.vpc.Status.DataplaneName, Name: names.DataplaneName(name, string(obj.UID)), VNI: int64(tn.vni), Addresses: addresses}
	tn.env.ForgetAttachment(t, att.VPC, att.Name)
	return att, obj
}

// allocate writes the attachment's status as galactic-controller does
// once it allocated the addresses.
func (tn *tenant) allocate(obj *v1alpha1.VPCAttachment, att harness.Attachment) *v1alpha1.VPCAttachment {
	t := tn.t
	t.Helper()
	obj = obj.DeepCopy()
	obj.Status = v1alpha1.VPCAttachmentStatus{VNI: tn.vni, Dataplane: &v1alpha1.Dataplane{VPC: att.VPC, Attachment: att.Name},
		ObservedGeneration: obj.Generation, Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonAllocated, Message: "allocated", LastTransitionTime: metav1.Now(), ObservedGeneration: obj.Generation}}}
	for _, a := range att.Addresses {
		obj.Status.Addresses = append(obj.Status.Addresses, v1alpha1.Prefix(a))
	}
	out, err := tn.env.API.VPCAttachments(tn.namespace).UpdateStatus(context.Background(), obj, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// editAdvertisement changes node's advertisement of att with the admin
// client, retrying on conflicts with the node's own writes.
func editAdvertisement(t *testing.T, env *harness.Env, att harness.Attachment, node string, edit func(*v1alpha1.BGPAdvertisement)) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, "updating "+att.Name+"'s advertisement", func() error {
		adv := env.Advertisement(t, att, node)
		if adv == nil {
			return fmt.Errorf("no advertisement")
		}
		edit(adv)
		_, err := env.API.BGPAdvertisements(harness.Namespace).Update(context.Background(), adv, metav1.UpdateOptions{})
		return err
	})
}

// backBy makes node's advertisement of att object-backed, as galactic-bgp
// writes one for a VPCAttachment: the two labels and the UID in every entry.
func backBy(t *testing.T, env *harness.Env, att harness.Attachment, node string, obj *v1alpha1.VPCAttachment) {
	t.Helper()
	editAdvertisement(t, env, att, node, func(adv *v1alpha1.BGPAdvertisement) {
		adv.Labels[v1alpha1.LabelNamespace] = obj.Namespace
		adv.Labels[v1alpha1.LabelAttachmentUID] = string(obj.UID)
		for i := range adv.Spec.Containers {
			adv.Spec.Containers[i].AttachmentUID = string(obj.UID)
		}
	})
}

// waitNotOwned waits until node's advertisement of att reads
// PrefixNotOwned with a message naming mention.
func waitNotOwned(t *testing.T, env *harness.Env, att harness.Attachment, node, mention string) {
	t.Helper()
	env.WaitCondition(t, att, node, v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonPrefixNotOwned)
	c := meta.FindStatusCondition(env.Advertisement(t, att, node).Status.Conditions, v1alpha1.ConditionProgrammed)
	if !strings.Contains(c.Message, mention) {
		t.Errorf("Programmed message %q does not name %q", c.Message, mention)
	}
}

func TestAnObjectBackedAdvertisementIsAnnouncedOnlyWithTheAddressesItsAttachmentWasGiven(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	tn := newTenant(t, env, "tenant-owned", "blue", 10300, "10.20.0.0/24")
	web, webObj := tn.attachment("web-0", "10.20.0.5/24")
	peer, peerObj := tn.attachment("peer-0", "10.20.0.7/24")
	tn.allocate(peerObj, peer)

	// The plugins made the data path and advertisements under the
	// data-plane names; the advertisements name their attachments.
	wa := a.Add(t, web)
	wb := b.Add(t, peer)
	backBy(t, env, web, "node-a", webObj)
	backBy(t, env, peer, "node-b", peerObj)

	// web-0 has no allocation yet: nothing of it is announced.
	waitNotOwned(t, env, web, "node-a", "no status.dataplane")
	env.WaitCondition(t, peer, "node-b", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	f.WaitPaths(t, 0, web.Prefixes()...)

	// Allocated: announced, and the workloads reach each other.
	tn.allocate(webObj, web)
	env.WaitCondition(t, web, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	f.WaitPaths(t, 1, web.Prefixes()[0], peer.Prefixes()[0])
	wb.WaitPing(t, web.Addr(false))
	wa.WaitPing(t, peer.Addr(false))

	// A misbehaving plugin claims an address web-0 was not given: every
	// path of it is withdrawn, and node-b's route to it goes.
	stolen := v1alpha1.Prefix("10.20.0.99/32")
	editAdvertisement(t, env, web, "node-a", func(adv *v1alpha1.BGPAdvertisement) {
		adv.Spec.Prefixes = append(adv.Spec.Prefixes, stolen)
		adv.Spec.Containers[0].Prefixes = append(adv.Spec.Containers[0].Prefixes, stolen)
	})
	waitNotOwned(t, env, web, "node-a", string(stolen))
	f.WaitPaths(t, 0, web.Prefixes()[0], netip.MustParsePrefix(string(stolen)))
	harness.Eventually(t, 20*time.Second, "node-b's route to web-0 removed", func() error {
		if r := kernelRoute(t, b.Node, peer.VPC, web.Prefixes()[0]); r != nil {
			return fmt.Errorf("route %+v", r)
		}
		return nil
	})
	// The other attachment of the VPC is untouched.
	env.WaitCondition(t, peer, "node-b", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	f.WaitPaths(t, 1, peer.Prefixes()[0])

	// Fixed: announced again.
	editAdvertisement(t, env, web, "node-a", func(adv *v1alpha1.BGPAdvertisement) {
		drop := func(ps []v1alpha1.Prefix) []v1alpha1.Prefix {
			return slices.DeleteFunc(ps, func(p v1alpha1.Prefix) bool { return p == stolen })
		}
		adv.Spec.Prefixes = drop(adv.Spec.Prefixes)
		adv.Spec.Containers[0].Prefixes = drop(adv.Spec.Containers[0].Prefixes)
	})
	env.WaitCondition(t, web, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	f.WaitPaths(t, 1, web.Prefixes()[0])
	wb.WaitPing(t, web.Addr(false))

	// A VNI the attachment was not given is refused as well.
	editAdvertisement(t, env, web, "node-a", func(adv *v1alpha1.BGPAdvertisement) { adv.Spec.VNI = 10399 })
	waitNotOwned(t, env, web, "node-a", "spec.vni 10399")
	f.WaitPaths(t, 0, web.Prefixes()[0])
}
