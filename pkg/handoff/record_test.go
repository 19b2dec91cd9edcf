package handoff

import (
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/galactic-cni/galactic/pkg/names"
)

func TestARecordSurvivesTheTripThroughALeaseAndTheWire(t *testing.T) {
	// The API keeps microseconds.
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, r := range []Record{
		{},
		{LeaseDurationSeconds: 60, RenewTime: at, LeaseTransitions: 7},
		{HolderIdentity: "node-a/3f1c", LeaseDurationSeconds: 60, AcquireTime: at, RenewTime: at.Add(time.Second), LeaseTransitions: 1},
		{LeaseDurationSeconds: 60, RenewTime: at, LeaseTransitions: 7, Report: Report{Set: true, Token: 7, Reason: ReasonReleased}},
		{HolderIdentity: "node-a/3f1c", LeaseDurationSeconds: 60, AcquireTime: at, RenewTime: at, LeaseTransitions: 2, Report: Report{Set: true, Available: true, Token: 2}},
		{HolderIdentity: "node-a/3f1c", LeaseDurationSeconds: 60, AcquireTime: at, RenewTime: at, LeaseTransitions: 2, Identity: Identity{Namespace: "tenant-a", UID: "u1"}},
		{LeaseDurationSeconds: 60, RenewTime: at, LeaseTransitions: 2, Identity: Identity{Namespace: "tenant-a", UID: "u1"}},
	} {
		spec := r
		spec.Report, spec.Identity = Report{}, Identity{}
		if got := RecordFromSpec(SpecFromRecord(r)); !reflect.DeepEqual(got, spec) {
			t.Errorf("spec round trip: want %+v, got %+v", spec, got)
		}
		if got := RecordFromLease(LeaseFromRecord("galactic-system", "blue.web-0-net0", "", r)); !reflect.DeepEqual(got, r) {
			t.Errorf("lease round trip: want %+v, got %+v", r, got)
		}
		data, err := json.Marshal(LeaseFromRecord("galactic-system", "blue.web-0-net0", "42", r))
		if err != nil {
			t.Fatal(err)
		}
		var l coordinationv1.Lease
		if err := json.Unmarshal(data, &l); err != nil {
			t.Fatal(err)
		}
		got := ObservedFromLease(&l)
		if got.ResourceVersion != "42" || !got.Record.AcquireTime.Equal(r.AcquireTime) || !got.Record.RenewTime.Equal(r.RenewTime) {
			t.Errorf("wire round trip of %+v: got %+v", r, got)
		}
		got.Record.AcquireTime, got.Record.RenewTime, r.AcquireTime, r.RenewTime = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if got.Record != r {
			t.Errorf("wire round trip: want %+v, got %+v", r, got.Record)
		}
	}
}

func TestAFreeRecordWritesNoHolderIdentity(t *testing.T) {
	spec := SpecFromRecord(Record{LeaseDurationSeconds: 60, LeaseTransitions: 3})
	if spec.HolderIdentity != nil {
		t.Fatalf("want no holderIdentity, got %q", *spec.HolderIdentity)
	}
	if got := RecordFromSpec(coordinationv1.LeaseSpec{}); got != (Record{}) {
		t.Fatalf("an empty spec reads as the zero record, got %+v", got)
	}
}

func TestAHeldLeaseIsLabelledWithItsHoldersNodeAndAFreeOneIsNot(t *testing.T) {
	longNode := strings.Repeat("n", 100)
	for _, tc := range []struct {
		holder string
		want   map[string]string
	}{
		{"node-a/3f1c", map[string]string{names.LabelHolderNode: "node-a"}},
		{longNode + "/3f1c", map[string]string{names.LabelHolderNode: names.NodeLabelValue(longNode)}},
		{"", nil},
		{"not-a-holder-identity", nil},
	} {
		l := LeaseFromRecord("galactic-system", "blue-1.web-2", "", Record{HolderIdentity: tc.holder, LeaseTransitions: 1, Identity: Identity{Namespace: "tenant-a", UID: "u1"}})
		want := map[string]string{"network.galactic.dev/namespace": "tenant-a", "network.galactic.dev/attachment-uid": "u1"}
		maps.Copy(want, tc.want)
		if !reflect.DeepEqual(l.Labels, want) {
			t.Errorf("holder %.20q of an object's lease: labels %v, want %v", tc.holder, l.Labels, want)
		}
	}
	for _, tc := range []struct {
		holder string
		want   map[string]string
	}{
		{"node-a/3f1c", map[string]string{names.LabelHolderNode: "node-a"}},
		{"", nil},
	} {
		l := LeaseFromRecord("galactic-system", "blue.web-0-net0", "", Record{HolderIdentity: tc.holder, LeaseTransitions: 1})
		if !reflect.DeepEqual(l.Labels, tc.want) {
			t.Errorf("holder %.20q: labels %v, want %v", tc.holder, l.Labels, tc.want)
		}
	}
}
