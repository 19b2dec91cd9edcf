package handoff

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var leaseResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// fakeStore keeps one lease in memory with the API server's
// resourceVersion semantics. With expect set, it fails the test on any call
// other than the next expected one.
type fakeStore struct {
	t *testing.T

	mu     sync.Mutex
	exists bool
	cur    Observed
	rv     int
	calls  []string
	expect []string
	// interfere runs once, before the first write, as another writer.
	interfere func(f *fakeStore)
	// watchers receive the lease on every write.
	watchers []chan Observed
}

func newFakeStore(t *testing.T) *fakeStore { return &fakeStore{t: t} }

// put stores r as another process's write would.
func (f *fakeStore) put(r Record) {
	f.rv++
	f.exists = true
	f.cur = Observed{Record: r, ResourceVersion: strconv.Itoa(f.rv)}
	for _, w := range f.watchers {
		select {
		case <-w:
		default:
		}
		w <- f.cur
	}
}

// watchingFake is a fakeStore that is a Watcher; fail makes Watch fail.
type watchingFake struct {
	*fakeStore
	fail bool
}

func (w watchingFake) Watch(ctx context.Context, resourceVersion string) (<-chan Observed, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.call("watch"); err != nil {
		return nil, err
	}
	if w.fail {
		return nil, fmt.Errorf("watch refused")
	}
	ch := make(chan Observed, 1)
	if resourceVersion != w.cur.ResourceVersion {
		ch <- w.cur // changed since the version asked for
	}
	w.watchers = append(w.watchers, ch)
	return ch, nil
}

func (f *fakeStore) record() (Record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur.Record, f.exists
}

func (f *fakeStore) call(verb string) error {
	f.calls = append(f.calls, verb)
	if f.expect == nil {
		return nil
	}
	i := len(f.calls) - 1
	if i >= len(f.expect) || f.expect[i] != verb {
		f.t.Errorf("unexpected %s call, number %d; expected calls %v", verb, i+1, f.expect)
		return fmt.Errorf("unexpected %s call", verb)
	}
	return nil
}

func (f *fakeStore) write() {
	if f.interfere != nil {
		in := f.interfere
		f.interfere = nil
		in(f)
	}
}

func (f *fakeStore) Get(context.Context) (Observed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("get"); err != nil {
		return Observed{}, err
	}
	if !f.exists {
		return Observed{}, apierrors.NewNotFound(leaseResource, "test")
	}
	return f.cur, nil
}

func (f *fakeStore) Create(_ context.Context, r Record) (Observed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("create"); err != nil {
		return Observed{}, err
	}
	f.write()
	if f.exists {
		return Observed{}, apierrors.NewAlreadyExists(leaseResource, "test")
	}
	f.put(r)
	return f.cur, nil
}

func (f *fakeStore) Update(_ context.Context, resourceVersion string, r Record) (Observed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("update"); err != nil {
		return Observed{}, err
	}
	f.write()
	if !f.exists {
		return Observed{}, apierrors.NewNotFound(leaseResource, "test")
	}
	if resourceVersion != f.cur.ResourceVersion {
		return Observed{}, apierrors.NewConflict(leaseResource, "test", fmt.Errorf("resourceVersion %s is stale", resourceVersion))
	}
	f.put(r)
	return f.cur, nil
}
