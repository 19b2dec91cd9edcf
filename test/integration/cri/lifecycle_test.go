package cri

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// attachedState is what a running pod's attachment looks like from
// outside: its advertisement version, host interface and lease.
type attachedState struct {
	advertisementVersion string
	entries              []v1alpha1.ContainerEntry
	ifIndex              int
	lease                handoff.Record
}

func (n *criNode) attached(t *testing.T, attachment string) attachedState {
	t.Helper()
	a := n.advertisement(t, attachment)
	l := n.hostLink(t, attachment)
	if a == nil || l == nil {
		t.Fatalf("attachment %s: advertisement %v, host interface %v", attachment, a != nil, l != nil)
	}
	return attachedState{advertisementVersion: a.ResourceVersion, entries: a.Spec.Containers, ifIndex: l.Attrs().Index, lease: n.lease(t, attachment)}
}

func TestRestartingContainerdWithPodsRunningChangesNothingAndStopStillReleases(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	n.attachment(t, "web-0-net0", "10.20.0.5")
	n.attachment(t, "web-1-net0", "10.20.0.6")
	pods := map[string]string{
		"web-0-net0": n.runPod(t, "web-0", annotations("web-0-net0")),
		"web-1-net0": n.runPod(t, "web-1", annotations("web-1-net0")),
	}
	before := map[string]attachedState{}
	for att := range pods {
		before[att] = n.attached(t, att)
	}
	verbs := n.logVerbs(t)

	if err := n.ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	for att, id := range pods {
		st, err := n.ctd.InspectPod(id)
		if err != nil || st.State != "SANDBOX_READY" {
			t.Fatalf("after the restart, sandbox %s: %+v, %v", id, st, err)
		}
		after := n.attached(t, att)
		if after.advertisementVersion != before[att].advertisementVersion || after.ifIndex != before[att].ifIndex || after.lease != before[att].lease {
			t.Fatalf("attachment %s changed across the restart:\nbefore %+v\nafter  %+v", att, before[att], after)
		}
	}
	// containerd may ask STATUS again; it must not ADD, DEL or GC anything.
	now := n.logVerbs(t)
	for _, verb := range []string{"ADD", "DEL", "CHECK", "GC"} {
		if now[verb] != verbs[verb] {
			t.Fatalf("the restart ran %s: verbs before %v, after %v", verb, verbs, now)
		}
	}

	for att, id := range pods {
		n.crictl(t, "stopp", id)
		n.assertReleased(t, att)
		n.crictl(t, "rmp", id)
	}
	if m := n.podNetnsMounts(t); len(m) != 0 {
		t.Fatalf("pod netns left: %v", m)
	}
}

func TestNetworkReadyFollowsGalacticStatusWhileTheAPIServerIsUnreachable(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	ready := func(want bool) func() error {
		return func() error {
			c, err := n.ctd.NetworkReady()
			if err != nil {
				return err
			}
			if c.Status == want {
				return nil
			}
			return fmt.Errorf("%+v", c)
		}
	}
	harness.Eventually(t, time.Minute, "NetworkReady true with the API server reachable", ready(true))

	if err := n.node.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "NetworkReady false with the API server unreachable", ready(false))
	c, err := n.ctd.NetworkReady()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NetworkReady while the API server is unreachable: %+v", c)
	if !strings.Contains(c.Message, "the API server cannot be used") {
		t.Fatalf("NetworkReady's message does not carry galactic-bgp's STATUS message: %+v", c)
	}

	if err := n.node.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "NetworkReady true once the API server is back", ready(true))
}

func TestAReplacementPodStartsOnlyAfterThePredecessorStopsWithTheNextToken(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	const att = "web-0-net0"
	n.attachment(t, att, "10.20.0.5")
	dv, da := n.dataplane(t, att)
	w, err := n.env.API.Leases(harness.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + names.Lease(dv, da)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	aw, err := n.env.API.BGPAdvertisements(harness.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(dv, da)})
	if err != nil {
		t.Fatal(err)
	}
	defer aw.Stop()

	first := n.runPod(t, "web-0", annotations(att))
	token := n.lease(t, att).LeaseTransitions

	type result struct {
		id  string
		err error
	}
	second := make(chan result, 1)
	go func() {
		id, err := n.ctd.RunPod(harness.PodSpec{Name: "web-0", UID: "web-0-replacement", Annotations: annotations(att)})
		second <- result{id, err}
	}()
	// The replacement's ADD is under way and waits for the lease.
	harness.Eventually(t, time.Minute, "the replacement's galactic-cni ADD running", func() error {
		inv := cniInvocations()
		if slices.ContainsFunc(inv, func(s string) bool {
			return strings.HasPrefix(s, "galactic-cni ADD ") && !strings.HasSuffix(s, " "+first)
		}) {
			return nil
		}
		return fmt.Errorf("%v", inv)
	})
	select {
	case r := <-second:
		t.Fatalf("the replacement started while its predecessor holds the attachment: %+v", r)
	default:
	}
	if l := n.lease(t, att); l.HolderIdentity != names.Holder("node-a", first) {
		t.Fatalf("lease %+v while the first pod runs", l)
	}

	n.crictl(t, "stopp", first)
	var r result
	select {
	case r = <-second:
	case <-time.After(2 * time.Minute):
		t.Fatal("the replacement did not start within two minutes of its predecessor's stop")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	l := n.lease(t, att)
	if l.HolderIdentity != names.Holder("node-a", r.id) || l.LeaseTransitions != token+1 {
		t.Fatalf("lease %+v: want held by the replacement %s with token %d", l, r.id, token+1)
	}
	a := n.advertisement(t, att)
	if a == nil || len(a.Spec.Containers) != 1 || a.Spec.Containers[0].ContainerID != r.id || a.Spec.Containers[0].HolderGeneration != int64(token+1) {
		t.Fatalf("advertisement after the handoff: %+v", a)
	}

	// Every version of the lease and the advertisement, in order.
	var holders []string
	for last := ""; last != names.Holder("node-a", r.id); {
		ev := next(t, w)
		rec := handoff.RecordFromSpec(ev.Object.(*coordinationv1.Lease).Spec)
		if rec.HolderIdentity != last {
			holders = append(holders, rec.HolderIdentity)
		}
		last = rec.HolderIdentity
	}
	want := []string{names.Holder("node-a", first), "", names.Holder("node-a", r.id)}
	if !slices.Equal(holders, want) {
		t.Fatalf("lease holders in order %q, want %q (a release between the two holders)", holders, want)
	}
	for seen := map[string]bool{}; !seen[r.id]; {
		ev := next(t, aw)
		adv, ok := ev.Object.(*v1alpha1.BGPAdvertisement)
		if !ok {
			t.Fatalf("advertisement watch: %s %T", ev.Type, ev.Object)
		}
		ids := map[string]bool{}
		for _, e := range adv.Spec.Containers {
			ids[e.ContainerID] = true
		}
		if ev.Type != watch.Deleted && len(ids) > 1 {
			t.Fatalf("the advertisement had two holders' entries at once: %v", slices.Sorted(maps.Keys(ids)))
		}
		maps.Copy(seen, ids)
	}

	n.crictl(t, "stopp", r.id)
	n.assertReleased(t, att)
}

func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-time.After(time.Minute):
		t.Fatal("no watch event within a minute")
	}
	return watch.Event{}
}
