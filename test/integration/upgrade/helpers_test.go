package upgrade

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/tap"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

const (
	vpc    = "up"
	ifName = "net0"
	// hangGuard bounds waits that only end when something happens, so a
	// broken build fails instead of hanging; it is never a speed limit.
	hangGuard = 2 * time.Minute
)

var addresses = []string{"10.40.0.5/24", "fd40::5/64"}

// newAttachment is the attachment of one test: tap, table routing (this
// kernel has no VRF), handoff on with waitSeconds and leaseSeconds, then
// galactic-bgp. Its lease and advertisements go when the test ends (the
// API server is shared by the package).
func newAttachment(t *testing.T, env *harness.Env, name string, waitSeconds, leaseSeconds int) harness.Attachment {
	t.Helper()
	env.ForgetAttachment(t, vpc, name)
	return harness.Attachment{VPC: vpc, Name: name, Mode: names.ModeTap, Addresses: addresses,
		Handoff: &harness.Handoff{WaitSeconds: waitSeconds, LeaseSeconds: leaseSeconds}}
}

// onlyAdvertisement returns the attachment's single advertisement and
// fails unless it is node's with exactly one entry, that of container c.
func onlyAdvertisement(t *testing.T, env *harness.Env, a harness.Attachment, node *harness.Node, c *harness.Netns) v1alpha1.BGPAdvertisement {
	t.Helper()
	advs := env.Advertisements(t, vpc, a.Name)
	adv, ok := advs[node.Name]
	if !ok || len(advs) != 1 {
		t.Fatalf("want only %s's advertisement, have those of %v", node.Name, nodesOf(advs))
	}
	if len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != harness.ContainerID(c.Path) {
		t.Fatalf("want one entry, of container %s, in %s; have %+v", harness.ContainerID(c.Path), adv.Name, adv.Spec.Containers)
	}
	return adv
}

func nodesOf(advs map[string]v1alpha1.BGPAdvertisement) []string {
	var out []string
	for n := range advs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// checkCurrentHolder checks that c on node holds the lease and that its
// advertisement entry carries the lease's token as holderGeneration; it
// returns the token.
func checkCurrentHolder(t *testing.T, env *harness.Env, a harness.Attachment, node *harness.Node, c *harness.Netns) int64 {
	t.Helper()
	l := env.Lease(t, a.LeaseName())
	if got, want := harness.LeaseHolder(l), node.HolderOf(c); got != want {
		t.Fatalf("lease holder %q, want %q", got, want)
	}
	adv := onlyAdvertisement(t, env, a, node, c)
	if got := adv.Spec.Containers[0].HolderGeneration; got != harness.LeaseToken(l) {
		t.Fatalf("advertisement entry holderGeneration %d, the lease's leaseTransitions %d", got, harness.LeaseToken(l))
	}
	return harness.LeaseToken(l)
}

// tapAddresses returns the global addresses on node's tap, sorted.
func tapAddresses(t *testing.T, a harness.Attachment, node *harness.Node) []string {
	t.Helper()
	var out []string
	err := node.Do(func() error {
		l, err := netlink.LinkByName(a.HostIf())
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, ad := range addrs {
			// Link-local addresses follow the tap's MAC, which is new with each tap.
			if ad.Scope == unix.RT_SCOPE_UNIVERSE {
				p, _ := netip.AddrFromSlice(ad.IP)
				bits, _ := ad.Mask.Size()
				out = append(out, netip.PrefixFrom(p.Unmap(), bits).String())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("addresses of %s on %s: %v", a.HostIf(), node.Name, err)
	}
	slices.Sort(out)
	return out
}

// checkNothingOn fails if anything of the attachment is left on node: a tap or
// a record.
func checkNothingOn(t *testing.T, a harness.Attachment, node *harness.Node) {
	t.Helper()
	if _, ok := node.InspectTap(t, a.HostIf()); ok {
		t.Errorf("%s: tap %s is still there", node.Name, a.HostIf())
	}
	if recs := node.Records(t); len(recs) != 0 {
		t.Errorf("%s: records left: %+v", node.Name, recs)
	}
}

// leaseWatch records every version of the lease a client-go watch delivers.
type leaseWatch struct {
	w    watch.Interface
	done chan struct{}

	mu       sync.Mutex
	versions []leaseVersion
	problem  error
	// freeChecks counts the free versions during which every node was
	// inspected; tapsWhileFree lists those where a node had the tap.
	freeChecks    int
	tapsWhileFree []string
	checkErr      error
}

type leaseVersion struct {
	resourceVersion string
	holder          string
	token           int64
}

// watchLease starts a watch on the attachment's lease; its first event is
// the lease as it is now. Whenever it sees the lease free, it inspects the
// nodes for the attachment's tap: a DEL removes the tap before it releases
// and an ADD acquires before it creates one, so a free lease means no tap.
// An inspection counts only if the lease is still that free version after
// it, since the watch delivers each version a little late.
func watchLease(t *testing.T, env *harness.Env, a harness.Attachment, nodes ...*harness.Node) *leaseWatch {
	t.Helper()
	w, err := env.API.Leases(harness.Namespace).Watch(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", a.LeaseName()).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	lw := &leaseWatch{w: w, done: make(chan struct{})}
	go func() {
		defer close(lw.done)
		for ev := range w.ResultChan() {
			lw.mu.Lock()
			switch l, ok := ev.Object.(*coordinationv1.Lease); {
			case !ok || ev.Type == watch.Error:
				lw.problem = errors.Join(lw.problem, apierrors.FromObject(ev.Object))
			case ev.Type == watch.Deleted:
				lw.problem = errors.Join(lw.problem, errors.New("the lease was deleted"))
			default:
				lw.versions = append(lw.versions, leaseVersion{l.ResourceVersion, harness.LeaseHolder(l), harness.LeaseToken(l)})
			}
			lw.mu.Unlock()
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && ev.Type != watch.Deleted && harness.LeaseHolder(l) == "" && len(nodes) > 0 {
				lw.checkFree(env, a, l.ResourceVersion, nodes)
			}
		}
	}()
	t.Cleanup(w.Stop)
	return lw
}

func (lw *leaseWatch) checkFree(env *harness.Env, a harness.Attachment, rv string, nodes []*harness.Node) {
	var with []string
	var errs []error
	for _, n := range nodes {
		err := n.Do(func() error {
			_, ok, err := tap.Inspect(a.HostIf())
			if ok {
				with = append(with, n.Name)
			}
			return err
		})
		errs = append(errs, err)
	}
	cur, err := env.API.Leases(harness.Namespace).Get(context.Background(), a.LeaseName(), metav1.GetOptions{})
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if err := errors.Join(append(errs, err)...); err != nil {
		lw.checkErr = errors.Join(lw.checkErr, err)
		return
	}
	if cur.ResourceVersion != rv {
		return
	}
	lw.freeChecks++
	if len(with) > 0 {
		lw.tapsWhileFree = append(lw.tapsWhileFree, fmt.Sprintf("lease version %s is free while %v have the tap", rv, with))
	}
}

// stop waits until the watch has delivered the lease's current version,
// ends it and returns what it saw.
func (lw *leaseWatch) stop(t *testing.T, env *harness.Env, a harness.Attachment) []leaseVersion {
	t.Helper()
	want := env.Lease(t, a.LeaseName()).ResourceVersion
	harness.Eventually(t, hangGuard, "the watch to deliver lease version "+want, func() error {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		if len(lw.versions) > 0 && lw.versions[len(lw.versions)-1].resourceVersion == want || lw.problem != nil {
			return nil
		}
		return fmt.Errorf("%d versions seen", len(lw.versions))
	})
	lw.mu.Lock()
	vs, problem := slices.Clone(lw.versions), lw.problem
	lw.mu.Unlock()
	// Stopping closes the stream, which the watch may report as an error.
	lw.w.Stop()
	<-lw.done
	if err := errors.Join(problem, lw.checkErr); err != nil {
		t.Fatalf("lease watch: %v", err)
	}
	for _, e := range lw.tapsWhileFree {
		t.Error(e)
	}
	if lw.freeChecks > 0 {
		t.Logf("free lease versions checked for taps: %d", lw.freeChecks)
	}
	return vs
}

// holders is the sequence of holders the versions show, each change once.
func holders(vs []leaseVersion) []string {
	var out []string
	for _, v := range vs {
		if len(out) == 0 || out[len(out)-1] != v.holder {
			out = append(out, v.holder)
		}
	}
	return out
}

// checkNoDirectHandover fails where the lease went from one holder
// straight to another without being free in between.
func checkNoDirectHandover(t *testing.T, vs []leaseVersion) {
	t.Helper()
	hs := holders(vs)
	for i := 1; i < len(hs); i++ {
		if hs[i-1] != "" && hs[i] != "" {
			t.Errorf("the lease passed straight from %q to %q; holders seen: %q", hs[i-1], hs[i], hs)
		}
	}
}

// tapSampler inspects the attachment's tap on two nodes over and over and
// counts the samples in which both nodes had it (and both had it held).
// Each sample reads one node, the other, then the first again, and counts
// only when the first node's tap is the same device at both reads: the
// reads are not simultaneous, so the sandwich is what places both taps at
// one moment.
type tapSampler struct {
	stopc chan struct{}
	done  chan struct{}

	samples, bothPresent, bothHeld int
	err                            error
}

func sampleTaps(t *testing.T, a harness.Attachment, first, second *harness.Node) *tapSampler {
	s := &tapSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	inspect := func(node *harness.Node) (st tap.Status, ok bool, err error) {
		err = node.Do(func() error {
			var err error
			st, ok, err = tap.Inspect(a.HostIf())
			return err
		})
		return st, ok, err
	}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stopc:
				return
			case <-time.After(25 * time.Millisecond):
			}
			f1, ok1, err1 := inspect(first)
			sc, ok2, err2 := inspect(second)
			f2, ok3, err3 := inspect(first)
			if err := errors.Join(err1, err2, err3); err != nil {
				s.err = err
				return
			}
			s.samples++
			if !ok1 || !ok2 || !ok3 || f1.Index != f2.Index {
				continue
			}
			s.bothPresent++
			if f1.Held() && sc.Held() && f2.Held() {
				s.bothHeld++
			}
		}
	}()
	t.Cleanup(s.end)
	return s
}

func (s *tapSampler) end() {
	select {
	case <-s.stopc:
	default:
		close(s.stopc)
	}
	<-s.done
}

// check stops the sampler and fails if a tap was ever on both nodes.
func (s *tapSampler) check(t *testing.T) {
	t.Helper()
	s.end()
	if s.err != nil {
		t.Fatalf("sampling taps: %v", s.err)
	}
	if s.bothHeld > 0 {
		t.Errorf("in %d of %d samples a VMM held the tap on both nodes", s.bothHeld, s.samples)
	}
	if s.bothPresent > 0 {
		t.Errorf("in %d of %d samples the tap existed on both nodes", s.bothPresent, s.samples)
	}
	t.Logf("tap samples on both nodes: %d", s.samples)
}
