package router

import (
	"context"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// AttachmentClient is what the daemon needs of the VPCAttachment client
// of all namespaces.
type AttachmentClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.VPCAttachmentList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// byAttachmentUID indexes advertisements by their attachment-uid label
// and attachments by their UID.
const byAttachmentUID = "attachmentUID"

func advertUIDs(obj any) ([]string, error) {
	if adv, ok := obj.(*v1alpha1.BGPAdvertisement); ok {
		if uid := AttachmentUID(adv); uid != "" {
			return []string{uid}, nil
		}
	}
	return nil, nil
}

func attachmentUIDs(obj any) ([]string, error) {
	if att, ok := obj.(*v1alpha1.VPCAttachment); ok {
		return []string{string(att.UID)}, nil
	}
	return nil, nil
}

// startAttachments runs the VPCAttachment informer until ctx ends. Every
// node caches every attachment of the cluster, so the cache holds only
// what Claim and Owned read.
func (a *apiStage) startAttachments(ctx context.Context, c AttachmentClient) error {
	if c == nil {
		return nil
	}
	a.att = cache.NewSharedIndexInformer(listWatch(a.clock, c.List, c.Watch, ""),
		&v1alpha1.VPCAttachment{}, 0, cache.Indexers{byAttachmentUID: attachmentUIDs})
	if err := a.att.SetTransform(slimAttachment); err != nil {
		return err
	}
	if _, err := a.att.AddEventHandler(a.attachmentEvents()); err != nil {
		return err
	}
	go a.att.RunWithContext(ctx)
	return nil
}

// attachmentEvents starts a pass for an attachment's change that an
// advertisement of this node can be judged by: one that changes what the
// attachment grants, of an attachment such an advertisement names.
func (a *apiStage) attachmentEvents() cache.ResourceEventHandlerFuncs {
	named := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		att, ok := obj.(*v1alpha1.VPCAttachment)
		if !ok {
			a.changed()
			return
		}
		if advs, _ := a.adv.GetIndexer().ByIndex(byAttachmentUID, string(att.UID)); len(advs) > 0 {
			a.changed()
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: named,
		UpdateFunc: func(o, n any) {
			x, okX := o.(*v1alpha1.VPCAttachment)
			y, okY := n.(*v1alpha1.VPCAttachment)
			if okX && okY && sameGrant(x, y) {
				return
			}
			named(n)
		},
		DeleteFunc: named,
	}
}

// slimAttachment keeps of an attachment its identity and what it grants:
// no spec, conditions, annotations or managedFields.
func slimAttachment(obj any) (any, error) {
	att, ok := obj.(*v1alpha1.VPCAttachment)
	if !ok {
		return obj, nil
	}
	return &v1alpha1.VPCAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name: att.Name, Namespace: att.Namespace, UID: att.UID, ResourceVersion: att.ResourceVersion,
		},
		Status: v1alpha1.VPCAttachmentStatus{VNI: att.Status.VNI, Addresses: att.Status.Addresses, Dataplane: att.Status.Dataplane},
	}, nil
}

// sameGrant says whether two versions of an attachment grant alike.
func sameGrant(x, y *v1alpha1.VPCAttachment) bool {
	return x.UID == y.UID && x.Namespace == y.Namespace && x.Status.VNI == y.Status.VNI &&
		slices.Equal(x.Status.Addresses, y.Status.Addresses) && ptrEqual(x.Status.Dataplane, y.Status.Dataplane)
}

// lookup finds a cached attachment by UID; nil without the informer.
func (a *apiStage) lookup() AttachmentLookup {
	if a.att == nil {
		return nil
	}
	return func(uid string) *v1alpha1.VPCAttachment {
		objs, _ := a.att.GetIndexer().ByIndex(byAttachmentUID, uid)
		for _, o := range objs {
			if att, ok := o.(*v1alpha1.VPCAttachment); ok {
				return att
			}
		}
		return nil
	}
}
