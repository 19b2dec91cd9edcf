package handoff

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// readsClient is a Lease client that answers every read with one lease
// and records the resourceVersion each read asked for.
type readsClient struct {
	asked []string
}

func (c *readsClient) Get(_ context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	c.asked = append(c.asked, opts.ResourceVersion)
	return LeaseFromRecord("ns", name, "7", Record{LeaseTransitions: 3}), nil
}

func (c *readsClient) Create(context.Context, *coordinationv1.Lease, metav1.CreateOptions) (*coordinationv1.Lease, error) {
	panic("not a read")
}

func (c *readsClient) Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	panic("not a read")
}

func TestReadCachedAsksTheAPIServersCacheAndReadAsksEtcd(t *testing.T) {
	c := &readsClient{}
	l, err := New(c, "ns", "blue.web", Options{LeaseDuration: lease})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, read := range []func(context.Context) (Observed, error){l.ReadCached, l.Read} {
		if o, err := read(ctx); err != nil || o.ResourceVersion != "7" || o.Record.LeaseTransitions != 3 {
			t.Fatalf("read %+v, %v", o, err)
		}
	}
	if len(c.asked) != 2 || c.asked[0] != "0" || c.asked[1] != "" {
		t.Errorf("reads asked for resourceVersions %q, want the cache's (\"0\") then etcd's (\"\")", c.asked)
	}
}

func TestReadCachedOfAStoreWithoutACacheReads(t *testing.T) {
	s := newFakeStore(t)
	s.put(Record{LeaseTransitions: 2})
	l := newLock(t, s, clocktesting.NewFakeClock(epoch), "")
	if o, err := l.ReadCached(context.Background()); err != nil || o.Record.LeaseTransitions != 2 {
		t.Fatalf("read %+v, %v", o, err)
	}
}
