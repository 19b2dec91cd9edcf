package handoff

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotations of the handoff Lease that carry the holder's availability
// report. Only Acquire, Release and SetAvailable write them.
const (
	// AnnotationAvailable is "true" or "false".
	AnnotationAvailable = "network.galactic.dev/available"
	// AnnotationAvailableToken is the decimal fencing token the report was
	// made under; a report under another token than the lease's says
	// nothing about the current holder.
	AnnotationAvailableToken = "network.galactic.dev/available-token"
	// AnnotationAvailableReason is a condition reason (CamelCase).
	AnnotationAvailableReason = "network.galactic.dev/available-reason"
)

// Reasons of availability: those Acquire and Release write, and those
// Availability returns when the holder gave none or the report does not
// apply. A holder's own reason, when it gave one, is returned as is.
const (
	// ReasonAcquired: written by an acquisition with a new token; the new
	// holder has not reported yet (False).
	ReasonAcquired = "Acquired"
	// ReasonReleased: written by a release; also Availability's reason for
	// a free lease (False).
	ReasonReleased = "Released"
	// ReasonAvailable: the holder reported available without a reason (True).
	ReasonAvailable = "Available"
	// ReasonUnavailable: the holder reported not available without a
	// reason (False).
	ReasonUnavailable = "HolderUnavailable"
	// ReasonNotCurrentHolder: another holder, or a newer token, has the
	// lease (False).
	ReasonNotCurrentHolder = "NotCurrentHolder"
	// ReasonNoReport: the holder is current but no report was made under
	// its token (Unknown).
	ReasonNoReport = "NoReport"
	// ReasonNoLease: there is no lease to read (Unknown).
	ReasonNoLease = "NoLease"
)

// Report is a holder's availability report as the lease's annotations
// carry it.
type Report struct {
	// Set is false when the lease carries no report at all.
	Set       bool
	Available bool
	// Token is the fencing token the report was made under.
	Token int64
	// Reason is a condition reason; empty when the holder gave none.
	Reason string
}

// reasonPattern is what metav1.Condition accepts as a reason, so a
// reader can copy a holder's reason into a condition unchanged.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

const maxReasonLength = 1024

// ValidReason reports whether reason may be reported: empty, or a
// condition reason such as "Booting" or "ShuttingDown".
func ValidReason(reason string) bool {
	return reason == "" || (len(reason) <= maxReasonLength && reasonPattern.MatchString(reason))
}

func reportFromAnnotations(a map[string]string) Report {
	v, ok := a[AnnotationAvailable]
	if !ok {
		return Report{}
	}
	// A token that does not parse reads as 0, which no holder ever has.
	token, _ := strconv.ParseInt(a[AnnotationAvailableToken], 10, 64)
	return Report{Set: true, Available: v == "true", Token: token, Reason: a[AnnotationAvailableReason]}
}

func annotationsFromReport(r Report) map[string]string {
	if !r.Set {
		return nil
	}
	return map[string]string{
		AnnotationAvailable:       strconv.FormatBool(r.Available),
		AnnotationAvailableToken:  strconv.FormatInt(r.Token, 10),
		AnnotationAvailableReason: r.Reason,
	}
}

// SetAvailable records whether holder's instance serves, under its token.
// Like a renewal it writes only while holder and token are current, with
// the resourceVersion it read (one get, one update; none when the lease
// already says exactly this), and otherwise returns an error wrapping
// ErrLost and writes nothing. reason must be empty or a condition reason
// (ValidReason).
func (l *Lock) SetAvailable(ctx context.Context, holder string, token int64, available bool, reason string) error {
	if !ValidReason(reason) {
		return fmt.Errorf("reporting availability on lease %s: reason %q is not a condition reason (a letter, then letters, digits, _ , or :, such as \"ShuttingDown\")", l.key, reason)
	}
	want := Report{Set: true, Available: available, Token: token, Reason: reason}
	return l.rewrite(ctx, Grant{Holder: holder, Token: token}, "reporting availability on", func(r Record, now time.Time) (Record, bool) {
		if r.Report == want {
			return r, false
		}
		// The write is a new version of the lease, which restarts every
		// acquirer's observation just as a renewal does; say so in renewTime.
		r.Report, r.RenewTime = want, now
		return r, true
	})
}

// Availability says whether the lease's current holder, given as the
// holder identity and fencing token a reader expects (an advertisement
// entry's node, containerID and holderGeneration), reports itself
// available. It is a pure function of the lease:
//
//   - Unknown, ReasonNoLease: lease is nil.
//   - False, ReasonReleased: the lease is free.
//   - False, ReasonNotCurrentHolder: another holder, or another token, holds it.
//   - Unknown, ReasonNoReport: holder and token are current, but no report
//     was made under that token.
//   - True, the holder's reason or ReasonAvailable: it reported available.
//   - False, the holder's reason or ReasonUnavailable: it reported not
//     available; right after an acquisition that reason is ReasonAcquired.
//
// A reason on the lease that is not a condition reason is replaced by the
// default, so the result can always go into a metav1.Condition.
func Availability(lease *coordinationv1.Lease, holder string, token int64) (status metav1.ConditionStatus, reason, message string) {
	if lease == nil {
		return metav1.ConditionUnknown, ReasonNoLease, "the handoff lease does not exist"
	}
	rec := RecordFromLease(lease)
	cur := int64(rec.LeaseTransitions)
	switch {
	case rec.HolderIdentity == "":
		return metav1.ConditionFalse, ReasonReleased, fmt.Sprintf("lease %s is free (token %d released)", lease.Name, cur)
	case rec.HolderIdentity != holder || cur != token:
		return metav1.ConditionFalse, ReasonNotCurrentHolder, fmt.Sprintf("lease %s is held by %s with token %d, not %s with token %d",
			lease.Name, rec.HolderIdentity, cur, holder, token)
	}
	rep := rec.Report
	if !rep.Set || rep.Token != token {
		return metav1.ConditionUnknown, ReasonNoReport, fmt.Sprintf("%s (token %d) has made no availability report under its token", holder, token)
	}
	reason = rep.Reason
	if reason == "" || !ValidReason(reason) {
		reason = ReasonUnavailable
		if rep.Available {
			reason = ReasonAvailable
		}
	}
	switch {
	case rep.Available:
		return metav1.ConditionTrue, reason, fmt.Sprintf("%s (token %d) reports available", holder, token)
	case reason == ReasonAcquired:
		return metav1.ConditionFalse, reason, fmt.Sprintf("%s (token %d) acquired the lease and has not reported available yet", holder, token)
	default:
		return metav1.ConditionFalse, reason, fmt.Sprintf("%s (token %d) reports not available", holder, token)
	}
}

// AvailabilityOf is Availability for a reader that knows the attachment's
// identity (an advertisement entry's attachmentUID, empty for an inline
// attachment): a lease of another UID is a predecessor's, so its holder
// is not current (False, ReasonNotCurrentHolder) whatever it reports.
func AvailabilityOf(lease *coordinationv1.Lease, uid, holder string, token int64) (status metav1.ConditionStatus, reason, message string) {
	if lease != nil {
		if have := identityFromLabels(lease.Labels).UID; have != uid {
			return metav1.ConditionFalse, ReasonNotCurrentHolder, fmt.Sprintf("lease %s belongs to attachment UID %q, not %q", lease.Name, have, uid)
		}
	}
	return Availability(lease, holder, token)
}
