package router

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

func TestProgrammedIsTrueOnlyWhenAnnouncedWithAnEstablishedPeer(t *testing.T) {
	conflict := Verdict{Reason: v1alpha1.ReasonVNIConflict, Message: "spec.vni 10200 differs"}
	cases := []struct {
		name        string
		v           Verdict
		established bool
		status      metav1.ConditionStatus
		reason      string
	}{
		{"announced with an established peer", Verdict{Announced: true}, true, metav1.ConditionTrue, v1alpha1.ReasonAnnounced},
		{"announced without an established peer", Verdict{Announced: true}, false, metav1.ConditionFalse, v1alpha1.ReasonNoEstablishedPeer},
		{"not announced with an established peer", conflict, true, metav1.ConditionFalse, v1alpha1.ReasonVNIConflict},
		{"not announced without an established peer", conflict, false, metav1.ConditionFalse, v1alpha1.ReasonVNIConflict},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := Conditions(tc.v, tc.established)
			if len(cs) != 1 {
				t.Fatalf("conditions %v, want Programmed only", cs)
			}
			c := cs[0]
			if c.Type != v1alpha1.ConditionProgrammed || c.Status != tc.status || c.Reason != tc.reason || c.Message == "" {
				t.Errorf("got %+v, want Programmed %s %s with a message", c, tc.status, tc.reason)
			}
		})
	}
	if c := Conditions(conflict, true)[0]; c.Message != conflict.Message {
		t.Errorf("message %q, want the verdict's", c.Message)
	}
}

func TestTheHolderConditionIsGivenWhereAHolderWasJudged(t *testing.T) {
	holder := metav1.Condition{Type: v1alpha1.ConditionHolderAvailable, Status: metav1.ConditionFalse, Reason: "SuccessorNotReady"}
	cs := Conditions(Verdict{Reason: v1alpha1.ReasonHolderUnavailable, Holder: holder}, true)
	if len(cs) != 2 || cs[1] != holder {
		t.Fatalf("conditions %+v, want Programmed and the holder's", cs)
	}
}

var (
	then = metav1.NewTime(epoch)
	now  = metav1.NewTime(epoch.Add(time.Hour))
)

// withStatus is an advertisement of generation 3 whose status holds cs as
// written at then.
func withStatus(cs ...metav1.Condition) *v1alpha1.BGPAdvertisement {
	a := advert("web-0", "blue", 10100, 0, v1alpha1.AnnounceAlways, nil)
	a.Generation, a.ResourceVersion = 3, "42"
	for _, c := range cs {
		c.ObservedGeneration, c.LastTransitionTime = 3, then
		a.Status.Conditions = append(a.Status.Conditions, c)
	}
	return a
}

func programmed(status metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: status, Reason: reason, Message: "m"}
}

func TestConditionsChangeOnlyWhenTheyDiffer(t *testing.T) {
	cases := []struct {
		name    string
		adv     *v1alpha1.BGPAdvertisement
		want    metav1.Condition
		changed bool
		// moved is whether the transition time is now rather than then.
		moved bool
	}{
		{"identical conditions are no change", withStatus(programmed(metav1.ConditionTrue, "Announced")),
			programmed(metav1.ConditionTrue, "Announced"), false, false},
		{"a new reason keeps the transition time", withStatus(programmed(metav1.ConditionFalse, "NoVNI")),
			programmed(metav1.ConditionFalse, "VNIConflict"), true, false},
		{"a new status moves the transition time", withStatus(programmed(metav1.ConditionFalse, "NoEstablishedPeer")),
			programmed(metav1.ConditionTrue, "Announced"), true, true},
		{"a first condition is written now", withStatus(),
			programmed(metav1.ConditionTrue, "Announced"), true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.adv.DeepCopy()
			next, changed := withConditions(tc.adv, []metav1.Condition{tc.want}, now)
			if changed != tc.changed {
				t.Fatalf("changed = %v, want %v", changed, tc.changed)
			}
			c := meta.FindStatusCondition(next.Status.Conditions, v1alpha1.ConditionProgrammed)
			if c == nil || c.Status != tc.want.Status || c.Reason != tc.want.Reason || c.ObservedGeneration != 3 {
				t.Fatalf("condition %+v, want %+v at generation 3", c, tc.want)
			}
			if wantTime := map[bool]metav1.Time{false: then, true: now}[tc.moved]; !c.LastTransitionTime.Equal(&wantTime) {
				t.Errorf("transition time %v, want %v", c.LastTransitionTime, wantTime)
			}
			if len(next.Status.Conditions) != 1 {
				t.Errorf("conditions %+v, want one", next.Status.Conditions)
			}
			// The cached object is shared with the informer: never edited.
			if !reflect.DeepEqual(before, tc.adv) {
				t.Error("the cached advertisement was modified")
			}
		})
	}
}

func TestANewGenerationIsAChangeThatKeepsTheTransitionTime(t *testing.T) {
	adv := withStatus(programmed(metav1.ConditionTrue, "Announced"))
	adv.Generation = 4
	next, changed := withConditions(adv, []metav1.Condition{programmed(metav1.ConditionTrue, "Announced")}, now)
	c := next.Status.Conditions[0]
	if !changed || c.ObservedGeneration != 4 || !c.LastTransitionTime.Equal(&then) {
		t.Fatalf("changed %v, condition %+v", changed, c)
	}
}

func TestASteadyStateWritesNothing(t *testing.T) {
	v := Verdict{Announced: true, Holder: metav1.Condition{Type: v1alpha1.ConditionHolderAvailable, Status: metav1.ConditionTrue, Reason: "Serving"}}
	adv := withStatus()
	next, changed := withConditions(adv, Conditions(v, true), now)
	if !changed || len(next.Status.Conditions) != 2 {
		t.Fatalf("first pass: changed %v, %+v", changed, next.Status.Conditions)
	}
	later := metav1.NewTime(now.Add(time.Minute))
	if _, changed := withConditions(next, Conditions(v, true), later); changed {
		t.Fatal("the second pass of the same verdict changed the status")
	}
}

// fakeWriter records UpdateStatus calls; err fails them.
type fakeWriter struct {
	calls []*v1alpha1.BGPAdvertisement
	err   error
}

func (f *fakeWriter) UpdateStatus(_ context.Context, obj *v1alpha1.BGPAdvertisement, _ metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error) {
	f.calls = append(f.calls, obj.DeepCopy())
	return obj, f.err
}

func TestWriteStatusCallsTheAPIOnlyOnChangeWithTheCachedResourceVersion(t *testing.T) {
	ctx := context.Background()
	adv := withStatus(programmed(metav1.ConditionTrue, "Announced"))
	w := &fakeWriter{}
	wrote, err := WriteStatus(ctx, w, adv, []metav1.Condition{programmed(metav1.ConditionTrue, "Announced")}, now)
	if wrote || err != nil || len(w.calls) != 0 {
		t.Fatalf("unchanged: wrote %v, err %v, %d calls", wrote, err, len(w.calls))
	}
	wrote, err = WriteStatus(ctx, w, adv, []metav1.Condition{programmed(metav1.ConditionFalse, "NoEstablishedPeer")}, now)
	if !wrote || err != nil || len(w.calls) != 1 {
		t.Fatalf("changed: wrote %v, err %v, %d calls", wrote, err, len(w.calls))
	}
	got := w.calls[0]
	if got.ResourceVersion != "42" || got.Name != "web-0" {
		t.Errorf("wrote %s at resourceVersion %q, want web-0 at the cached 42", got.Name, got.ResourceVersion)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgrammed); c == nil || c.Reason != "NoEstablishedPeer" {
		t.Errorf("written conditions %+v", got.Status.Conditions)
	}
}

func TestAFailedStatusWriteIsReportedAsNotWritten(t *testing.T) {
	conflict := errors.New("the object has been modified")
	w := &fakeWriter{err: conflict}
	wrote, err := WriteStatus(context.Background(), w, withStatus(), []metav1.Condition{programmed(metav1.ConditionTrue, "Announced")}, now)
	if wrote || !errors.Is(err, conflict) || len(w.calls) != 1 {
		t.Fatalf("wrote %v, err %v, %d calls", wrote, err, len(w.calls))
	}
}

func TestAHolderConditionNoLongerJudgedIsRemoved(t *testing.T) {
	// whenAvailable turned into always without handoff: there is no holder
	// to judge, and a stale report must not stay on the object.
	adv := withStatus(programmed(metav1.ConditionTrue, "Announced"),
		metav1.Condition{Type: v1alpha1.ConditionHolderAvailable, Status: metav1.ConditionTrue, Reason: "Serving"})
	next, changed := withConditions(adv, Conditions(Verdict{Announced: true}, true), now)
	if !changed || meta.FindStatusCondition(next.Status.Conditions, v1alpha1.ConditionHolderAvailable) != nil {
		t.Fatalf("changed %v, conditions %+v", changed, next.Status.Conditions)
	}
	if _, changed := withConditions(next, Conditions(Verdict{Announced: true}, true), now); changed {
		t.Fatal("the removal is not steady")
	}
}
