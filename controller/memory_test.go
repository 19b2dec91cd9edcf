package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

func withRV(rv string) *v1alpha1.VPCAttachment {
	return &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: "web", ResourceVersion: rv}}
}

func TestOverlayAnswersForTheVersionsItsWritesReplaced(t *testing.T) {
	o := newOverlay[*v1alpha1.VPCAttachment]()
	// finalizer: 1 -> 2, status: 2 -> 3
	o.wrote("k", "1", withRV("2"))
	o.wrote("k", "2", withRV("3"))
	for _, stale := range []string{"1", "2"} {
		if got := o.resolve("k", withRV(stale)); got.ResourceVersion != "3" {
			t.Errorf("cache at %s: got %s, want our write 3", stale, got.ResourceVersion)
		}
	}
	if got := o.resolve("k", withRV("5")); got.ResourceVersion != "5" {
		t.Errorf("a newer version in the cache must win, got %s", got.ResourceVersion)
	}
	// Once the cache moved on, the entry is gone.
	if got := o.resolve("k", withRV("1")); got.ResourceVersion != "1" {
		t.Errorf("the entry should be forgotten, got %s", got.ResourceVersion)
	}
}

func TestClaimsTrackOwnCreatesUntilTheCacheShowsThem(t *testing.T) {
	now := t0
	c := newClaims[v1alpha1.VPCAddress](func() time.Time { return now })
	if !c.reserve("ns/blue.10.0.0.2", "att-1") || c.reserve("ns/blue.10.0.0.2", "att-2") {
		t.Fatal("a value is reserved once")
	}
	c.created("ns/blue.10.0.0.2", "att-1", &v1alpha1.VPCAddress{ObjectMeta: metav1.ObjectMeta{Name: "blue.10.0.0.2"}})
	c.taken("ns/blue.10.0.0.3")
	if got := c.owned("att-1"); len(got) != 1 || got[0].Name != "blue.10.0.0.2" {
		t.Fatalf("owned = %v", got)
	}
	if !c.has("ns/blue.10.0.0.3") {
		t.Error("a value the API server said is taken is remembered")
	}
	c.drop("ns/blue.10.0.0.2")
	if len(c.owned("att-1")) != 0 || c.has("ns/blue.10.0.0.2") {
		t.Error("a dropped claim is forgotten")
	}
	now = now.Add(claimTTL + time.Second)
	if c.has("ns/blue.10.0.0.3") {
		t.Error("a claim the cache never showed expires")
	}
}
