package gc

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

// NodeAdverts is one node's advertisements, pruned with galactic-bgp's
// guarded operations.
type NodeAdverts struct {
	Node string
	Adv  *advert.Advertiser
}

// List reads the node's advertisements with one label-selected request.
func (n NodeAdverts) List(ctx context.Context) ([]v1alpha1.BGPAdvertisement, error) {
	l, err := n.Adv.API.List(ctx, metav1.ListOptions{LabelSelector: names.NodeSelector(n.Node)})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// Prune drops dead entries and deletes the advertisement once none is live.
func (n NodeAdverts) Prune(ctx context.Context, adv *v1alpha1.BGPAdvertisement) (PruneResult, error) {
	results, err := n.Adv.Prune(ctx, n.Node, []v1alpha1.BGPAdvertisement{*adv})
	var pr PruneResult
	for _, r := range results {
		pr.EntriesPruned += len(r.Removed)
		pr.Deleted = pr.Deleted || r.Outcome == advert.Deleted
	}
	return pr, err
}

// Get re-reads the node's advertisement of an attachment.
func (n NodeAdverts) Get(ctx context.Context, vpc, attachment string) (*v1alpha1.BGPAdvertisement, error) {
	adv, err := n.Adv.API.Get(ctx, names.Advertisement(vpc, attachment, n.Node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return adv, err
}
