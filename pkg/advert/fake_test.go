package advert

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

var resource = schema.GroupResource{Group: "network.galactic.dev", Resource: "bgpadvertisements"}

// fakeAPI keeps advertisements in memory with the API server's optimistic
// concurrency: every write bumps the resourceVersion, an update with a stale
// one is a conflict, and a delete checks its preconditions. Verbs a test
// does not allow fail it (the catch-all), and react lets a test act before
// a call as a concurrent writer would.
type fakeAPI struct {
	t       *testing.T
	mu      sync.Mutex
	objs    map[string]*v1alpha1.BGPAdvertisement
	rv      int
	calls   []string
	allowed map[string]bool
	// react runs before each call (without the lock held); a non-nil
	// error is returned instead of performing the call.
	react func(verb, name string) error
}

func newFake(t *testing.T, allowed ...string) *fakeAPI {
	f := &fakeAPI{t: t, objs: map[string]*v1alpha1.BGPAdvertisement{}, allowed: map[string]bool{}}
	for _, v := range allowed {
		f.allowed[v] = true
	}
	return f
}

func (f *fakeAPI) enter(verb, name string) error {
	f.t.Helper()
	f.mu.Lock()
	f.calls = append(f.calls, verb+" "+name)
	ok := f.allowed[verb]
	react := f.react
	f.mu.Unlock()
	if !ok {
		f.t.Errorf("unexpected API call: %s %s", verb, name)
		return apierrors.NewBadRequest("unexpected call " + verb)
	}
	if react != nil {
		return react(verb, name)
	}
	return nil
}

// seed stores obj as if created by someone else.
func (f *fakeAPI) seed(obj *v1alpha1.BGPAdvertisement) *v1alpha1.BGPAdvertisement {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.store(obj.DeepCopy(), true)
}

func (f *fakeAPI) store(obj *v1alpha1.BGPAdvertisement, create bool) *v1alpha1.BGPAdvertisement {
	f.rv++
	obj.ResourceVersion = strconv.Itoa(f.rv)
	if create {
		obj.UID = types.UID("uid-" + obj.ResourceVersion)
	}
	f.objs[obj.Name] = obj
	return obj.DeepCopy()
}

func (f *fakeAPI) get(name string) *v1alpha1.BGPAdvertisement {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.objs[name]; ok {
		return o.DeepCopy()
	}
	return nil
}

func (f *fakeAPI) Get(_ context.Context, name string, _ metav1.GetOptions) (*v1alpha1.BGPAdvertisement, error) {
	if err := f.enter("get", name); err != nil {
		return nil, err
	}
	if o := f.get(name); o != nil {
		return o, nil
	}
	return nil, apierrors.NewNotFound(resource, name)
}

func (f *fakeAPI) List(_ context.Context, opts metav1.ListOptions) (*v1alpha1.BGPAdvertisementList, error) {
	if err := f.enter("list", opts.LabelSelector); err != nil {
		return nil, err
	}
	sel, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	list := &v1alpha1.BGPAdvertisementList{}
	for _, o := range f.objs {
		if sel.Matches(labels.Set(o.Labels)) {
			list.Items = append(list.Items, *o.DeepCopy())
		}
	}
	return list, nil
}

func (f *fakeAPI) Create(_ context.Context, obj *v1alpha1.BGPAdvertisement, _ metav1.CreateOptions) (*v1alpha1.BGPAdvertisement, error) {
	if err := f.enter("create", obj.Name); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.objs[obj.Name]; ok {
		return nil, apierrors.NewAlreadyExists(resource, obj.Name)
	}
	if obj.ResourceVersion != "" {
		return nil, apierrors.NewBadRequest("resourceVersion must not be set on create")
	}
	return f.store(obj.DeepCopy(), true), nil
}

func (f *fakeAPI) Update(_ context.Context, obj *v1alpha1.BGPAdvertisement, _ metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error) {
	if err := f.enter("update", obj.Name); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.objs[obj.Name]
	if !ok {
		return nil, apierrors.NewNotFound(resource, obj.Name)
	}
	if obj.ResourceVersion == "" {
		f.t.Errorf("unguarded update of %s (no resourceVersion)", obj.Name)
	}
	if obj.ResourceVersion != cur.ResourceVersion {
		return nil, apierrors.NewConflict(resource, obj.Name, fmt.Errorf("resourceVersion %s is stale", obj.ResourceVersion))
	}
	next := obj.DeepCopy()
	next.UID = cur.UID
	return f.store(next, false), nil
}

func (f *fakeAPI) Delete(_ context.Context, name string, opts metav1.DeleteOptions) error {
	if err := f.enter("delete", name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.objs[name]
	if !ok {
		return apierrors.NewNotFound(resource, name)
	}
	p := opts.Preconditions
	if p == nil || p.ResourceVersion == nil || p.UID == nil {
		f.t.Errorf("unguarded delete of %s (preconditions %+v)", name, p)
		return apierrors.NewBadRequest("test requires preconditions")
	}
	if *p.UID != cur.UID || *p.ResourceVersion != cur.ResourceVersion {
		return apierrors.NewConflict(resource, name, fmt.Errorf("precondition failed"))
	}
	delete(f.objs, name)
	return nil
}

func (f *fakeAPI) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// liveSet is a liveness judge over a set of netns paths.
type liveSet map[string]bool

func (l liveSet) live(p string) bool { return l[p] }

func instant(ctx context.Context, _ time.Duration) error { return ctx.Err() }

func testAdvertiser(api API, live liveSet) *Advertiser {
	return &Advertiser{API: api, Live: live.live, Sleep: instant}
}
