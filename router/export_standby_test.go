package router

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
)

func TestAStandbyEntryIsNotAnnouncedAndItsPromotionAnnouncesTheNewGeneration(t *testing.T) {
	target := entry("c2", "/live/c2", 0)
	target.Standby = true
	a := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, target)
	routes, verdicts := Desired(exportInput(a))
	if len(routes) != 0 {
		t.Fatalf("a standby entry was announced: %v", routes)
	}
	if v := verdicts["web-0"]; v.Announced || v.Reason != v1alpha1.ReasonNoLiveEntry {
		t.Fatalf("verdict %+v, want not announced for want of a live entry", v)
	}

	target.Standby, target.HolderGeneration = false, 5
	a = advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, []string{"10.20.0.5/32"}, target)
	routes, _ = Desired(exportInput(a))
	if len(routes) != 1 {
		t.Fatalf("the promoted entry: routes %v", routes)
	}
	for _, r := range routes {
		if r.Generation != 5 || r.Drained {
			t.Fatalf("the promoted entry announced %+v, want generation 5 undrained", r)
		}
	}
}

func TestAWhenAvailableRouteWhoseLeaseLeftThisNodeKeepsItsLastAnswer(t *testing.T) {
	in := exportInput(advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceWhenAvailable, web, entry("c", "/live/c", 3)))
	// Released for a live migration (or taken by another node): the lease
	// is no longer in this node's watch.
	in.Available = judge(metav1.ConditionUnknown, handoff.ReasonNoLease)
	in.Announced = routeSet(want("blue", "10.20.0.5/32", 10100, 3, false))
	got, verdicts := Desired(in)
	// Only what peers have stays, undrained: no new route is announced.
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 3, false)))
	if v := verdicts["web-0"]; !v.Announced {
		t.Errorf("verdict %+v, want still announced", v)
	}

	// A drained route stays drained, and one never announced stays away.
	in.Announced = routeSet(want("blue", "10.20.0.5/32", 10100, 3, true))
	got, _ = Desired(in)
	sameRoutes(t, got, routeSet(want("blue", "10.20.0.5/32", 10100, 3, true)))
	in.Announced = routeSet()
	got, _ = Desired(in)
	sameRoutes(t, got, routeSet())
}
