package state

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestHintsRoundTripAndPruneOnlyTheOldOnesNotInUse(t *testing.T) {
	h := NewHints(t.TempDir())
	if _, ok := h.Get("tenant-a", "web"); ok {
		t.Fatal("a hint before any was put")
	}
	for _, c := range []struct{ ns, name, uid string }{{"tenant-a", "web", "u1"}, {"tenant-a", "db", "u2"}, {"tenant-b", "web", "u3"}} {
		if err := h.Put(c.ns, c.name, AttachmentHint{UID: c.uid, VPC: "v-" + c.uid, Attachment: "a-" + c.uid}); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := h.Get("tenant-b", "web"); !ok || got != (AttachmentHint{UID: "u3", VPC: "v-u3", Attachment: "a-u3"}) {
		t.Fatalf("tenant-b/web = %+v %v", got, ok)
	}
	if err := h.Put("bad_ns", "web", AttachmentHint{UID: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Get("bad_ns", "web"); ok {
		t.Fatal("a name that cannot be a Kubernetes name was kept")
	}

	old := time.Now().Add(-2 * time.Hour)
	for _, f := range []string{"tenant-a_web.json", "tenant-a_db.json"} {
		if err := os.Chtimes(filepath.Join(h.Dir, f), old, old); err != nil {
			t.Fatal(err)
		}
	}
	n, err := h.Prune(time.Now().Add(-time.Hour), func(uid string) bool { return uid == "u2" })
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
	for name, want := range map[string]bool{"web": false, "db": true} {
		if _, ok := h.Get("tenant-a", name); ok != want {
			t.Errorf("tenant-a/%s kept = %v, want %v", name, ok, want)
		}
	}
	if _, ok := h.Get("tenant-b", "web"); !ok {
		t.Error("a recent hint was pruned")
	}

	// An old hint marked as used is recent again.
	if err := os.Chtimes(filepath.Join(h.Dir, "tenant-b_web.json"), old, old); err != nil {
		t.Fatal(err)
	}
	if err := h.Touch("tenant-b", "web"); err != nil {
		t.Fatal(err)
	}
	if n, err := h.Prune(time.Now().Add(-time.Hour), func(uid string) bool { return uid == "u2" }); err != nil || n != 0 {
		t.Fatalf("pruned %d, %v after a touch; want 0", n, err)
	}
}
