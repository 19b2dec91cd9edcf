package handoff

import (
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAvailabilityFollowsOnlyTheCurrentHoldersReportUnderItsToken(t *testing.T) {
	lease := func(holder string, token int32, annotations map[string]string) *coordinationv1.Lease {
		l := LeaseFromRecord("galactic-system", "blue.web-0-net0", "7", Record{HolderIdentity: holder, LeaseDurationSeconds: 60, LeaseTransitions: token})
		l.Annotations = annotations
		return l
	}
	report := func(available, token, reason string) map[string]string {
		return map[string]string{AnnotationAvailable: available, AnnotationAvailableToken: token, AnnotationAvailableReason: reason}
	}
	for _, tc := range []struct {
		name       string
		lease      *coordinationv1.Lease
		holder     string
		token      int64
		wantStatus metav1.ConditionStatus
		wantReason string
	}{
		{"no lease is unknown", nil, "node-a/c1", 3, metav1.ConditionUnknown, ReasonNoLease},
		{"an available holder is available with its reason", lease("node-a/c1", 3, report("true", "3", "Serving")), "node-a/c1", 3, metav1.ConditionTrue, "Serving"},
		{"an available holder without a reason gets the default", lease("node-a/c1", 3, report("true", "3", "")), "node-a/c1", 3, metav1.ConditionTrue, ReasonAvailable},
		{"an unavailable holder is unavailable with its reason", lease("node-a/c1", 3, report("false", "3", "ShuttingDown")), "node-a/c1", 3, metav1.ConditionFalse, "ShuttingDown"},
		{"an unavailable holder without a reason gets the default", lease("node-a/c1", 3, report("false", "3", "")), "node-a/c1", 3, metav1.ConditionFalse, ReasonUnavailable},
		{"a reason that cannot go into a condition gets the default", lease("node-a/c1", 3, report("false", "3", "shutting down")), "node-a/c1", 3, metav1.ConditionFalse, ReasonUnavailable},
		{"a holder that just acquired is unavailable", lease("node-a/c1", 3, report("false", "3", ReasonAcquired)), "node-a/c1", 3, metav1.ConditionFalse, ReasonAcquired},
		{"anything but true is not available", lease("node-a/c1", 3, report("yes", "3", "")), "node-a/c1", 3, metav1.ConditionFalse, ReasonUnavailable},
		{"no report is unknown", lease("node-a/c1", 3, nil), "node-a/c1", 3, metav1.ConditionUnknown, ReasonNoReport},
		{"a report under an older token is unknown", lease("node-a/c1", 3, report("true", "2", "")), "node-a/c1", 3, metav1.ConditionUnknown, ReasonNoReport},
		{"a token that does not parse is no report", lease("node-a/c1", 3, report("true", "three", "")), "node-a/c1", 3, metav1.ConditionUnknown, ReasonNoReport},
		{"a successor's lease says the predecessor is not current", lease("node-b/c2", 4, report("true", "4", "")), "node-a/c1", 3, metav1.ConditionFalse, ReasonNotCurrentHolder},
		{"a newer token of the same holder is not the reader's", lease("node-a/c1", 4, report("true", "4", "")), "node-a/c1", 3, metav1.ConditionFalse, ReasonNotCurrentHolder},
		{"an older token than the reader's is not current either", lease("node-a/c1", 3, report("true", "3", "")), "node-a/c1", 4, metav1.ConditionFalse, ReasonNotCurrentHolder},
		{"a predecessor's report left on a released lease does not count", lease("", 3, report("true", "3", "")), "node-a/c1", 3, metav1.ConditionFalse, ReasonReleased},
		{"a reader without handoff (token 0) never matches a holder", lease("node-a/c1", 3, report("true", "3", "")), "node-a/c1", 0, metav1.ConditionFalse, ReasonNotCurrentHolder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, reason, message := Availability(tc.lease, tc.holder, tc.token)
			if status != tc.wantStatus || reason != tc.wantReason {
				t.Errorf("want %s %s, got %s %s (%s)", tc.wantStatus, tc.wantReason, status, reason, message)
			}
			if message == "" {
				t.Error("no message")
			}
			if !ValidReason(reason) || reason == "" {
				t.Errorf("reason %q cannot go into a condition", reason)
			}
		})
	}
}

func TestValidReasonAcceptsWhatAConditionAccepts(t *testing.T) {
	for reason, want := range map[string]bool{
		"": true, "Booting": true, "Quota_Wait": true, "a:b,c": true,
		"shutting down": false, "1Booting": false, "Booting,": false, strings.Repeat("A", 1025): false,
	} {
		if got := ValidReason(reason); got != want {
			t.Errorf("ValidReason(%.20q) = %v, want %v", reason, got, want)
		}
	}
}

func TestAvailabilityOfALeaseOfAnotherUIDIsNeverItsHolders(t *testing.T) {
	lease := LeaseFromRecord("galactic-system", "blue-1.web-2", "7", Record{
		HolderIdentity: "node-a/c1", LeaseTransitions: 3, Report: Report{Set: true, Available: true, Token: 3},
		Identity: Identity{Namespace: "tenant-a", UID: "u1"},
	})
	if st, _, _ := AvailabilityOf(lease, "u1", "node-a/c1", 3); st != metav1.ConditionTrue {
		t.Fatalf("the attachment's own lease: %s", st)
	}
	for _, uid := range []string{"u2", ""} {
		if st, reason, msg := AvailabilityOf(lease, uid, "node-a/c1", 3); st != metav1.ConditionFalse || reason != ReasonNotCurrentHolder || !strings.Contains(msg, "u1") {
			t.Fatalf("read for UID %q: %s %s %q", uid, st, reason, msg)
		}
	}
	if st, reason, _ := AvailabilityOf(nil, "u1", "node-a/c1", 3); st != metav1.ConditionUnknown || reason != ReasonNoLease {
		t.Fatalf("no lease: %s %s", st, reason)
	}
}
