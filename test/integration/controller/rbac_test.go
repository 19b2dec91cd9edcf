package controller

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/test/harness"
)

// clientAs is an API client authenticated as the service account
// namespace/name.
func (f *fixture) clientAs(t *testing.T, namespace, name string) *client.Clients {
	t.Helper()
	path := filepath.Join(f.dir, namespace+"-"+name+".kubeconfig")
	if err := harness.ServiceAccountKubeconfig(context.Background(), f.c.ControlPlane, namespace, name, path); err != nil {
		t.Fatal(err)
	}
	cfg, err := client.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func forbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: want Forbidden, got %v", what, err)
	}
}

func TestATenantBoundToEditManagesItsOwnAttachmentsAndANodeOnlyReadsThem(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "tenant-rbac")
	other := f.tenant(t, "tenant-other")
	f.createVPC(t, vpcObject(other, "blue", "10.20.0.0/16"))
	f.createAttachment(t, attachmentObject(other, "theirs", "blue"))
	theirs := f.waitAttachment(t, other, "theirs", readyAttachment)

	if _, err := f.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app-edit"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "app", Namespace: ns}}}
	if _, err := f.kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenant := f.clientAs(t, ns, "app")

	// kube-controller-manager aggregates the galactic roles into edit.
	waitObject(t, waitLimit, "edit aggregates the galactic roles", func() (*v1alpha1.VPCList, error) {
		return tenant.VPCs(ns).List(ctx, metav1.ListOptions{})
	}, func(l *v1alpha1.VPCList) error {
		if l == nil {
			return errors.New("no list")
		}
		return nil
	})
	if _, err := tenant.VPCs(ns).Create(ctx, vpcObject(ns, "blue", "10.20.0.0/16"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creates a VPC: %v", err)
	}
	a := attachmentObject(ns, "web", "blue")
	a.Spec.ReclaimPolicy = v1alpha1.ReclaimRetain
	if _, err := tenant.VPCAttachments(ns).Create(ctx, a, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creates an attachment: %v", err)
	}
	f.waitAttachment(t, ns, "web", readyAttachment)
	got, err := tenant.VPCAttachments(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the tenant reads its attachment: %v", err)
	}
	got.Spec.Announce = v1alpha1.AnnounceWhenAvailable
	if got, err = tenant.VPCAttachments(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the tenant changes announce: %v", err)
	}
	forged := got.DeepCopy()
	forged.Status.Addresses = []v1alpha1.Prefix{"10.20.0.99/16"}
	_, err = tenant.VPCAttachments(ns).UpdateStatus(ctx, forged, metav1.UpdateOptions{})
	forbidden(t, "the tenant writes its attachment's status", err)
	_, err = tenant.VPCAttachments(ns).Patch(ctx, "web", types.MergePatchType, []byte(`{"status":{"addresses":["10.20.0.99/16"]}}`), metav1.PatchOptions{}, "status")
	forbidden(t, "the tenant patches its attachment's status", err)
	vpc, err := tenant.VPCs(ns).Get(ctx, "blue", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vpc.Status.VNI = 7
	_, err = tenant.VPCs(ns).UpdateStatus(ctx, vpc, metav1.UpdateOptions{})
	forbidden(t, "the tenant writes its VPC's status", err)
	_, err = tenant.VPCAddresses(ns).Create(ctx, &v1alpha1.VPCAddress{ObjectMeta: metav1.ObjectMeta{Name: "blue.10.20.0.77"},
		Spec: v1alpha1.VPCAddressSpec{VPC: "blue", Address: "10.20.0.77", Attachment: "web", State: v1alpha1.AddressBound}}, metav1.CreateOptions{})
	forbidden(t, "the tenant claims an address itself", err)
	_, err = tenant.VNIs().List(ctx, metav1.ListOptions{})
	forbidden(t, "the tenant lists VNIs", err)
	addrs, err := tenant.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(addrs.Items) != 1 {
		t.Fatalf("the tenant lists its addresses: %v %v", addrs, err)
	}

	// Another namespace: nothing.
	_, err = tenant.VPCAttachments(other).Get(ctx, "theirs", metav1.GetOptions{})
	forbidden(t, "the tenant reads another namespace's attachment", err)
	_, err = tenant.VPCAttachments(other).List(ctx, metav1.ListOptions{})
	forbidden(t, "the tenant lists another namespace's attachments", err)
	_, err = tenant.VPCAttachments(other).Create(ctx, attachmentObject(other, "evil", "blue", "10.20.0.9"), metav1.CreateOptions{})
	forbidden(t, "the tenant creates an attachment in another namespace", err)
	err = tenant.VPCAttachments(other).Delete(ctx, "theirs", metav1.DeleteOptions{})
	forbidden(t, "the tenant deletes another namespace's attachment", err)
	_, err = tenant.VPCAddresses(other).List(ctx, metav1.ListOptions{})
	forbidden(t, "the tenant lists another namespace's addresses", err)
	_, err = tenant.VPCAttachments("").List(ctx, metav1.ListOptions{})
	forbidden(t, "the tenant lists every namespace's attachments", err)

	// The node credential reads attachments everywhere and writes nothing
	// of them.
	node := f.clientAs(t, harness.Namespace, harness.ServiceAccount)
	if _, err := node.VPCAttachments(other).Get(ctx, "theirs", metav1.GetOptions{}); err != nil {
		t.Errorf("the node reads an attachment: %v", err)
	}
	if _, err := node.VPCAttachments("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the node lists every attachment: %v", err)
	}
	if _, err := node.VPCs(ns).Get(ctx, "blue", metav1.GetOptions{}); err != nil {
		t.Errorf("the node reads a VPC: %v", err)
	}
	w, err := node.VPCAttachments("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("the node watches attachments: %v", err)
	} else {
		w.Stop()
	}
	nodeForged := theirs.DeepCopy()
	nodeForged.Status.Addresses = []v1alpha1.Prefix{"10.20.0.99/16"}
	_, err = node.VPCAttachments(other).UpdateStatus(ctx, nodeForged, metav1.UpdateOptions{})
	forbidden(t, "the node writes an attachment's status", err)
	_, err = node.VPCAttachments(other).Update(ctx, theirs.DeepCopy(), metav1.UpdateOptions{})
	forbidden(t, "the node updates an attachment", err)
	_, err = node.VPCAttachments(other).Create(ctx, attachmentObject(other, "node-made", "blue"), metav1.CreateOptions{})
	forbidden(t, "the node creates an attachment", err)
	err = node.VPCAttachments(other).Delete(ctx, "theirs", metav1.DeleteOptions{})
	forbidden(t, "the node deletes an attachment", err)
	err = node.VPCs(ns).Delete(ctx, "blue", metav1.DeleteOptions{})
	forbidden(t, "the node deletes a VPC", err)
	_, err = node.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	forbidden(t, "the node lists addresses", err)

	// The tenant deletes what it made: the VPC waits for its attachment,
	// and the attachment's Retained reservation is the tenant's to delete.
	if err := tenant.VPCs(ns).Delete(ctx, "blue", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("the tenant deletes its VPC: %v", err)
	}
	if err := tenant.VPCAttachments(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("the tenant deletes its attachment: %v", err)
	}
	f.waitAttachment(t, ns, "web", gone)
	f.waitVPC(t, ns, "blue", gone)
	// The VPC's deletion released its reservations too.
	waitObject(t, waitLimit, "no address left", func() (*v1alpha1.VPCAddressList, error) {
		return f.api.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	}, func(l *v1alpha1.VPCAddressList) error {
		if len(l.Items) != 0 {
			return errors.New("addresses left")
		}
		return nil
	})
}
