package advert

import (
	"context"
	"testing"

	"github.com/galactic-cni/galactic/pkg/advert/adverttest"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

func standbyEntry(cid, netns string) func() v1alpha1.ContainerEntry {
	return func() (e v1alpha1.ContainerEntry) {
		e = entry(cid, netns, "10.20.0.5/32")
		e.Standby = true
		return e
	}
}

func TestPromoteClearsStandbyAndSetsTheNewGenerationOfOnlyThatEntry(t *testing.T) {
	f := adverttest.New(t, "get", "update")
	other := entry("c1", "/run/netns/c1", "10.20.0.5/32")
	other.HolderGeneration = 3
	f.Seed(existing(keyA, other, standbyEntry("c2", "/run/netns/c2")()))
	a := testAdvertiser(f, liveSet{})
	res, err := a.Promote(context.Background(), keyA, "c2", "net0", 4)
	if err != nil || res.Outcome != Updated {
		t.Fatalf("res %+v err %v", res, err)
	}
	got := f.Object(keyA.Name()).Spec.Containers
	if len(got) != 2 || got[0].HolderGeneration != 3 || got[0].Standby || got[1].HolderGeneration != 4 || got[1].Standby {
		t.Fatalf("entries %+v", got)
	}

	// Promoting again writes nothing.
	f2 := adverttest.New(t, "get")
	f2.Seed(f.Object(keyA.Name()))
	if res, err := testAdvertiser(f2, liveSet{}).Promote(context.Background(), keyA, "c2", "net0", 4); err != nil || res.Outcome != Unchanged {
		t.Fatalf("again: res %+v err %v", res, err)
	}
}

func TestPromoteWithoutAdvertisementOrEntryWritesNothing(t *testing.T) {
	f := adverttest.New(t, "get")
	a := testAdvertiser(f, liveSet{})
	if res, err := a.Promote(context.Background(), keyA, "c2", "net0", 4); err != nil || res.Outcome != Absent {
		t.Fatalf("no advertisement: res %+v err %v", res, err)
	}
	f = adverttest.New(t, "get")
	f.Seed(existing(keyA, entry("c1", "/run/netns/c1", "10.20.0.5/32")))
	if res, err := testAdvertiser(f, liveSet{}).Promote(context.Background(), keyA, "c2", "net0", 4); err != nil || res.Outcome != Absent {
		t.Fatalf("no entry: res %+v err %v", res, err)
	}
	if _, err := a.Promote(context.Background(), keyA, "c2", "net0", 0); err == nil {
		t.Fatal("token 0 was accepted")
	}
}
