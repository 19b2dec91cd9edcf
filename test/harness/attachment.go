package harness

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// Advertisements returns every node's advertisement of vpc's attachment,
// by node.
func (e *Env) Advertisements(t testing.TB, vpc, attachment string) map[string]v1alpha1.BGPAdvertisement {
	t.Helper()
	list, err := e.API.BGPAdvertisements(Namespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, attachment)})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1alpha1.BGPAdvertisement{}
	for _, adv := range list.Items {
		out[adv.Spec.Node] = adv
	}
	return out
}

// ForgetAttachment deletes the attachment's lease and advertisements when
// t ends, since the package's tests share one API server.
func (e *Env) ForgetAttachment(t testing.TB, vpc, attachment string) {
	t.Cleanup(func() {
		ctx := context.Background()
		_ = e.API.Leases(Namespace).Delete(ctx, names.Lease(vpc, attachment), metav1.DeleteOptions{})
		_ = e.API.BGPAdvertisements(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, attachment)})
	})
}
