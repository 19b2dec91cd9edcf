package advert

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/galactic-cni/galactic/pkg/advert/adverttest"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

var _ API = (*adverttest.Fake)(nil)

var keyA = Key{VPC: "blue", Attachment: "web-0-net0", Node: "node-a"}

// liveSet is a liveness judge over a set of netns paths.
type liveSet map[string]bool

func (l liveSet) live(p string) bool { return l[p] }

func instant(ctx context.Context, _ time.Duration) error { return ctx.Err() }

func testAdvertiser(api API, live liveSet) *Advertiser {
	return &Advertiser{API: api, Live: live.live, Sleep: instant}
}

func entry(cid, netns string, prefixes ...v1alpha1.Prefix) v1alpha1.ContainerEntry {
	return v1alpha1.ContainerEntry{ContainerID: cid, IfName: "net0", Netns: netns, Prefixes: prefixes}
}

func existing(k Key, entries ...v1alpha1.ContainerEntry) *v1alpha1.BGPAdvertisement {
	return newAdvertisement(k, entries)
}

func entryIDs(obj *v1alpha1.BGPAdvertisement) []string {
	var ids []string
	for _, c := range obj.Spec.Containers {
		ids = append(ids, c.ContainerID)
	}
	return ids
}

func wantCalls(t *testing.T, f *adverttest.Fake, want ...string) {
	t.Helper()
	if got := f.Calls(); !slices.Equal(got, want) {
		t.Errorf("API calls:\n got %q\nwant %q", got, want)
	}
}

func TestPublishCreatesTheAdvertisementWithLabelsAndHostPrefixes(t *testing.T) {
	f := adverttest.New(t, "get", "create")
	a := testAdvertiser(f, liveSet{})
	e := entry("c1", "/run/netns/c1", "fd20::5/128", "10.20.0.5/32")
	e.HolderGeneration = 4
	res, err := a.Publish(context.Background(), keyA, e, Routing{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Created || res.Name != "blue.web-0-net0.node-a" {
		t.Errorf("result = %+v", res)
	}
	got := f.Object(keyA.Name())
	if !slices.Equal(got.Spec.Prefixes, []v1alpha1.Prefix{"10.20.0.5/32", "fd20::5/128"}) {
		t.Errorf("spec.prefixes = %q", got.Spec.Prefixes)
	}
	if got.Spec.VPC != "blue" || got.Spec.Attachment != "web-0-net0" || got.Spec.Node != "node-a" {
		t.Errorf("spec = %+v", got.Spec)
	}
	for k, v := range names.AdvertisementLabels("blue", "web-0-net0", "node-a") {
		if got.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, got.Labels[k], v)
		}
	}
	if c := got.Spec.Containers; len(c) != 1 || c[0].HolderGeneration != 4 || c[0].Netns != "/run/netns/c1" {
		t.Errorf("containers = %+v", c)
	}
	wantCalls(t, f, "get "+keyA.Name(), "create "+keyA.Name())
}

// The lease holder's entry: one create when the node has no
// advertisement of the attachment; when it has one after all, the entry
// joins it as Publish would, pruning the dead.
func TestPublishNewCreatesWithoutReadingAndUpdatesWhatExistsAfterAll(t *testing.T) {
	f := adverttest.New(t, "get", "create", "update")
	a := testAdvertiser(f, liveSet{"/run/netns/live": true})
	res, err := a.PublishNew(context.Background(), keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32"), Routing{VNI: 7})
	if err != nil || res.Outcome != Created || f.Object(keyA.Name()).Spec.VNI != 7 {
		t.Fatalf("res %+v err %v", res, err)
	}
	wantCalls(t, f, "create "+keyA.Name())

	f = adverttest.New(t, "get", "create", "update")
	f.Seed(existing(keyA,
		entry("c-live", "/run/netns/live", "10.20.0.7/32"),
		entry("c-dead", "/run/netns/dead", "10.20.0.9/32")))
	a = testAdvertiser(f, liveSet{"/run/netns/live": true})
	res, err = a.PublishNew(context.Background(), keyA, entry("c2", "/run/netns/c2", "10.20.0.5/32"), Routing{})
	if err != nil || res.Outcome != Updated || len(res.Removed) != 1 || res.Removed[0].ContainerID != "c-dead" {
		t.Fatalf("res %+v err %v", res, err)
	}
	if ids := entryIDs(f.Object(keyA.Name())); !slices.Equal(ids, []string{"c-live", "c2"}) {
		t.Errorf("entries = %q", ids)
	}
	wantCalls(t, f, "create "+keyA.Name(), "get "+keyA.Name(), "update "+keyA.Name())
}

func TestPublishAddsAnEntryPrunesDeadOnesAndRecomputesThePrefixes(t *testing.T) {
	f := adverttest.New(t, "get", "update")
	f.Seed(existing(keyA,
		entry("c-live", "/run/netns/live", "10.20.0.7/32"),
		entry("c-dead", "/run/netns/dead", "10.20.0.9/32")))
	a := testAdvertiser(f, liveSet{"/run/netns/live": true})
	res, err := a.Publish(context.Background(), keyA, entry("c-new", "/run/netns/new", "10.20.0.5/32"), Routing{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Updated || len(res.Removed) != 1 || res.Removed[0].ContainerID != "c-dead" {
		t.Errorf("result = %+v", res)
	}
	got := f.Object(keyA.Name())
	if ids := entryIDs(got); !slices.Equal(ids, []string{"c-live", "c-new"}) {
		t.Errorf("entries = %q", ids)
	}
	if !slices.Equal(got.Spec.Prefixes, []v1alpha1.Prefix{"10.20.0.5/32", "10.20.0.7/32"}) {
		t.Errorf("spec.prefixes = %q", got.Spec.Prefixes)
	}
	wantCalls(t, f, "get "+keyA.Name(), "update "+keyA.Name())
}

func TestPublishingTheSameEntryAgainWritesNothing(t *testing.T) {
	f := adverttest.New(t, "get")
	f.Seed(existing(keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32")))
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true})
	res, err := a.Publish(context.Background(), keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32"), Routing{})
	if err != nil || res.Outcome != Unchanged {
		t.Fatalf("res %+v err %v", res, err)
	}
	wantCalls(t, f, "get "+keyA.Name())
}

func TestPublishReplacesTheContainersOwnEntry(t *testing.T) {
	f := adverttest.New(t, "get", "update")
	f.Seed(existing(keyA, entry("c1", "/run/netns/old", "10.20.0.5/32")))
	a := testAdvertiser(f, liveSet{})
	if _, err := a.Publish(context.Background(), keyA, entry("c1", "/run/netns/new", "10.20.0.6/32"), Routing{}); err != nil {
		t.Fatal(err)
	}
	got := f.Object(keyA.Name())
	if len(got.Spec.Containers) != 1 || got.Spec.Containers[0].Netns != "/run/netns/new" ||
		!slices.Equal(got.Spec.Prefixes, []v1alpha1.Prefix{"10.20.0.6/32"}) {
		t.Errorf("spec = %+v", got.Spec)
	}
}

func TestPublishRereadsAndRetriesWhenAConcurrentWriterWins(t *testing.T) {
	f := adverttest.New(t, "get", "update")
	f.Seed(existing(keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32")))
	raced := false
	f.React = func(verb, name string) error {
		if verb == "update" && !raced {
			raced = true
			// Another container's ADD lands between our read and write.
			cur := f.Object(name)
			next := withEntries(cur, keyA, append(cur.Spec.Containers, entry("c2", "/run/netns/c2", "10.20.0.5/32")))
			f.Store(next)
		}
		return nil
	}
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true, "/run/netns/c2": true})
	res, err := a.Publish(context.Background(), keyA, entry("c3", "/run/netns/c3", "10.20.0.5/32"), Routing{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Conflicts != 1 || a.Conflicts() != 1 {
		t.Errorf("conflicts: result %d, advertiser %d; want 1", res.Conflicts, a.Conflicts())
	}
	if ids := entryIDs(f.Object(keyA.Name())); !slices.Equal(ids, []string{"c1", "c2", "c3"}) {
		t.Errorf("the concurrent writer's entry must survive: entries %q", ids)
	}
	wantCalls(t, f, "get "+keyA.Name(), "update "+keyA.Name(), "get "+keyA.Name(), "update "+keyA.Name())
}

func TestPublishThatLosesTheCreateRaceUpdatesTheWinnersObject(t *testing.T) {
	f := adverttest.New(t, "get", "create", "update")
	f.React = func(verb, name string) error {
		if verb == "create" && f.Object(name) == nil {
			f.Seed(existing(keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32")))
		}
		return nil
	}
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true})
	res, err := a.Publish(context.Background(), keyA, entry("c2", "/run/netns/c2", "10.20.0.5/32"), Routing{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Updated || res.Conflicts != 1 {
		t.Errorf("result = %+v", res)
	}
	if ids := entryIDs(f.Object(keyA.Name())); !slices.Equal(ids, []string{"c1", "c2"}) {
		t.Errorf("entries = %q", ids)
	}
}

func TestPublishRecreatesAnAdvertisementDeletedBetweenReadAndWrite(t *testing.T) {
	f := adverttest.New(t, "get", "update", "create")
	f.Seed(existing(keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32")))
	f.React = func(verb, name string) error {
		if verb == "update" {
			// The last container's DEL deletes it first.
			f.Remove(name)
		}
		return nil
	}
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true})
	res, err := a.Publish(context.Background(), keyA, entry("c2", "/run/netns/c2", "10.20.0.5/32"), Routing{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Created || res.Conflicts != 1 {
		t.Errorf("result = %+v", res)
	}
	if ids := entryIDs(f.Object(keyA.Name())); !slices.Equal(ids, []string{"c2"}) {
		t.Errorf("entries = %q", ids)
	}
}

func TestPublishRefusesAnObjectThatDescribesAnotherNode(t *testing.T) {
	f := adverttest.New(t, "get")
	obj := existing(keyA, entry("c1", "/run/netns/c1"))
	obj.Spec.Node = "node-z"
	f.Seed(obj)
	a := testAdvertiser(f, liveSet{})
	_, err := a.Publish(context.Background(), keyA, entry("c2", "/run/netns/c2"), Routing{})
	if err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("want a refusal, got %v", err)
	}
	wantCalls(t, f, "get "+keyA.Name())
}

func TestReleaseDeletesTheAdvertisementOfTheLastContainerWithPreconditions(t *testing.T) {
	f := adverttest.New(t, "get", "delete")
	f.Seed(existing(keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32")))
	// The netns is still there during DEL: the entry is gone, so nothing is left.
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true})
	res, err := a.Release(context.Background(), keyA, "c1", "net0")
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Deleted || len(res.Removed) != 1 {
		t.Errorf("result = %+v", res)
	}
	if f.Object(keyA.Name()) != nil {
		t.Error("the advertisement must be gone")
	}
	wantCalls(t, f, "get "+keyA.Name(), "delete "+keyA.Name())
}

func TestReleaseKeepsALiveReplacementsEntryAndPrefixes(t *testing.T) {
	f := adverttest.New(t, "get", "update")
	f.Seed(existing(keyA,
		entry("old", "/run/netns/old", "10.20.0.5/32"),
		entry("new", "/run/netns/new", "10.20.0.5/32")))
	a := testAdvertiser(f, liveSet{"/run/netns/old": true, "/run/netns/new": true})
	res, err := a.Release(context.Background(), keyA, "old", "net0")
	if err != nil || res.Outcome != Updated {
		t.Fatalf("res %+v err %v", res, err)
	}
	got := f.Object(keyA.Name())
	if ids := entryIDs(got); !slices.Equal(ids, []string{"new"}) {
		t.Errorf("entries = %q", ids)
	}
	if !slices.Equal(got.Spec.Prefixes, []v1alpha1.Prefix{"10.20.0.5/32"}) {
		t.Errorf("spec.prefixes = %q", got.Spec.Prefixes)
	}
}

func TestReleaseDeletesWhenOnlyDeadEntriesRemain(t *testing.T) {
	f := adverttest.New(t, "get", "delete")
	f.Seed(existing(keyA, entry("c1", "/run/netns/c1"), entry("gone", "/run/netns/gone")))
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true})
	res, err := a.Release(context.Background(), keyA, "c1", "net0")
	if err != nil || res.Outcome != Deleted {
		t.Fatalf("res %+v err %v", res, err)
	}
}

func TestReleaseWithNothingToReleaseWritesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		seed *v1alpha1.BGPAdvertisement
		want Outcome
	}{
		{"no advertisement", nil, Absent},
		{"an advertisement without this entry", existing(keyA, entry("other", "/run/netns/other")), Unchanged},
		{"an entry of another interface", existing(keyA, v1alpha1.ContainerEntry{ContainerID: "c1", IfName: "net1"}), Unchanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := adverttest.New(t, "get")
			if tc.seed != nil {
				f.Seed(tc.seed)
			}
			res, err := testAdvertiser(f, liveSet{}).Release(context.Background(), keyA, "c1", "net0")
			if err != nil || res.Outcome != tc.want {
				t.Fatalf("res %+v err %v", res, err)
			}
			wantCalls(t, f, "get "+keyA.Name())
		})
	}
}

func TestReleaseUpdatesInsteadOfDeletingWhenAReplacementArrivedMeanwhile(t *testing.T) {
	f := adverttest.New(t, "get", "delete", "update")
	f.Seed(existing(keyA, entry("old", "/run/netns/old", "10.20.0.5/32")))
	done := false
	f.React = func(verb, name string) error {
		if verb == "delete" && !done {
			done = true
			cur := f.Object(name)
			next := withEntries(cur, keyA, append(cur.Spec.Containers, entry("new", "/run/netns/new", "10.20.0.5/32")))
			f.Store(next)
		}
		return nil
	}
	a := testAdvertiser(f, liveSet{"/run/netns/old": true, "/run/netns/new": true})
	res, err := a.Release(context.Background(), keyA, "old", "net0")
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Updated || res.Conflicts != 1 {
		t.Errorf("result = %+v", res)
	}
	if ids := entryIDs(f.Object(keyA.Name())); !slices.Equal(ids, []string{"new"}) {
		t.Errorf("the replacement's entry must survive: %q", ids)
	}
}

func TestRetriesStopWhenTheContextEnds(t *testing.T) {
	f := adverttest.New(t, "get")
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	f.React = func(string, string) error { return refused }
	ctx, cancel := context.WithCancel(context.Background())
	attempts := 0
	a := testAdvertiser(f, liveSet{})
	a.Sleep = func(ctx context.Context, _ time.Duration) error {
		attempts++
		if attempts == 3 {
			cancel()
		}
		return ctx.Err()
	}
	_, err := a.Release(ctx, keyA, "c1", "net0")
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, context.Canceled) {
		t.Fatalf("want the last API error and the reason retries stopped, got %v", err)
	}
	if n := len(f.Calls()); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	if a.Conflicts() != 0 {
		t.Error("transport errors are not conflicts")
	}
}

func TestErrorsRetryingCannotFixAreReturnedAtOnce(t *testing.T) {
	f := adverttest.New(t, "get")
	f.React = func(_, name string) error {
		return apierrors.NewForbidden(adverttest.Resource, name, errors.New("RBAC"))
	}
	_, err := testAdvertiser(f, liveSet{}).Publish(context.Background(), keyA, entry("c1", "/x"), Routing{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("want forbidden, got %v", err)
	}
	wantCalls(t, f, "get "+keyA.Name())
}

func TestRemoveDropsExactlyTheEntriesNotValid(t *testing.T) {
	f := adverttest.New(t, "get", "update")
	f.Seed(existing(keyA,
		entry("c1", "/run/netns/c1", "10.20.0.1/32"),
		entry("c2", "/run/netns/c2", "10.20.0.2/32"),
		entry("c3", "/run/netns/c3", "10.20.0.3/32")))
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true, "/run/netns/c2": true, "/run/netns/c3": true})
	valid := map[string]bool{"c1": true, "c3": true}
	res, err := a.Remove(context.Background(), keyA, func(c v1alpha1.ContainerEntry) bool { return !valid[c.ContainerID] })
	if err != nil || res.Outcome != Updated {
		t.Fatalf("res %+v err %v", res, err)
	}
	got := f.Object(keyA.Name())
	if ids := entryIDs(got); !slices.Equal(ids, []string{"c1", "c3"}) {
		t.Errorf("entries = %q", ids)
	}
	if !slices.Equal(got.Spec.Prefixes, []v1alpha1.Prefix{"10.20.0.1/32", "10.20.0.3/32"}) {
		t.Errorf("spec.prefixes = %q", got.Spec.Prefixes)
	}
}

func TestPruneDropsDeadEntriesAndDeletesAdvertisementsLeftWithoutLiveOnes(t *testing.T) {
	f := adverttest.New(t, "update", "delete")
	mixed := f.Seed(existing(Key{VPC: "blue", Attachment: "mixed", Node: "node-a"}, entry("live", "/run/netns/live"), entry("dead", "/run/netns/dead")))
	allDead := f.Seed(existing(Key{VPC: "blue", Attachment: "all-dead", Node: "node-a"}, entry("dead", "/run/netns/dead")))
	healthy := f.Seed(existing(Key{VPC: "blue", Attachment: "healthy", Node: "node-a"}, entry("live", "/run/netns/live")))
	empty := f.Seed(existing(Key{VPC: "blue", Attachment: "empty", Node: "node-a"}))
	other := f.Seed(existing(Key{VPC: "blue", Attachment: "mixed", Node: "node-b"}, entry("dead", "/run/netns/dead")))
	a := testAdvertiser(f, liveSet{"/run/netns/live": true})

	results, err := a.Prune(context.Background(), "node-a", []v1alpha1.BGPAdvertisement{*mixed, *allDead, *healthy, *empty, *other})
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{Updated, Deleted, Unchanged, Deleted, Skipped}
	for i, r := range results {
		if r.Outcome != want[i] {
			t.Errorf("%s: %s, want %s", r.Name, r.Outcome, want[i])
		}
	}
	if ids := entryIDs(f.Object(mixed.Name)); !slices.Equal(ids, []string{"live"}) {
		t.Errorf("mixed entries = %q", ids)
	}
	if f.Object(allDead.Name) != nil || f.Object(empty.Name) != nil {
		t.Error("advertisements without a live entry must be deleted")
	}
	if f.Object(other.Name) == nil || f.Object(healthy.Name) == nil {
		t.Error("another node's advertisement and a healthy one must stay")
	}
	wantCalls(t, f, "update "+mixed.Name, "delete "+allDead.Name, "delete "+empty.Name)
}

func TestPruneRereadsAStaleListedObject(t *testing.T) {
	f := adverttest.New(t, "delete", "get", "update")
	listed := f.Seed(existing(keyA, entry("dead", "/run/netns/dead")))
	// After the list, a new container published on this node.
	cur := f.Object(keyA.Name())
	f.Store(withEntries(cur, keyA, append(cur.Spec.Containers, entry("new", "/run/netns/new"))))

	a := testAdvertiser(f, liveSet{"/run/netns/new": true})
	results, err := a.Prune(context.Background(), "node-a", []v1alpha1.BGPAdvertisement{*listed})
	if err != nil {
		t.Fatal(err)
	}
	if results[0].Outcome != Updated || results[0].Conflicts != 1 {
		t.Errorf("result = %+v", results[0])
	}
	if ids := entryIDs(f.Object(keyA.Name())); !slices.Equal(ids, []string{"new"}) {
		t.Errorf("entries = %q", ids)
	}
	wantCalls(t, f, "delete "+keyA.Name(), "get "+keyA.Name(), "update "+keyA.Name())
}

func TestDeleteOthersDeletesOnlyOtherNodesAdvertisementsOfTheAttachment(t *testing.T) {
	f := adverttest.New(t, "list", "delete")
	own := f.Seed(existing(keyA, entry("c1", "/x")))
	onB := f.Seed(existing(Key{VPC: "blue", Attachment: "web-0-net0", Node: "node-b"}, entry("c0", "/y")))
	onC := f.Seed(existing(Key{VPC: "blue", Attachment: "web-0-net0", Node: "node-c"}, entry("c9", "/z")))
	otherAtt := f.Seed(existing(Key{VPC: "blue", Attachment: "db-0-net0", Node: "node-b"}, entry("c2", "/y")))
	otherVPC := f.Seed(existing(Key{VPC: "red", Attachment: "web-0-net0", Node: "node-b"}, entry("c3", "/y")))

	deleted, err := testAdvertiser(f, liveSet{}).DeleteOthers(context.Background(), keyA)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{onB.Name, onC.Name}) {
		t.Errorf("deleted %q", deleted)
	}
	for _, keep := range []*v1alpha1.BGPAdvertisement{own, otherAtt, otherVPC} {
		if f.Object(keep.Name) == nil {
			t.Errorf("%s must stay", keep.Name)
		}
	}
}

func TestDeleteOthersLeavesAnAdvertisementWrittenSinceItWasListed(t *testing.T) {
	f := adverttest.New(t, "list", "delete")
	onB := f.Seed(existing(Key{VPC: "blue", Attachment: "web-0-net0", Node: "node-b"}, entry("c0", "/y")))
	f.React = func(verb, name string) error {
		if verb == "delete" {
			// node-b writes between our list and our delete.
			f.Store(f.Object(name))
		}
		return nil
	}
	deleted, err := testAdvertiser(f, liveSet{}).DeleteOthers(context.Background(), keyA)
	if len(deleted) != 0 || !apierrors.IsConflict(err) {
		t.Fatalf("deleted %q err %v; want nothing deleted and a conflict", deleted, err)
	}
	if f.Object(onB.Name) == nil {
		t.Error("the rewritten advertisement must stay")
	}
	wantCalls(t, f, "list "+names.AttachmentSelector("blue", "web-0-net0"), "delete "+onB.Name)
}

func TestHostPrefixesAndUnionAreSortedAndDeduplicated(t *testing.T) {
	ips := []net.IP{net.ParseIP("fd20::5"), net.ParseIP("10.20.0.10"), net.ParseIP("10.20.0.9"), net.ParseIP("10.20.0.9").To4()}
	got := HostPrefixes(ips)
	want := []v1alpha1.Prefix{"10.20.0.9/32", "10.20.0.10/32", "fd20::5/128"}
	if !slices.Equal(got, want) {
		t.Errorf("HostPrefixes = %q, want %q", got, want)
	}
	u := Union([]v1alpha1.ContainerEntry{
		{Prefixes: []v1alpha1.Prefix{"fd20::05/128", "10.20.0.9/32"}},
		{Prefixes: []v1alpha1.Prefix{"fd20::5/128", "10.20.0.1/32"}},
	})
	if want := []v1alpha1.Prefix{"10.20.0.1/32", "10.20.0.9/32", "fd20::5/128"}; !slices.Equal(u, want) {
		t.Errorf("Union = %q, want %q", u, want)
	}
	if Union(nil) != nil {
		t.Error("an empty union is nil, so spec.prefixes is omitted")
	}
}

func TestInvalidKeysAreRejectedBeforeAnyCall(t *testing.T) {
	f := adverttest.New(t)
	a := testAdvertiser(f, liveSet{})
	if _, err := a.Publish(context.Background(), Key{VPC: "blue", Attachment: "a"}, entry("c1", "/x"), Routing{}); err == nil {
		t.Error("a key without a node must be rejected")
	}
	if _, err := a.Publish(context.Background(), keyA, v1alpha1.ContainerEntry{ContainerID: "c1"}, Routing{}); err == nil {
		t.Error("an entry without ifName must be rejected")
	}
	wantCalls(t, f)
}

var objKey = Key{VPC: "blue-1a2b3c4d", Attachment: "web-0-5e6f7a8b", Node: "node-a", Namespace: "tenant-a", UID: "uid-2"}

func TestAnObjectBackedAdvertisementCarriesItsIdentityAndKeepsOnlyItsOwnUIDsEntries(t *testing.T) {
	f := adverttest.New(t, "get", "create", "update")
	a := testAdvertiser(f, liveSet{"/run/netns/c1": true, "/run/netns/c0": true, "/run/netns/c9": true})
	e := entry("c1", "/run/netns/c1", "10.20.0.5/32")
	e.AttachmentUID = "uid-2"
	if _, err := a.Publish(context.Background(), objKey, e, Routing{VNI: 100}); err != nil {
		t.Fatal(err)
	}
	got := f.Object(objKey.Name())
	if got.Labels["network.galactic.dev/attachment-uid"] != "uid-2" || got.Labels["network.galactic.dev/namespace"] != "tenant-a" || got.Name != "blue-1a2b3c4d.web-0-5e6f7a8b.node-a" {
		t.Fatalf("advertisement %s labels %v", got.Name, got.Labels)
	}
	// Entries of another UID in it are not this attachment's; an inline
	// one (written before the attachment was adopted) is.
	stray := entry("c9", "/run/netns/c9", "10.20.0.9/32")
	stray.AttachmentUID = "uid-1"
	inline := entry("c0", "/run/netns/c0", "10.20.0.5/32")
	next := got.DeepCopy()
	next.Spec.Containers = append(next.Spec.Containers, stray, inline)
	f.Store(next)
	e.ContainerID = "c1"
	res, err := a.Publish(context.Background(), objKey, e, Routing{VNI: 100})
	if err != nil {
		t.Fatal(err)
	}
	got = f.Object(objKey.Name())
	if ids := entryIDs(got); !slices.Equal(ids, []string{"c0", "c1"}) || len(res.Removed) != 1 || res.Removed[0].ContainerID != "c9" {
		t.Fatalf("entries %v, removed %+v", ids, res.Removed)
	}
	if !slices.Equal(got.Spec.Prefixes, []v1alpha1.Prefix{"10.20.0.5/32"}) {
		t.Fatalf("spec.prefixes %q", got.Spec.Prefixes)
	}
}

func TestAPredecessorsAdvertisementOfAnotherUIDIsNeitherChangedNorDeleted(t *testing.T) {
	pred := objKey
	pred.UID = "uid-1"
	f := adverttest.New(t, "get", "list")
	old := f.Seed(existing(pred, entry("c9", "/run/netns/c9", "10.20.0.5/32")))
	onB := pred
	onB.Node = "node-b"
	oldB := f.Seed(existing(onB, entry("c8", "/y", "10.20.0.5/32")))
	a := testAdvertiser(f, liveSet{"/run/netns/c9": true})
	e := entry("c1", "/run/netns/c1", "10.20.0.5/32")
	e.AttachmentUID = "uid-2"
	if _, err := a.Publish(context.Background(), objKey, e, Routing{}); err == nil || !strings.Contains(err.Error(), `UID "uid-1"`) {
		t.Fatalf("publishing into a predecessor's advertisement: want an error naming uid-1, got %v", err)
	}
	if _, err := a.Release(context.Background(), objKey, "c9", "net0"); err == nil {
		t.Fatal("releasing from a predecessor's advertisement succeeded")
	}
	if deleted, err := a.DeleteOthers(context.Background(), objKey); err != nil || len(deleted) != 0 {
		t.Fatalf("DeleteOthers deleted %v (%v): a predecessor's is not ours", deleted, err)
	}
	// An inline key never touches an object's advertisement either.
	inline := Key{VPC: objKey.VPC, Attachment: objKey.Attachment, Node: "node-a"}
	if _, err := a.Publish(context.Background(), inline, entry("c1", "/run/netns/c1"), Routing{}); err == nil {
		t.Fatal("an inline key published into an object's advertisement")
	}
	for _, o := range []*v1alpha1.BGPAdvertisement{old, oldB} {
		if got := f.Object(o.Name); got == nil || got.ResourceVersion != o.ResourceVersion {
			t.Fatalf("%s changed: %+v", o.Name, got)
		}
	}
}
