package bgp

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/test/harness"
)

// readBarrier holds the answers to the first n GETs until all n have
// arrived, so n writers start from the same resourceVersion: every race
// happens, deterministically, against the real API server.
type readBarrier struct {
	rt      http.RoundTripper
	mu      sync.Mutex
	waiting int
	release chan struct{}
}

func (b *readBarrier) arm(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waiting, b.release = n, make(chan struct{})
}

func (b *readBarrier) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(r)
	if r.Method != http.MethodGet {
		return resp, err
	}
	b.mu.Lock()
	if b.waiting == 0 {
		b.mu.Unlock()
		return resp, err
	}
	b.waiting--
	release := b.release
	if b.waiting == 0 {
		close(release)
	}
	b.mu.Unlock()
	<-release
	return resp, err
}

func TestPublishersThatReadTheSameVersionAllLandAfterRetrying(t *testing.T) {
	env := harness.Setup(t)
	const n = 16
	barrier := &readBarrier{}
	cfg := rest.CopyConfig(env.CP.Admin)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { barrier.rt = rt; return barrier })
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := advert.New(c.BGPAdvertisements(harness.Namespace))
	// The entries name no real netns; all count as live so that only the
	// races decide the outcome.
	a.Live = func(string) bool { return true }
	key := advert.Key{VPC: vpc, Attachment: "race-0-net0", Node: "node-a"}
	ctx := context.Background()
	all := func(op func(i int) error) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = op(i) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	cidOf := func(i int) string { return fmt.Sprintf("racer-%02d", i) }

	barrier.arm(n)
	all(func(i int) error {
		_, err := a.Publish(ctx, key, v1alpha1.ContainerEntry{ContainerID: cidOf(i), IfName: ifName, Netns: "/var/run/netns/" + cidOf(i), Prefixes: []v1alpha1.Prefix{"10.20.13.5/32"}}, advert.Routing{})
		return err
	})
	addConflicts := a.Conflicts()
	adv := advertisement(t, env, key.Attachment, key.Node)
	var want []string
	for i := range n {
		want = append(want, cidOf(i))
	}
	if adv == nil || !slices.Equal(entryIDs(adv), want) {
		t.Fatalf("all %d entries should land, have %v", n, adv)
	}

	barrier.arm(n)
	all(func(i int) error {
		_, err := a.Release(ctx, key, cidOf(i), ifName)
		return err
	})
	delConflicts := a.Conflicts() - addConflicts
	if advertisement(t, env, key.Attachment, key.Node) != nil {
		t.Fatal("the last release should delete the advertisement")
	}
	t.Logf("conflicts retried: %d while publishing, %d while releasing", addConflicts, delConflicts)
	// All read before any wrote: at most one write per round can win.
	if addConflicts < n-1 || delConflicts < n-1 {
		t.Fatalf("want at least %d conflicts in each phase", n-1)
	}
}
