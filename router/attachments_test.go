package router

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// attachmentAPI streams its attachments, as the informers ask
// (WatchListClient), once that is allowed (closed allow), and nothing
// after.
type attachmentAPI struct {
	items []v1alpha1.VPCAttachment
	allow chan struct{}
}

func (f attachmentAPI) List(ctx context.Context, _ metav1.ListOptions) (*v1alpha1.VPCAttachmentList, error) {
	select {
	case <-f.allow:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &v1alpha1.VPCAttachmentList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: f.items}, nil
}

func (f attachmentAPI) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	w := watch.NewFakeWithChanSize(len(f.items)+1, false)
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		select {
		case <-f.allow:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		for i := range f.items {
			w.Add(f.items[i].DeepCopy())
		}
		w.Action(watch.Bookmark, &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1",
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	}
	return w, nil
}

func TestTheAttachmentCacheHoldsWhatAJudgementReadsByUIDAndGatesTheSync(t *testing.T) {
	full := webAttachment()
	full.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "galactic-controller", Operation: metav1.ManagedFieldsOperationUpdate}}
	full.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
	full.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllocated}}
	api := attachmentAPI{items: []v1alpha1.VPCAttachment{*full}, allow: make(chan struct{})}
	a := &apiStage{node: "node-a", clock: clock.RealClock{}, kick: func() {}, leaseEvents: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := a.start(ctx, Options{Adverts: fixedAPI{}, Attachments: api}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the advertisements synced", a.adv.HasSynced)
	// Judged before the attachments are known, every object-backed
	// advertisement would be withdrawn.
	if a.synced() {
		t.Fatal("synced before the attachments were listed")
	}
	close(api.allow)
	waitFor(t, "the attachments synced", a.synced)
	got := a.lookup()(webUID)
	if got == nil {
		t.Fatalf("no attachment of UID %s in the cache", webUID)
	}
	if got.ManagedFields != nil || got.Annotations != nil || got.Status.Conditions != nil || got.Spec.VPC != "" {
		t.Errorf("cached %+v: want no managedFields, annotations, conditions or spec", got)
	}
	if got.Namespace != "tenant-a" || got.Status.VNI != 10100 || len(got.Status.Addresses) != 2 || *got.Status.Dataplane != *full.Status.Dataplane {
		t.Errorf("cached %+v: want its namespace, VNI, addresses and data-plane names", got)
	}
	if a.lookup()("another-uid") != nil {
		t.Error("found an attachment of a UID none has")
	}
}

func TestAnAttachmentsChangeStartsAPassOnlyWhenItCanChangeAJudgement(t *testing.T) {
	named := objectBacked(advert("web-0", "blue", 10100, 0, "", web), "tenant-a", webUID)
	kicks := 0
	a := &apiStage{kick: func() { kicks++ }}
	a.adv = cache.NewSharedIndexInformer(&cache.ListWatch{}, &v1alpha1.BGPAdvertisement{}, 0, cache.Indexers{byAttachmentUID: advertUIDs})
	if err := a.adv.GetIndexer().Add(named); err != nil {
		t.Fatal(err)
	}
	h := a.attachmentEvents()
	slim := func(att *v1alpha1.VPCAttachment) *v1alpha1.VPCAttachment {
		o, _ := slimAttachment(att)
		return o.(*v1alpha1.VPCAttachment)
	}
	before := slim(webAttachment())
	conditions := webAttachment()
	conditions.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue}}
	conditions.ResourceVersion = "7"
	addresses := webAttachment()
	addresses.Status.Addresses = addresses.Status.Addresses[:1]
	unnamed := webAttachment()
	unnamed.UID = "another-uid"
	steps := []struct {
		name string
		do   func()
		kick bool
	}{
		{"a named attachment appears", func() { h.OnAdd(before, false) }, true},
		{"an unnamed attachment appears", func() { h.OnAdd(slim(unnamed), false) }, false},
		{"only its conditions change (the controller copying Programmed)", func() { h.OnUpdate(before, slim(conditions)) }, false},
		{"its addresses change", func() { h.OnUpdate(before, slim(addresses)) }, true},
		{"an unnamed one's addresses change", func() {
			changed := unnamed.DeepCopy()
			changed.Status.Addresses = nil
			h.OnUpdate(slim(unnamed), slim(changed))
		}, false},
		{"it is deleted", func() { h.OnDelete(before) }, true},
		{"it is deleted while the watch was down", func() { h.OnDelete(cache.DeletedFinalStateUnknown{Key: "tenant-a/web-0", Obj: before}) }, true},
		{"an unnamed one is deleted", func() { h.OnDelete(slim(unnamed)) }, false},
	}
	for _, s := range steps {
		kicks = 0
		s.do()
		if got := kicks > 0; got != s.kick {
			t.Errorf("%s: pass started %v, want %v", s.name, got, s.kick)
		}
	}
}
