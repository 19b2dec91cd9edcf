// Package adverttest is an in-memory BGPAdvertisement API for unit tests,
// with the API server's resourceVersion and precondition semantics and a
// catch-all that fails the test on any verb it did not allow.
package adverttest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// Resource is the fake's group-resource, for building API errors.
var Resource = schema.GroupResource{Group: "network.galactic.dev", Resource: "bgpadvertisements"}

// Fake keeps advertisements in memory with the API server's optimistic
// concurrency: every write bumps the resourceVersion, an update with a stale
// one is a conflict, and a delete checks its preconditions; an update
// without a resourceVersion or a delete without UID and resourceVersion
// preconditions fails the test. Verbs (get, list, create, update, delete)
// the test did not allow fail it too.
type Fake struct {
	t       testing.TB
	mu      sync.Mutex
	objs    map[string]*v1alpha1.BGPAdvertisement
	rv      int
	calls   []string
	allowed map[string]bool
	// React, if set, runs before each call, as a concurrent writer would
	// act; a non-nil error is returned instead of performing the call. It
	// may use Seed, Object and Store.
	React func(verb, name string) error
}

// New returns an empty fake that allows only the given verbs.
func New(t testing.TB, allowed ...string) *Fake {
	f := &Fake{t: t, objs: map[string]*v1alpha1.BGPAdvertisement{}, allowed: map[string]bool{}}
	for _, v := range allowed {
		f.allowed[v] = true
	}
	return f
}

func (f *Fake) enter(verb, name string) error {
	f.t.Helper()
	f.mu.Lock()
	f.calls = append(f.calls, verb+" "+name)
	ok := f.allowed[verb]
	react := f.React
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

// Seed stores obj as if created by someone else and returns the stored copy.
func (f *Fake) Seed(obj *v1alpha1.BGPAdvertisement) *v1alpha1.BGPAdvertisement {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.store(obj.DeepCopy(), true)
}

// Store overwrites an existing object as another writer's update would,
// bumping its resourceVersion, and returns the stored copy.
func (f *Fake) Store(obj *v1alpha1.BGPAdvertisement) *v1alpha1.BGPAdvertisement {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := obj.DeepCopy()
	if cur, ok := f.objs[obj.Name]; ok {
		next.UID = cur.UID
	}
	return f.store(next, false)
}

// Remove deletes an object as another writer would.
func (f *Fake) Remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.objs, name)
}

func (f *Fake) store(obj *v1alpha1.BGPAdvertisement, create bool) *v1alpha1.BGPAdvertisement {
	f.rv++
	obj.ResourceVersion = strconv.Itoa(f.rv)
	if create {
		obj.UID = types.UID("uid-" + obj.ResourceVersion)
	}
	f.objs[obj.Name] = obj
	return obj.DeepCopy()
}

// Object returns a copy of the stored object, or nil.
func (f *Fake) Object(name string) *v1alpha1.BGPAdvertisement {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.objs[name]; ok {
		return o.DeepCopy()
	}
	return nil
}

func (f *Fake) Get(_ context.Context, name string, _ metav1.GetOptions) (*v1alpha1.BGPAdvertisement, error) {
	if err := f.enter("get", name); err != nil {
		return nil, err
	}
	if o := f.Object(name); o != nil {
		return o, nil
	}
	return nil, apierrors.NewNotFound(Resource, name)
}

func (f *Fake) List(_ context.Context, opts metav1.ListOptions) (*v1alpha1.BGPAdvertisementList, error) {
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

func (f *Fake) Create(_ context.Context, obj *v1alpha1.BGPAdvertisement, _ metav1.CreateOptions) (*v1alpha1.BGPAdvertisement, error) {
	if err := f.enter("create", obj.Name); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.objs[obj.Name]; ok {
		return nil, apierrors.NewAlreadyExists(Resource, obj.Name)
	}
	if obj.ResourceVersion != "" {
		return nil, apierrors.NewBadRequest("resourceVersion must not be set on create")
	}
	return f.store(obj.DeepCopy(), true), nil
}

func (f *Fake) Update(_ context.Context, obj *v1alpha1.BGPAdvertisement, _ metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error) {
	if err := f.enter("update", obj.Name); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.objs[obj.Name]
	if !ok {
		return nil, apierrors.NewNotFound(Resource, obj.Name)
	}
	if obj.ResourceVersion == "" {
		f.t.Errorf("unguarded update of %s (no resourceVersion)", obj.Name)
	}
	if obj.ResourceVersion != cur.ResourceVersion {
		return nil, apierrors.NewConflict(Resource, obj.Name, fmt.Errorf("resourceVersion %s is stale", obj.ResourceVersion))
	}
	next := obj.DeepCopy()
	next.UID = cur.UID
	return f.store(next, false), nil
}

func (f *Fake) Delete(_ context.Context, name string, opts metav1.DeleteOptions) error {
	if err := f.enter("delete", name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.objs[name]
	if !ok {
		return apierrors.NewNotFound(Resource, name)
	}
	p := opts.Preconditions
	if p == nil || p.ResourceVersion == nil || p.UID == nil {
		f.t.Errorf("unguarded delete of %s (preconditions %+v)", name, p)
		return apierrors.NewBadRequest("test requires preconditions")
	}
	if *p.UID != cur.UID || *p.ResourceVersion != cur.ResourceVersion {
		return apierrors.NewConflict(Resource, name, fmt.Errorf("precondition failed"))
	}
	delete(f.objs, name)
	return nil
}

// Calls lists the calls made, each "<verb> <name or label selector>".
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}
