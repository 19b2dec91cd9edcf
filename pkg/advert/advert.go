package advert

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/liveness"
	"github.com/galactic-cni/galactic/pkg/names"
)

// API is the part of the typed BGPAdvertisement client (one namespace)
// this package uses; client.Clients.BGPAdvertisements(ns) satisfies it.
type API interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1alpha1.BGPAdvertisement, error)
	List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.BGPAdvertisementList, error)
	Create(ctx context.Context, obj *v1alpha1.BGPAdvertisement, opts metav1.CreateOptions) (*v1alpha1.BGPAdvertisement, error)
	Update(ctx context.Context, obj *v1alpha1.BGPAdvertisement, opts metav1.UpdateOptions) (*v1alpha1.BGPAdvertisement, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// Key names one node's advertisement of an attachment. For an
// object-backed attachment VPC and Attachment are its data-plane names and
// Namespace and UID its VPCAttachment's: the advertisement carries them as
// labels, and one labelled with another UID is a predecessor's.
type Key struct {
	VPC, Attachment, Node string
	Namespace, UID        string
}

// Name is the advertisement's object name.
func (k Key) Name() string { return names.Advertisement(k.VPC, k.Attachment, k.Node) }

func (k Key) String() string { return k.VPC + "/" + k.Attachment + " on " + k.Node }

func (k Key) validate() error {
	if k.VPC == "" || k.Attachment == "" || k.Node == "" {
		return fmt.Errorf("advertisement key %+v: vpc, attachment and node are required", k)
	}
	if (k.UID == "") != (k.Namespace == "") {
		return fmt.Errorf("advertisement key %+v: an attachment's identity needs namespace and UID", k)
	}
	return nil
}

// Outcome says what an operation did to one advertisement.
type Outcome string

const (
	Created   Outcome = "created"
	Updated   Outcome = "updated"
	Deleted   Outcome = "deleted"
	Unchanged Outcome = "unchanged" // read, nothing to write
	Absent    Outcome = "absent"    // no such advertisement, nothing written
	Skipped   Outcome = "skipped"   // not this node's advertisement
)

// Result reports one operation on one advertisement.
type Result struct {
	Name    string
	Outcome Outcome
	// Removed are the entries this operation dropped: released, not valid,
	// or pruned because their netns is gone.
	Removed []v1alpha1.ContainerEntry
	// Conflicts is how many times a guarded write lost a race and the
	// object was re-read.
	Conflicts int
}

// Backoff spaces the attempts after a conflict or a transient error:
// Initial, then doubling up to Max, each with up to 50% random jitter so
// racing writers spread out.
type Backoff struct {
	Initial, Max time.Duration
}

// DefaultBackoff suits a handful of writers on one node.
var DefaultBackoff = Backoff{Initial: 10 * time.Millisecond, Max: 500 * time.Millisecond}

// Advertiser performs guarded operations on advertisements. The zero
// values of Live, Backoff and Sleep mean liveness.Netns, DefaultBackoff and
// a timer. It is safe for concurrent use.
type Advertiser struct {
	API API
	// Live reports whether an entry's netns still exists.
	Live func(netns string) bool
	// Backoff spaces retries.
	Backoff Backoff
	// Sleep waits d or until ctx ends; tests make it instant.
	Sleep func(ctx context.Context, d time.Duration) error

	conflicts atomic.Int64
}

// New returns an Advertiser over api with the default liveness, backoff and sleep.
func New(api API) *Advertiser { return &Advertiser{API: api} }

// Conflicts is the number of conflicts retried since the Advertiser was made.
func (a *Advertiser) Conflicts() int64 { return a.conflicts.Load() }

func (a *Advertiser) live(netns string) bool {
	if a.Live != nil {
		return a.Live(netns)
	}
	return liveness.Netns(netns)
}

// errRaced marks a write that lost to another writer in a way the API
// does not report as a conflict: a create of an object that now exists, or
// an update of an object deleted since it was read.
var errRaced = errors.New("the advertisement changed since it was read")

func raced(err error) error { return fmt.Errorf("%w: %w", errRaced, err) }

func isConflict(err error) bool {
	return errors.Is(err, errRaced) || apierrors.IsConflict(err)
}

// transient reports whether retrying err may help: a failure to reach the
// API server, or one of its own "try again" answers. Anything else (our own
// refusals, forbidden, invalid) is final.
func transient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err)
	}
	var urlErr *url.Error
	var netErr net.Error
	return errors.As(err, &urlErr) || errors.As(err, &netErr) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// retry runs step until it succeeds, fails with an error retrying cannot
// fix, or ctx ends. Each step re-reads what it writes, so every attempt
// carries a fresh resourceVersion.
func (a *Advertiser) retry(ctx context.Context, res *Result, step func() error) error {
	b := a.Backoff
	if b.Initial <= 0 {
		b = DefaultBackoff
	}
	delay := b.Initial
	for {
		err := step()
		if err == nil {
			return nil
		}
		conflict := isConflict(err)
		if !conflict && !transient(err) {
			return err
		}
		if conflict {
			res.Conflicts++
			a.conflicts.Add(1)
		}
		wait := delay/2 + rand.N(delay/2+1)
		if werr := a.sleep(ctx, wait); werr != nil {
			return fmt.Errorf("%w (gave up retrying: %w)", err, werr)
		}
		delay = min(2*delay, b.Max)
	}
}

func (a *Advertiser) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if a.Sleep != nil {
		return a.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Routing is how the advertisement is to be routed: the stanza's vni and
// announce, which the latest ADD sets for the whole advertisement.
type Routing struct {
	VNI      int32
	Announce v1alpha1.Announce
}

// Publish upserts e, keyed by (containerID, ifName), in k's advertisement,
// creating it if needed, sets spec.vni and spec.announce from r, and drops
// other entries whose netns is gone, and for an object-backed k those of
// another attachment UID. spec.prefixes becomes the union of the
// entries' prefixes. An entry that is already published as e with nothing
// to prune costs one read and no write.
func (a *Advertiser) Publish(ctx context.Context, k Key, e v1alpha1.ContainerEntry, r Routing) (Result, error) {
	return a.publish(ctx, k, e, r, false)
}

// PublishNew is Publish for an entry whose advertisement is not expected
// to exist, such as the handoff lease holder's, the attachment's only
// runtime: it creates the advertisement without reading it first, and
// reads and updates only when one exists.
func (a *Advertiser) PublishNew(ctx context.Context, k Key, e v1alpha1.ContainerEntry, r Routing) (Result, error) {
	return a.publish(ctx, k, e, r, true)
}

func (a *Advertiser) publish(ctx context.Context, k Key, e v1alpha1.ContainerEntry, r Routing, createFirst bool) (Result, error) {
	res := Result{Name: k.Name()}
	if err := k.validate(); err != nil {
		return res, err
	}
	if e.ContainerID == "" || e.IfName == "" {
		return res, fmt.Errorf("entry for %s: containerID and ifName are required", k)
	}
	e = *e.DeepCopy()
	e.Prefixes = SortPrefixes(e.Prefixes)
	create := func() error {
		obj := newAdvertisement(k, []v1alpha1.ContainerEntry{e})
		obj.Spec.VNI, obj.Spec.Announce = r.VNI, r.Announce
		_, err := a.API.Create(ctx, obj, metav1.CreateOptions{})
		if err == nil {
			res.Outcome = Created
		}
		return err
	}
	if createFirst {
		err := create()
		if err == nil || !apierrors.IsAlreadyExists(err) && !transient(err) {
			return res, wrap(err, "publishing %s/%s in %s", e.ContainerID, e.IfName, res.Name)
		}
	}
	err := a.retry(ctx, &res, func() error {
		res.Removed = nil
		cur, err := a.API.Get(ctx, res.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if err := create(); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return raced(err)
				}
				return err
			}
			return nil
		}
		if err != nil {
			return err
		}
		if err := owned(cur, k); err != nil {
			return err
		}
		var kept []v1alpha1.ContainerEntry
		for _, c := range cur.Spec.Containers {
			switch {
			case sameEntry(c, e.ContainerID, e.IfName):
			case !a.live(c.Netns), !k.entryOf(c):
				res.Removed = append(res.Removed, c)
			default:
				kept = append(kept, c)
			}
		}
		next := withEntries(cur, k, append(kept, e))
		next.Spec.VNI, next.Spec.Announce = r.VNI, r.Announce
		if unchanged(cur, next) {
			res.Outcome = Unchanged
			return nil
		}
		if err := a.update(ctx, next); err != nil {
			return err
		}
		res.Outcome = Updated
		return nil
	})
	return res, wrap(err, "publishing %s/%s in %s", e.ContainerID, e.IfName, res.Name)
}

// Release removes the entries of (containerID, ifName) from k's
// advertisement. The advertisement is deleted once no remaining entry is
// live, and updated otherwise. No advertisement, or no such entry, is
// success with no write.
func (a *Advertiser) Release(ctx context.Context, k Key, containerID, ifName string) (Result, error) {
	res, err := a.Remove(ctx, k, func(c v1alpha1.ContainerEntry) bool { return sameEntry(c, containerID, ifName) })
	return res, wrap(err, "releasing %s/%s", containerID, ifName)
}

// getOwned reads k's advertisement and checks that it is k's. A missing
// one is nil with res Absent; any error is nil with the error.
func (a *Advertiser) getOwned(ctx context.Context, k Key, res *Result) (*v1alpha1.BGPAdvertisement, error) {
	cur, err := a.API.Get(ctx, res.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		res.Outcome = Absent
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := owned(cur, k); err != nil {
		return nil, err
	}
	return cur, nil
}

// Remove drops the entries of k's advertisement for which drop is true,
// with Release's rules: delete once nothing live remains, write nothing
// when nothing matches.
func (a *Advertiser) Remove(ctx context.Context, k Key, drop func(v1alpha1.ContainerEntry) bool) (Result, error) {
	res := Result{Name: k.Name()}
	if err := k.validate(); err != nil {
		return res, err
	}
	err := a.retry(ctx, &res, func() error {
		res.Removed = nil
		cur, err := a.getOwned(ctx, k, &res)
		if cur == nil {
			return err
		}
		var kept []v1alpha1.ContainerEntry
		for _, c := range cur.Spec.Containers {
			if drop(c) {
				res.Removed = append(res.Removed, c)
			} else {
				kept = append(kept, c)
			}
		}
		if len(res.Removed) == 0 {
			res.Outcome = Unchanged
			return nil
		}
		res.Outcome, err = a.keepOrDelete(ctx, cur, k, kept)
		return err
	})
	return res, wrap(err, "removing entries from %s", res.Name)
}

// Prune drops the dead entries of node's advertisements in items (as
// listed with names.NodeSelector(node)) and deletes those left without a
// live entry. The first attempt on each uses the listed object, so an
// advertisement with nothing to prune costs no request; a conflict
// re-reads it. Advertisements of other nodes are skipped: their netns
// paths mean nothing here. Prune continues past errors and returns them
// joined, with one Result per item.
func (a *Advertiser) Prune(ctx context.Context, node string, items []v1alpha1.BGPAdvertisement) ([]Result, error) {
	var results []Result
	var errs []error
	for i := range items {
		item := &items[i]
		res := Result{Name: item.Name, Outcome: Skipped}
		if item.Spec.Node != node {
			results = append(results, res)
			continue
		}
		k := Key{VPC: item.Spec.VPC, Attachment: item.Spec.Attachment, Node: node}
		cur := item.DeepCopy()
		err := a.retry(ctx, &res, func() error {
			res.Removed = nil
			if cur == nil {
				got, err := a.API.Get(ctx, res.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					res.Outcome = Absent
					return nil
				}
				if err != nil {
					return err
				}
				if got.Spec.Node != node {
					res.Outcome = Skipped
					return nil
				}
				cur = got
			}
			var kept []v1alpha1.ContainerEntry
			for _, c := range cur.Spec.Containers {
				if a.live(c.Netns) {
					kept = append(kept, c)
				} else {
					res.Removed = append(res.Removed, c)
				}
			}
			if len(res.Removed) == 0 && len(kept) > 0 {
				res.Outcome = Unchanged
				return nil
			}
			outcome, err := a.keepOrDelete(ctx, cur, k, kept)
			if err != nil {
				cur = nil // re-read on the next attempt
				return err
			}
			res.Outcome = outcome
			return nil
		})
		results = append(results, res)
		if err != nil {
			errs = append(errs, wrap(err, "pruning %s", res.Name))
		}
	}
	return results, errors.Join(errs...)
}

// DeleteOthers deletes the advertisements of k's attachment on nodes other
// than k.Node: the leftovers of a predecessor whose DEL never ran. It costs
// one list when there are none. Each delete carries the listed object's UID
// and resourceVersion, so an advertisement written since (by a node that
// is evidently alive) is left alone and reported in the error, not retried.
// It returns the names deleted.
func (a *Advertiser) DeleteOthers(ctx context.Context, k Key) ([]string, error) {
	if err := k.validate(); err != nil {
		return nil, err
	}
	list, err := a.API.List(ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(k.VPC, k.Attachment)})
	if err != nil {
		return nil, wrap(err, "listing the advertisements of %s/%s", k.VPC, k.Attachment)
	}
	var deleted []string
	var errs []error
	for _, item := range list.Items {
		// The labels selected it; the spec must agree before anything is
		// deleted, and a predecessor's (another UID) is not ours to delete.
		if item.Spec.VPC != k.VPC || item.Spec.Attachment != k.Attachment || item.Spec.Node == k.Node || item.Name == k.Name() || !k.labelledFor(item.Labels) {
			continue
		}
		err := a.API.Delete(ctx, item.Name, metav1.DeleteOptions{Preconditions: preconditions(&item)})
		switch {
		case err == nil:
			deleted = append(deleted, item.Name)
		case apierrors.IsNotFound(err):
		default:
			errs = append(errs, fmt.Errorf("deleting %s (node %s): %w", item.Name, item.Spec.Node, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// keepOrDelete writes kept as cur's entries, or deletes cur when no kept
// entry is live. Both carry cur's resourceVersion.
func (a *Advertiser) keepOrDelete(ctx context.Context, cur *v1alpha1.BGPAdvertisement, k Key, kept []v1alpha1.ContainerEntry) (Outcome, error) {
	if !slices.ContainsFunc(kept, func(c v1alpha1.ContainerEntry) bool { return a.live(c.Netns) }) {
		err := a.API.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: preconditions(cur)})
		if apierrors.IsNotFound(err) {
			// Someone else deleted it first; re-read to be sure it is gone
			// and not recreated with entries of its own.
			return "", raced(err)
		}
		if err != nil {
			return "", err
		}
		return Deleted, nil
	}
	if err := a.update(ctx, withEntries(cur, k, kept)); err != nil {
		return "", err
	}
	return Updated, nil
}

func (a *Advertiser) update(ctx context.Context, next *v1alpha1.BGPAdvertisement) error {
	_, err := a.API.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return raced(err)
	}
	return err
}

func preconditions(obj *v1alpha1.BGPAdvertisement) *metav1.Preconditions {
	uid, rv := obj.UID, obj.ResourceVersion
	return &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}
}

// entryOf says whether an entry may be the attachment's: for an object
// only its own UID's or an inline one's (written before it was adopted).
func (k Key) entryOf(c v1alpha1.ContainerEntry) bool {
	return k.UID == "" || c.AttachmentUID == "" || c.AttachmentUID == k.UID
}

// labelledFor says whether an advertisement's identity label allows k:
// none (inline, or written before adoption), or k's own UID.
func (k Key) labelledFor(labels map[string]string) bool {
	uid := labels[v1alpha1.LabelAttachmentUID]
	return uid == "" || uid == k.UID
}

func sameEntry(c v1alpha1.ContainerEntry, containerID, ifName string) bool {
	return c.ContainerID == containerID && c.IfName == ifName
}

// owned rejects an object whose name is k's but whose spec names another
// attachment or node; it is not ours to change.
func owned(obj *v1alpha1.BGPAdvertisement, k Key) error {
	s := obj.Spec
	if s.VPC != k.VPC || s.Attachment != k.Attachment || s.Node != k.Node {
		return fmt.Errorf("advertisement %s describes %s/%s on %s, not %s; refusing to change it", obj.Name, s.VPC, s.Attachment, s.Node, k)
	}
	if !k.labelledFor(obj.Labels) {
		return fmt.Errorf("advertisement %s belongs to attachment UID %q, not %q: a predecessor's, left to its own release; refusing to change it", obj.Name, obj.Labels[v1alpha1.LabelAttachmentUID], k.UID)
	}
	return nil
}

func newAdvertisement(k Key, entries []v1alpha1.ContainerEntry) *v1alpha1.BGPAdvertisement {
	obj := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: k.Name()},
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: k.VPC, Attachment: k.Attachment, Node: k.Node},
	}
	return withEntries(obj, k, entries)
}

// withEntries is a copy of obj with the given entries (sorted by key),
// spec.prefixes recomputed and the labels set; its resourceVersion is
// obj's, which guards the write.
func withEntries(obj *v1alpha1.BGPAdvertisement, k Key, entries []v1alpha1.ContainerEntry) *v1alpha1.BGPAdvertisement {
	next := obj.DeepCopy()
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	for lk, lv := range names.AdvertisementLabels(k.VPC, k.Attachment, k.Node) {
		next.Labels[lk] = lv
	}
	for lk, lv := range names.IdentityLabels(k.Namespace, k.UID) {
		next.Labels[lk] = lv
	}
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(x, y v1alpha1.ContainerEntry) int {
		if c := strings.Compare(x.ContainerID, y.ContainerID); c != 0 {
			return c
		}
		return strings.Compare(x.IfName, y.IfName)
	})
	next.Spec.Containers = sorted
	next.Spec.Prefixes = Union(sorted)
	return next
}

func unchanged(cur, next *v1alpha1.BGPAdvertisement) bool {
	return apiequality.Semantic.DeepEqual(cur.Labels, next.Labels) &&
		apiequality.Semantic.DeepEqual(cur.Spec, next.Spec)
}

func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
