package router

import (
	"testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
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
