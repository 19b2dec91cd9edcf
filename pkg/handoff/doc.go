// Package handoff makes sure at most one runtime holds a VPC attachment at a
// time. The attachment's coordination.k8s.io/v1 Lease (names.Lease) names
// its holder, "<node>/<containerID>"; a holder acquires it before attaching,
// renews it while it runs and releases it when it detaches.
//
// Every write carries the resourceVersion it read, so two acquirers that
// race cannot both win. Each acquisition increments leaseTransitions, the
// fencing token: a new lease starts at 1, so 0 means "no handoff". Whatever
// the holder publishes (the advertisement entry's holderGeneration) carries
// its token, and readers follow the highest one.
//
// The holder also reports whether its instance serves (SetAvailable), in
// annotations of the lease bound to its token and guarded like a renewal.
// An acquisition with a new token and a release reset the report to not
// available, so a successor never starts from its predecessor's word;
// renewals keep it. Availability reads a lease for the router and for
// compute controllers. Held leases carry names.LabelHolderNode, so a node
// watches only the leases of its own holders.
//
// A holder that stops renewing is taken over once an acquirer has seen the
// same lease version unchanged for leaseDurationSeconds of its own clock.
// Renew and remote timestamps are change signals, never compared with this
// machine's clock. A CNI ADD is a new process each time, so
// Options.ObservationDir keeps the observation on disk to let retries on
// one node continue it; there it is wall-clock time, and a forward step of
// the node's clock shortens the wait by the step.
//
// The guarantee and its limit: no two grants are current at once, and a
// grant that is no longer current gets ErrLost from Renew and Release,
// whose Release leaves the new holder alone. But a lease cannot stop a
// process. A holder that loses its lease must stop using the attachment,
// and a holder whose renewer has been dead for longer than the lease
// duration can be taken over even though the holder itself still runs.
// Renew more often than the lease duration (the node GC renews the leases
// of live local holders on every pass).
package handoff
