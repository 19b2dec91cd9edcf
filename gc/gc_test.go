package gc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/state"
)

type fakeKernel struct {
	taps  map[string]Tap
	links map[string]bool
	// uids are galactic host interfaces (not taps) by name, with the UID
	// their ifalias carries.
	uids     map[string]string
	released []string
	removed  []string
}

func (k *fakeKernel) Taps() ([]Tap, error) {
	var out []Tap
	for _, t := range k.taps {
		out = append(out, t)
	}
	return out, nil
}

func (k *fakeKernel) Tap(name string) (Tap, bool, error) {
	t, ok := k.taps[name]
	return t, ok, nil
}

func (k *fakeKernel) Link(name string) (Link, error) {
	if t, tap := k.taps[name]; tap {
		return Link{Found: true, Galactic: true, UID: t.UID}, nil
	}
	if uid, ok := k.uids[name]; ok {
		return Link{Found: true, Galactic: true, UID: uid}, nil
	}
	return Link{Found: k.links[name]}, nil
}

func (k *fakeKernel) Release(rec state.Record) error {
	k.released = append(k.released, rec.ContainerID)
	// As hostif's Teardown: another identity's interface of the name stays.
	if t, ok := k.taps[rec.HostInterface]; ok && t.UID == rec.AttachmentUID {
		delete(k.taps, rec.HostInterface)
	}
	return nil
}

func (k *fakeKernel) RemoveTap(t Tap) error {
	k.removed = append(k.removed, t.Name)
	delete(k.taps, t.Name)
	return nil
}

type fakeAdverts struct {
	items   []v1alpha1.BGPAdvertisement
	listErr error
	pruned  []string
}

func (a *fakeAdverts) List(context.Context) ([]v1alpha1.BGPAdvertisement, error) {
	return a.items, a.listErr
}

func (a *fakeAdverts) Prune(_ context.Context, adv *v1alpha1.BGPAdvertisement) (PruneResult, error) {
	a.pruned = append(a.pruned, adv.Name)
	return PruneResult{}, nil
}

func (a *fakeAdverts) Get(_ context.Context, vpc, att string) (*v1alpha1.BGPAdvertisement, error) {
	if a.listErr != nil {
		return nil, a.listErr
	}
	for i := range a.items {
		if a.items[i].Spec.VPC == vpc && a.items[i].Spec.Attachment == att {
			return &a.items[i], nil
		}
	}
	return nil, nil
}

type world struct {
	c      *Collector
	kernel *fakeKernel
	advs   *fakeAdverts
	live   map[string]bool
	store  state.Store
}

func newWorld(t *testing.T) *world {
	dir := t.TempDir()
	w := &world{
		kernel: &fakeKernel{taps: map[string]Tap{}, links: map[string]bool{}},
		advs:   &fakeAdverts{},
		live:   map[string]bool{},
		store:  state.NewStore(dir),
	}
	w.c = &Collector{
		StateDir: dir,
		Kernel:   w.kernel,
		Adverts:  w.advs,
		Live:     func(p string) bool { return w.live[p] },
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	return w
}

func (w *world) pass(t *testing.T) Report {
	t.Helper()
	r, _ := w.c.Pass(context.Background())
	return r
}

func detachedTap(name string, index int) Tap {
	return Tap{Name: name, Index: index, VPC: "blue", Attachment: "web-0"}
}

func TestADetachedTapIsReclaimedOnlyOnTheSecondConsecutivePass(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	if r := w.pass(t); r.TapsReclaimed != 0 || r.TapsKept[KeptFirstSighting] != 1 {
		t.Fatalf("first pass: %+v", r)
	}
	if r := w.pass(t); r.TapsReclaimed != 1 {
		t.Fatalf("second pass: %+v", r)
	}
	if _, ok := w.kernel.taps["gt1"]; ok {
		t.Fatal("tap still there")
	}
}

func TestARecreatedTapStartsItsSightingsAgain(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	w.pass(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 8)
	if r := w.pass(t); r.TapsReclaimed != 0 || r.TapsKept[KeptFirstSighting] != 1 {
		t.Fatalf("a new ifindex must count as a first sighting: %+v", r)
	}
	if r := w.pass(t); r.TapsReclaimed != 1 {
		t.Fatalf("third pass: %+v", r)
	}
}

func TestAHeldOrCarrierTapIsNeverReclaimedAndBreaksTheSightingChain(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	w.pass(t)
	held := detachedTap("gt1", 7)
	held.Holders = []int{42}
	w.kernel.taps["gt1"] = held
	for range 3 {
		if r := w.pass(t); r.TapsReclaimed != 0 || r.TapsDetached != 0 {
			t.Fatalf("held tap: %+v", r)
		}
	}
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	if r := w.pass(t); r.TapsReclaimed != 0 {
		t.Fatalf("after the holder left, the next pass is a first sighting again: %+v", r)
	}
}

func TestATapAdvertisedHereByALiveEntryIsKept(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	w.live["/var/run/netns/c1"] = true
	w.advs.items = []v1alpha1.BGPAdvertisement{{Spec: v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "web-0", Node: "a",
		Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "net0", Netns: "/var/run/netns/c1"}}}}}
	for range 3 {
		if r := w.pass(t); r.TapsReclaimed != 0 {
			t.Fatalf("%+v", r)
		}
	}
	if r := w.pass(t); r.TapsKept[KeptAdvertisedHere] != 1 {
		t.Fatalf("want kept as advertised here: %+v", r)
	}
}

func TestATapWithALiveLocalRecordIsKept(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	w.live["/var/run/netns/c2"] = true
	if err := w.store.Put(state.Record{ContainerID: "c2", IfName: "net0", Netns: "/var/run/netns/c2", VPC: "blue", Attachment: "web-0", HostInterface: "gt1"}); err != nil {
		t.Fatal(err)
	}
	w.pass(t)
	if r := w.pass(t); r.TapsReclaimed != 0 || r.TapsKept[KeptLiveRecord] != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestNothingThatDependsOnAdvertisementsIsReclaimedWhileTheAPIIsUnreachable(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	w.advs.listErr = errors.New("connection refused")
	for range 3 {
		r, err := w.c.Pass(context.Background())
		if err == nil || r.TapsReclaimed != 0 || r.Errors["list-advertisements"] != 1 {
			t.Fatalf("%+v %v", r, err)
		}
	}
	w.advs.listErr = nil
	if r, err := w.c.Pass(context.Background()); err != nil || r.TapsReclaimed != 1 {
		t.Fatalf("after recovery: %+v %v", r, err)
	}
}

func TestTheFirstSightingSurvivesARestart(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	w.pass(t)
	restarted := *w.c
	w.c = &restarted
	if r := w.pass(t); r.TapsReclaimed != 1 {
		t.Fatalf("a restarted collector must remember the first sighting: %+v", r)
	}
}

func TestReclaimReleasesTheDeadRecordsOfTheAttachment(t *testing.T) {
	w := newWorld(t)
	w.kernel.taps["gt1"] = detachedTap("gt1", 7)
	rec := state.Record{ContainerID: "old", IfName: "net0", Netns: "/var/run/netns/gone", VPC: "blue", Attachment: "web-0", HostInterface: "gt1"}
	if err := w.store.Put(rec); err != nil {
		t.Fatal(err)
	}
	w.pass(t)
	if r := w.pass(t); r.TapsReclaimed != 1 {
		t.Fatalf("%+v", r)
	}
	if len(w.kernel.released) != 1 || w.kernel.released[0] != "old" {
		t.Fatalf("released %v", w.kernel.released)
	}
	if _, ok, _ := w.store.Get("old", "net0"); ok {
		t.Fatal("record left behind")
	}
}

func TestRecordsWhoseContainerAndInterfaceAreGoneAreRemoved(t *testing.T) {
	w := newWorld(t)
	_ = w.store.Put(state.Record{ContainerID: "gone", IfName: "eth0", Netns: "/x", Mode: "veth", HostInterface: "gvdead"})
	_ = w.store.Put(state.Record{ContainerID: "alive", IfName: "eth0", Netns: "/y", Mode: "veth", HostInterface: "gvlive"})
	w.live["/y"] = true
	w.kernel.links["gvlive"] = true
	if r := w.pass(t); r.RecordsRemoved != 1 {
		t.Fatalf("%+v", r)
	}
	if _, ok, _ := w.store.Get("alive", "eth0"); !ok {
		t.Fatal("live record removed")
	}
}

// fakeLeases holds one lease per holder; Release frees it once.
type fakeLeases struct {
	held     map[string]bool
	renewed  []string
	released []string
}

func (l *fakeLeases) Renew(_ context.Context, rec state.Record) error {
	if !l.held[rec.Holder] {
		return fmt.Errorf("renewing: %w", handoff.ErrLost)
	}
	l.renewed = append(l.renewed, rec.Holder)
	return nil
}

func (l *fakeLeases) Release(_ context.Context, rec state.Record) error {
	if !l.held[rec.Holder] {
		return fmt.Errorf("releasing: %w", handoff.ErrLost)
	}
	delete(l.held, rec.Holder)
	l.released = append(l.released, rec.Holder)
	return nil
}

func TestADeadHoldersLeaseIsReleasedOnceAndCountedOnce(t *testing.T) {
	w := newWorld(t)
	leases := &fakeLeases{held: map[string]bool{"node-a/live": true, "node-a/dead": true}}
	w.c.Leases = leases
	// The dead holder's tap is still there, so its record outlives the pass.
	w.kernel.taps["gt1"] = Tap{Name: "gt1", Index: 7, VPC: "blue", Attachment: "web-0", Carrier: true}
	_ = w.store.Put(state.Record{ContainerID: "dead", IfName: "net0", Netns: "/gone", VPC: "blue", Attachment: "web-0", HostInterface: "gt1", Holder: "node-a/dead", HolderGeneration: 3})
	_ = w.store.Put(state.Record{ContainerID: "live", IfName: "net0", Netns: "/y", VPC: "blue", Attachment: "db-0", HostInterface: "gt2", Holder: "node-a/live", HolderGeneration: 1})
	w.live["/y"] = true
	w.kernel.links["gt2"] = true

	r, err := w.c.Pass(context.Background())
	if err != nil || r.LeasesReleased != 1 || r.LeasesRenewed != 1 {
		t.Fatalf("first pass: %+v %v", r, err)
	}
	r, err = w.c.Pass(context.Background())
	if err != nil || r.LeasesReleased != 0 || r.LeasesRenewed != 1 || r.Errors["lease-release"] != 0 {
		t.Fatalf("a lease released before is neither released again nor an error: %+v %v", r, err)
	}
	if len(leases.released) != 1 {
		t.Fatalf("released %v", leases.released)
	}
}

// A predecessor's leftovers (UID "old") and a successor's (UID "new") of
// the same names are judged each by its own identity.

func TestALiveRecordOrEntryOfAnotherUIDDoesNotKeepAPredecessorsTap(t *testing.T) {
	w := newWorld(t)
	old := detachedTap("gt1", 7)
	old.UID = "old"
	w.kernel.taps["gt1"] = old
	w.live["/var/run/netns/c2"] = true
	if err := w.store.Put(state.Record{ContainerID: "c2", IfName: "net0", Netns: "/var/run/netns/c2", VPC: "blue", Attachment: "web-0",
		AttachmentUID: "new", HostInterface: "gv2"}); err != nil {
		t.Fatal(err)
	}
	w.kernel.uids = map[string]string{"gv2": "new"}
	w.advs.items = []v1alpha1.BGPAdvertisement{{Spec: v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "web-0", Node: "a",
		Containers: []v1alpha1.ContainerEntry{{ContainerID: "c2", IfName: "net0", Netns: "/var/run/netns/c2", AttachmentUID: "new"}}}}}
	w.pass(t)
	if r := w.pass(t); r.TapsReclaimed != 1 {
		t.Fatalf("the predecessor's tap should be reclaimed on its own rules: %+v", r)
	}
	if len(w.kernel.released) != 0 {
		t.Fatalf("the successor's live record was released with the predecessor's tap: %v", w.kernel.released)
	}
	if _, ok, _ := w.store.Get("c2", "net0"); !ok {
		t.Fatal("the successor's record is gone")
	}
}

func TestATapIsKeptByALiveRecordOrEntryOfItsOwnUID(t *testing.T) {
	for _, by := range []string{"record", "entry"} {
		t.Run(by, func(t *testing.T) {
			w := newWorld(t)
			tp := detachedTap("gt1", 7)
			tp.UID = "new"
			w.kernel.taps["gt1"] = tp
			w.live["/var/run/netns/c2"] = true
			if by == "record" {
				_ = w.store.Put(state.Record{ContainerID: "c2", IfName: "net0", Netns: "/var/run/netns/c2", VPC: "blue", Attachment: "web-0", AttachmentUID: "new", HostInterface: "gt1"})
			} else {
				w.advs.items = []v1alpha1.BGPAdvertisement{{Spec: v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "web-0", Node: "a",
					Containers: []v1alpha1.ContainerEntry{{ContainerID: "c2", IfName: "net0", Netns: "/var/run/netns/c2", AttachmentUID: "new"}}}}}
			}
			w.pass(t)
			if r := w.pass(t); r.TapsReclaimed != 0 {
				t.Fatalf("%+v", r)
			}
		})
	}
}

func TestAPredecessorsTapIsReclaimedWithItsOwnDeadRecordsOnly(t *testing.T) {
	w := newWorld(t)
	old := detachedTap("gt1", 7)
	old.UID = "old"
	w.kernel.taps["gt1"] = old
	_ = w.store.Put(state.Record{ContainerID: "a", IfName: "net0", Netns: "/gone-a", VPC: "blue", Attachment: "web-0", AttachmentUID: "old", HostInterface: "gt1"})
	// A dead record of the successor whose own interface is gone: the
	// records pass removes it, the tap's reclaim does not count it.
	_ = w.store.Put(state.Record{ContainerID: "b", IfName: "net0", Netns: "/gone-b", VPC: "blue", Attachment: "web-0", AttachmentUID: "new", HostInterface: "gt1"})
	w.pass(t)
	r := w.pass(t)
	if r.TapsReclaimed != 1 || !slices.Contains(w.kernel.released, "a") {
		t.Fatalf("the predecessor's tap and record: %+v, released %v", r, w.kernel.released)
	}
	for _, id := range []string{"a", "b"} {
		if _, ok, _ := w.store.Get(id, "net0"); ok {
			t.Errorf("record %s left", id)
		}
	}
}

func TestADeadRecordWhoseInterfaceNowCarriesAnotherUIDIsReleased(t *testing.T) {
	w := newWorld(t)
	// The predecessor's dead record; its host interface's name now
	// carries the successor's UID (an adopted inline attachment's
	// interface, say): the record's own interface is gone.
	_ = w.store.Put(state.Record{ContainerID: "old", IfName: "eth0", Netns: "/gone", Mode: "veth", VPC: "blue", Attachment: "web-0", HostInterface: "gv1"})
	w.kernel.uids = map[string]string{"gv1": "new"}
	if r := w.pass(t); r.RecordsRemoved != 1 || len(w.kernel.released) != 1 {
		t.Fatalf("%+v, released %v", r, w.kernel.released)
	}
	// Its own identity's interface keeps a dead record (a tap outlives its
	// container; the tap reclaim decides).
	w = newWorld(t)
	_ = w.store.Put(state.Record{ContainerID: "c", IfName: "net0", Netns: "/gone", Mode: "tap", VPC: "blue", Attachment: "web-0", AttachmentUID: "new", HostInterface: "gv1"})
	w.kernel.uids = map[string]string{"gv1": "new"}
	if r := w.pass(t); r.RecordsRemoved != 0 || len(w.kernel.released) != 0 {
		t.Fatalf("%+v, released %v", r, w.kernel.released)
	}
}

// galactic-cni's hints of attachments no record uses go after hintTTL;
// one a record uses stays however old.
func TestAPassPrunesTheHintsOfAttachmentsNoRecordHasUsedForAnHour(t *testing.T) {
	w := newWorld(t)
	now := time.Now()
	w.c.Clock = clocktesting.NewFakeClock(now)
	hints := state.NewHints(w.c.StateDir)
	for _, h := range []struct{ name, uid string }{{"old", "u-old"}, {"recent", "u-recent"}, {"used", "u-used"}} {
		if err := hints.Put("tenant-a", h.name, state.AttachmentHint{UID: h.uid, VPC: "blue", Attachment: h.name}); err != nil {
			t.Fatal(err)
		}
	}
	twoHours := now.Add(-2 * time.Hour)
	for _, name := range []string{"old", "used"} {
		if err := os.Chtimes(filepath.Join(hints.Dir, "tenant-a_"+name+".json"), twoHours, twoHours); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.store.Put(state.Record{ContainerID: "c1", IfName: "eth0", Netns: "/y", Mode: "veth", HostInterface: "gvused", AttachmentUID: "u-used"})
	w.live["/y"] = true
	w.kernel.links["gvused"] = true
	w.pass(t)
	for name, want := range map[string]bool{"old": false, "recent": true, "used": true} {
		if _, ok := hints.Get("tenant-a", name); ok != want {
			t.Errorf("hint %s kept = %v, want %v", name, ok, want)
		}
	}
}
