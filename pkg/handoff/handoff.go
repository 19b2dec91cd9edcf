package handoff

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
)

var (
	// ErrLost means the grant's holder and token are no longer current: the
	// holder must stop using the attachment.
	ErrLost = errors.New("handoff lease lost")
	// ErrHeld means another holder has the lease and it has not expired;
	// the error is a *HeldError naming that holder.
	ErrHeld = errors.New("handoff lease held by another holder")
)

// HeldError says who holds the lease when an acquisition gives up.
type HeldError struct {
	// Lease is "<namespace>/<name>".
	Lease string
	// Holder and Token are the current holder and its fencing token.
	Holder string
	Token  int64
	// Predecessor is set when the lease belongs to another VPCAttachment
	// (its UID label is not the Lock's): a predecessor's lease, which
	// is never taken over, however long it goes unrenewed.
	Predecessor *Identity
	// Err is why waiting ended (the context's error); nil from TryAcquire.
	Err error

	// expiresIn is how long, by this process's observation, until the
	// holder may be taken over; resourceVersion is the version read.
	expiresIn       time.Duration
	resourceVersion string
}

func (e *HeldError) Error() string {
	msg := fmt.Sprintf("lease %s is held by %s (token %d)", e.Lease, e.Holder, e.Token)
	if p := e.Predecessor; p != nil {
		msg = fmt.Sprintf("lease %s belongs to another attachment (UID %q in namespace %q, held by %q with token %d): a predecessor's, left to its own release", e.Lease, p.UID, p.Namespace, e.Holder, e.Token)
	}
	if e.Err != nil {
		msg += ": gave up waiting: " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

func (e *HeldError) Unwrap() error { return e.Err }

// Grant is one holder's acquisition of the lease. It holds nothing but the
// two values that make it current, so a process that recorded them (the
// node GC, a later DEL) can rebuild it.
type Grant struct {
	// Holder is the holder identity, "<node>/<containerID>".
	Holder string
	// Token is the lease's leaseTransitions when Holder acquired it: the
	// fencing token, at least 1 (0 means no handoff).
	Token int64
}

// DefaultRetryPeriod caps the wait between two attempts of Acquire when it
// cannot watch the lease.
const DefaultRetryPeriod = time.Second

// Options tune a Lock.
type Options struct {
	// LeaseDuration is how long the lease stays ours without a renewal,
	// written as leaseDurationSeconds: whole seconds, at least one.
	LeaseDuration time.Duration
	// RetryPeriod caps the backoff between attempts while the lease is
	// held by another; zero means DefaultRetryPeriod (or LeaseDuration if
	// shorter). It may not exceed LeaseDuration.
	RetryPeriod time.Duration
	// Clock is this machine's clock; nil means the real one.
	Clock clock.Clock
	// ObservationDir, when set, keeps this node's observation of the lease
	// (resourceVersion and when this node first saw it) in a file, so that
	// short-lived processes retrying Acquire continue one observation
	// instead of each starting a new one. Empty keeps it in memory only.
	ObservationDir string
	// Identity is the VPCAttachment an object-backed attachment's lease
	// belongs to: every write labels the lease with it, and a lease
	// labelled with another UID is a predecessor's, never taken, renewed
	// or released. Zero for an inline attachment: its Lock takes only
	// leases without a UID and keeps whatever identity a lease it renews
	// or releases has.
	Identity Identity
	// ReportAvailable makes every acquisition report the new holder
	// available, with ReportReason, in the acquiring write itself instead of
	// starting not available: for a runtime whose instance serves the moment
	// it holds the lease (a promoted migration target), one write fewer.
	ReportAvailable bool
	ReportReason    string
}

// Lock acquires, renews and releases one handoff Lease. It is safe for
// concurrent use.
type Lock struct {
	store         Store
	key           string
	leaseDuration time.Duration
	retryPeriod   time.Duration
	clock         clock.Clock
	obsDir        string
	onAcquire     *Report
	identity      Identity

	mu  sync.Mutex
	obs observation
}

// maxConflicts bounds the immediate re-reads after conflicting writes in
// one call; each conflict means another writer made progress.
const maxConflicts = 10

// LeaseClient is the part of a typed Lease client of one namespace that a
// Lock uses; client.Clients.Leases and client-go's typed client fit.
type LeaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// New returns a Lock over the Lease namespace/name (names.Lease); leases is
// the Lease client of that namespace.
func New(leases LeaseClient, namespace, name string, opts Options) (*Lock, error) {
	if leases == nil {
		return nil, errors.New("handoff: no lease client")
	}
	if namespace == "" || name == "" {
		return nil, fmt.Errorf("handoff: lease namespace and name are required, got %q/%q", namespace, name)
	}
	s := &leaseStore{leases: leases, namespace: namespace, name: name}
	if w, ok := leases.(leaseWatcher); ok {
		return NewWithStore(watchingStore{s, w}, namespace+"/"+name, opts)
	}
	return NewWithStore(s, namespace+"/"+name, opts)
}

// NewWithStore returns a Lock over any Store; key names the lease in errors
// and in ObservationDir.
func NewWithStore(store Store, key string, opts Options) (*Lock, error) {
	if store == nil {
		return nil, errors.New("handoff: no store")
	}
	if key == "" {
		return nil, errors.New("handoff: the lease key is empty")
	}
	d := opts.LeaseDuration
	if d < time.Second || d%time.Second != 0 || d/time.Second > math.MaxInt32 {
		return nil, fmt.Errorf("handoff: lease duration must be a whole number of seconds, at least 1s, got %v", d)
	}
	retry := opts.RetryPeriod
	switch {
	case retry < 0:
		return nil, fmt.Errorf("handoff: retry period must not be negative, got %v", retry)
	case retry == 0:
		retry = min(DefaultRetryPeriod, d)
	case retry > d:
		return nil, fmt.Errorf("handoff: retry period %v exceeds the lease duration %v", retry, d)
	}
	c := opts.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	if (opts.Identity.UID == "") != (opts.Identity.Namespace == "") {
		return nil, fmt.Errorf("handoff: an identity needs both namespace and UID, got %+v", opts.Identity)
	}
	l := &Lock{store: store, key: key, leaseDuration: d, retryPeriod: retry, clock: c, obsDir: opts.ObservationDir, identity: opts.Identity}
	if opts.ReportAvailable {
		if !ValidReason(opts.ReportReason) {
			return nil, fmt.Errorf("handoff: report reason %q is not a condition reason", opts.ReportReason)
		}
		l.onAcquire = &Report{Set: true, Available: true, Reason: opts.ReportReason}
	}
	return l, nil
}

// Get returns the lease's current record; a lease that does not exist yet
// reads as the zero Record (free, token 0).
func (l *Lock) Get(ctx context.Context) (Record, error) {
	cur, err := l.store.Get(ctx)
	if apierrors.IsNotFound(err) {
		return Record{}, nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("reading lease %s: %w", l.key, err)
	}
	return cur.Record, nil
}

// watchPollPeriod caps the wait between two attempts of Acquire while a
// watch of the lease runs: the watch says when it changes, the poll covers
// a watch that stalls without ending.
const watchPollPeriod = 5 * time.Second

// maxWatchEnds is how many watches may end without reporting a change
// before Acquire stops watching and polls instead.
const maxWatchEnds = 3

// Acquire waits until the lease is free, expired by this node's
// observation, or already held by holder, and takes it. While another holds
// it, Acquire watches the lease when its store can (Watcher), so a release
// is seen when it happens; without a watch, or when watching fails, it
// polls, backing off with jitter up to the retry period. When ctx ends
// first, the error is a *HeldError naming the current holder
// (errors.Is(err, ErrHeld)). Errors other than conflicts end the wait.
func (l *Lock) Acquire(ctx context.Context, holder string) (Grant, error) {
	return l.AcquireFrom(ctx, holder, nil)
}

// AcquireFrom is Acquire deciding its first attempt from seen, when not
// nil: the lease as Read returned it moments ago, read while the caller
// did other work. A lease that changed since conflicts and is read again.
func (l *Lock) AcquireFrom(ctx context.Context, holder string, seen *Observed) (Grant, error) {
	backoff := max(l.retryPeriod/8, time.Millisecond)
	var last *HeldError
	watcher, watching := l.store.(Watcher)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var changes <-chan Observed
	// seen is the lease as the watch last reported it: the next attempt
	// decides from it instead of reading the lease again.
	watchEnds := 0
	for {
		g, err := l.attempt(ctx, holder, seen)
		seen = nil
		if err == nil {
			return g, nil
		}
		var held *HeldError
		switch {
		case errors.As(err, &held):
			last = held
		case ctx.Err() != nil && last != nil:
			return Grant{}, last.withCause(ctx.Err())
		case apierrors.IsConflict(err):
		default:
			return Grant{}, err
		}
		if watching && changes == nil && held != nil {
			// From the version just read, so no change after it is missed.
			if changes, err = watcher.Watch(watchCtx, held.resourceVersion); err != nil {
				watching, changes = false, nil
			}
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if changes != nil && held != nil {
			wait = watchPollPeriod
		} else {
			backoff = min(2*backoff, l.retryPeriod)
		}
		if held != nil && held.expiresIn > 0 && held.expiresIn < wait {
			wait = held.expiresIn
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return Grant{}, last.withCause(ctx.Err())
			}
			return Grant{}, fmt.Errorf("acquiring lease %s: %w", l.key, ctx.Err())
		case <-l.clock.After(wait):
		case o, ok := <-changes:
			switch {
			case !ok:
				// The watch ended: the next attempt starts another from
				// what it reads, unless watches keep ending.
				changes = nil
				if watchEnds++; watchEnds >= maxWatchEnds {
					watching = false
				}
			case o.ResourceVersion != "":
				seen = &o
			}
		}
	}
}

func (e *HeldError) withCause(err error) *HeldError {
	c := *e
	c.Err = err
	return &c
}

// TryAcquire makes one attempt: it takes the lease if it is free, expired
// by this node's observation, or already holder's, and otherwise returns a
// *HeldError at once. Each call continues this node's observation, so
// calling it again after the lease duration can take over a holder that
// stopped renewing.
func (l *Lock) TryAcquire(ctx context.Context, holder string) (Grant, error) {
	return l.attempt(ctx, holder, nil)
}

// TryAcquireFrom is TryAcquire deciding first from seen, as AcquireFrom.
func (l *Lock) TryAcquireFrom(ctx context.Context, holder string, seen *Observed) (Grant, error) {
	return l.attempt(ctx, holder, seen)
}

// attempt is TryAcquire deciding first from seen, when not nil, a version
// of the lease already observed; a conflict reads the lease again.
func (l *Lock) attempt(ctx context.Context, holder string, seen *Observed) (Grant, error) {
	if holder == "" {
		return Grant{}, errors.New("handoff: the holder identity is empty")
	}
	var err error
	for range maxConflicts {
		var g Grant
		g, err = l.tryAcquire(ctx, holder, seen)
		seen = nil
		if !isRace(err) || ctx.Err() != nil {
			return g, err
		}
	}
	return Grant{}, fmt.Errorf("acquiring lease %s: %w", l.key, err)
}

// isRace reports an error that means another writer got in between our
// read and our write: read again and decide again.
func isRace(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
}

func (l *Lock) tryAcquire(ctx context.Context, holder string, seen *Observed) (Grant, error) {
	cur, err := l.current(ctx, seen)
	// Read the clock after the lease: a renewal that lands while the read
	// is in flight must not count as seen earlier than it happened.
	now := l.clock.Now()
	if apierrors.IsNotFound(err) {
		// A new lease starts at token 1, so token 0 always means "no handoff".
		if _, err := l.store.Create(ctx, l.acquired(holder, now, 1, Identity{})); err != nil {
			return Grant{}, err
		}
		l.forget()
		return Grant{Holder: holder, Token: 1}, nil
	}
	if err != nil {
		return Grant{}, fmt.Errorf("reading lease %s: %w", l.key, err)
	}
	rec := cur.Record
	if rec.Identity.UID != l.identity.UID && rec.Identity.UID != "" {
		p := rec.Identity
		return Grant{}, &HeldError{Lease: l.key, Holder: rec.HolderIdentity, Token: int64(rec.LeaseTransitions), Predecessor: &p, resourceVersion: cur.ResourceVersion}
	}
	if rec.HolderIdentity == holder && rec.LeaseTransitions > 0 {
		// Ours already (a retried ADD): refresh it, keep the token and,
		// like a renewal, the holder's availability report, unless this
		// Lock reports on acquisition.
		r := l.held(holder, rec.AcquireTime, now, rec.LeaseTransitions, rec.Identity)
		r.Report = rec.Report
		if l.onAcquire != nil {
			r.Report = l.acquired(holder, now, rec.LeaseTransitions, rec.Identity).Report
		}
		if _, err := l.store.Update(ctx, cur.ResourceVersion, r); err != nil {
			return Grant{}, err
		}
		return Grant{Holder: holder, Token: int64(rec.LeaseTransitions)}, nil
	}
	if rec.HolderIdentity != "" {
		left, err := l.expiresIn(cur, now)
		if err != nil {
			return Grant{}, err
		}
		if left > 0 {
			return Grant{}, &HeldError{Lease: l.key, Holder: rec.HolderIdentity, Token: int64(rec.LeaseTransitions), expiresIn: left, resourceVersion: cur.ResourceVersion}
		}
	}
	if rec.LeaseTransitions == math.MaxInt32 {
		return Grant{}, fmt.Errorf("lease %s: leaseTransitions is at its maximum; delete the lease to start over", l.key)
	}
	token := rec.LeaseTransitions + 1
	if _, err := l.store.Update(ctx, cur.ResourceVersion, l.acquired(holder, now, token, rec.Identity)); err != nil {
		return Grant{}, err
	}
	l.forget()
	return Grant{Holder: holder, Token: int64(token)}, nil
}

// current is seen when not nil, else the lease read from the store.
func (l *Lock) current(ctx context.Context, seen *Observed) (Observed, error) {
	if seen != nil {
		return *seen, nil
	}
	return l.store.Get(ctx)
}

// held is the record of holder's grant. It carries the Lock's identity,
// else the one the lease has (was): an inline Lock (galactic-gc's renewal
// from a node record) keeps an object-backed lease's labels.
func (l *Lock) held(holder string, acquired, renewed time.Time, token int32, was Identity) Record {
	id := l.identity
	if id.UID == "" {
		id = was
	}
	return Record{
		HolderIdentity:       holder,
		LeaseDurationSeconds: int32(l.leaseDuration / time.Second),
		AcquireTime:          acquired,
		RenewTime:            renewed,
		LeaseTransitions:     token,
		Identity:             id,
	}
}

// acquired is the record of a new grant: a new token starts not
// available, whatever the lease said about the holder before it, unless
// the Lock reports on acquisition.
func (l *Lock) acquired(holder string, now time.Time, token int32, was Identity) Record {
	r := l.held(holder, now, now, token, was)
	r.Report = Report{Set: true, Token: int64(token), Reason: ReasonAcquired}
	if l.onAcquire != nil {
		r.Report = *l.onAcquire
		r.Report.Token = int64(token)
	}
	return r
}

// expiresIn is how long until the holder of cur may be taken over: its
// lease duration after this node first saw this exact resourceVersion.
func (l *Lock) expiresIn(cur Observed, now time.Time) (time.Duration, error) {
	first, err := l.observe(cur, now)
	if err != nil {
		return 0, err
	}
	d := time.Duration(cur.Record.LeaseDurationSeconds) * time.Second
	if d <= 0 {
		d = l.leaseDuration
	}
	return d - now.Sub(first), nil
}

// Renew extends the grant's lease. It fails with ErrLost unless the grant's
// holder and token are current.
func (l *Lock) Renew(ctx context.Context, g Grant) error {
	return l.rewrite(ctx, g, "renewing", func(r Record, now time.Time) (Record, bool) {
		n := l.held(r.HolderIdentity, r.AcquireTime, now, r.LeaseTransitions, r.Identity)
		n.Report = r.Report
		return n, true
	})
}

// Release frees the grant's lease for the next holder, keeping its token
// count so tokens keep rising. If the grant is no longer current it
// changes nothing and returns ErrLost, which a caller tearing down (CNI
// DEL) treats as done: the lease is not ours to free.
func (l *Lock) Release(ctx context.Context, g Grant) error {
	return l.ReleaseFrom(ctx, g, nil)
}

// ReleaseFrom is Release deciding first from seen, when not nil, the lease
// as Read returned it earlier: a holder reads its lease while it tears
// down and frees it with one write once it is done. A lease that changed
// since conflicts and is read again.
func (l *Lock) ReleaseFrom(ctx context.Context, g Grant, seen *Observed) error {
	return l.rewriteFrom(ctx, g, seen, "releasing", func(r Record, now time.Time) (Record, bool) {
		return Record{
			LeaseDurationSeconds: r.LeaseDurationSeconds, RenewTime: now, LeaseTransitions: r.LeaseTransitions,
			Report:   Report{Set: true, Token: int64(r.LeaseTransitions), Reason: ReasonReleased},
			Identity: r.Identity,
		}, true
	})
}

// Read returns the lease as it is now, with its resourceVersion, for a
// later ReleaseFrom.
func (l *Lock) Read(ctx context.Context) (Observed, error) {
	return l.store.Get(ctx)
}

// cachedGetter is a Store that can also read from a cache that may be
// behind, never ahead.
type cachedGetter interface {
	GetCached(ctx context.Context) (Observed, error)
}

// ReadCached is Read from the API server's watch cache (Read where the
// store has none), which spares the API server a read of etcd. The lease
// may be a moment behind: AcquireFrom and ReleaseFrom guard their write
// with the resourceVersion they decide from, so a version that is behind
// conflicts and is read again, and a holder seen later than it wrote is
// waited for longer, never shorter.
func (l *Lock) ReadCached(ctx context.Context) (Observed, error) {
	if c, ok := l.store.(cachedGetter); ok {
		return c.GetCached(ctx)
	}
	return l.store.Get(ctx)
}

// rewrite replaces the record of a current grant with next's; next
// returning false means the lease is as wanted already: nothing is written.
func (l *Lock) rewrite(ctx context.Context, g Grant, verb string, next func(Record, time.Time) (Record, bool)) error {
	return l.rewriteFrom(ctx, g, nil, verb, next)
}

// rewriteFrom is rewrite deciding first from seen, when not nil.
func (l *Lock) rewriteFrom(ctx context.Context, g Grant, seen *Observed, verb string, next func(Record, time.Time) (Record, bool)) error {
	if g.Holder == "" || g.Token < 1 {
		return fmt.Errorf("%s lease %s: not a grant: holder %q, token %d", verb, l.key, g.Holder, g.Token)
	}
	var err error
	for range maxConflicts {
		var cur Observed
		cur, err = l.current(ctx, seen)
		seen = nil
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%s lease %s: %w: the lease does not exist", verb, l.key, ErrLost)
		}
		if err != nil {
			return fmt.Errorf("%s lease %s: %w", verb, l.key, err)
		}
		rec := cur.Record
		if l.identity.UID != "" && rec.Identity.UID != l.identity.UID {
			return fmt.Errorf("%s lease %s: %w: it belongs to attachment UID %q, not %q", verb, l.key, ErrLost, rec.Identity.UID, l.identity.UID)
		}
		if rec.HolderIdentity != g.Holder || int64(rec.LeaseTransitions) != g.Token {
			return fmt.Errorf("%s lease %s: %w: held by %q with token %d, not %q with token %d",
				verb, l.key, ErrLost, rec.HolderIdentity, rec.LeaseTransitions, g.Holder, g.Token)
		}
		n, write := next(rec, l.clock.Now())
		if !write {
			return nil
		}
		_, err = l.store.Update(ctx, cur.ResourceVersion, n)
		if !isRace(err) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("%s lease %s: %w", verb, l.key, err)
	}
	return nil
}
