package soak

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
)

// blackouts measures each step's longest outage of every attachment that
// should have answered throughout it, against the step's bound.
func (r *runner) blackouts(steps []Step, windows map[int]Window) {
	defer func() {
		slices.SortStableFunc(r.report.Longest, func(a, b Outage) int { return cmp.Compare(b.Length, a.Length) })
	}()
	// An attachment counts as reachable from its first answer after it
	// was started or reported available: the time it takes to get there
	// is a create's or a flip's, not a blackout of whatever runs next.
	for key, h := range r.reachable {
		var adj []change
		for i, c := range h {
			if c.val == "true" {
				until := time.Now()
				if i+1 < len(h) {
					until = h[i+1].at
				}
				first := r.pingers[key].StatsBetween(c.at, until).FirstReply
				if first.IsZero() {
					continue
				}
				c.at = first
			}
			adj = append(adj, c)
		}
		r.reachable[key] = adj
	}
	measured := map[int]Window{}
	for i, w := range windows {
		measured[i] = Window{From: w.From, To: w.To.Add(SettleTime)}
	}
	for i, s := range steps {
		w, ok := measured[i]
		if !ok || s.End {
			continue
		}
		for _, a := range r.topo.Attachments {
			key := a.Key()
			if !r.reachableThroughout(key, w) {
				continue
			}
			bound, bounded := BlackoutBound(r.topo, steps, measured, i, key)
			if !bounded {
				continue
			}
			st := r.pingers[key].StatsBetween(w.From, w.To)
			out := st.LongestOutage
			r.report.Blackouts[s.Kind] = append(r.report.Blackouts[s.Kind], out)
			if out >= time.Second {
				// The outage begins after the last reply before the longest gap.
				from := st.LongestGapFrom
				if from.IsZero() {
					from = w.From
				}
				r.report.Longest = append(r.report.Longest, Outage{Step: s, Key: key, Length: out, Bound: bound, StartAt: from.Sub(r.start)})
			}
			if out > bound {
				r.checker.FailStep(s.Seq, w.From, "blackout", "%s: %s unreachable for %s, bound %s", s, key, out.Round(time.Millisecond), bound)
			}
		}
	}
	for _, p := range r.pingers {
		st := p.StatsBetween(r.start, time.Now())
		r.report.PingsSent += st.Sent
		r.report.PingsLost += st.Lost
	}
	r.report.Own, r.report.Strangers = r.canary.counts()
	for vpc, n := range r.report.Strangers {
		if n > 0 {
			r.checker.Fail(time.Now(), "isolation", "the %s canary received %d probes from another VPC", vpc, n)
		}
	}
	for _, vpc := range []string{"blue", "red"} {
		if r.report.Own[vpc] == 0 {
			r.checker.Fail(time.Now(), "isolation", "the %s canary received no probe of its own VPC: the check saw nothing", vpc)
		}
	}
}

func (r *runner) records(n *node) []RecordView {
	recs, _ := state.NewStore(n.Settings.StateDir).List()
	var out []RecordView
	for _, rec := range recs {
		out = append(out, RecordView{ContainerID: rec.ContainerID, HostInterface: rec.HostInterface, Live: live(rec.Netns)})
	}
	return out
}

func (r *runner) hostInterfaces(n *node) []string {
	var out []string
	_ = n.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			name := l.Attrs().Name
			if names.IsHostInterface("veth", name) || names.IsHostInterface("tap", name) {
				out = append(out, name)
			}
		}
		return err
	})
	return out
}

// quietCheck waits (up to a minute) until nothing has leaked, then
// records what still has.
func (r *runner) quietCheck() {
	var problems []string
	err := r.until(time.Minute, "nothing leaked", func() error {
		v := QuietView{Snapshot: r.snapshot(), Advertisements: map[string]int{}, HolderLive: map[string]bool{},
			Records: map[string][]RecordView{}, Devices: map[string][]string{}}
		for _, obj := range r.advInf.GetStore().List() {
			adv := obj.(*v1alpha1.BGPAdvertisement)
			v.Advertisements[adv.Name] = len(adv.Spec.Containers)
		}
		r.mu.Lock()
		alive := map[string]bool{}
		for _, in := range r.inst {
			alive[in.node+"/"+harness.ContainerID(in.netns.Path)] = live(in.netns.Path)
		}
		r.mu.Unlock()
		for key, l := range v.Leases {
			if l.Holder != "" {
				v.HolderLive[key] = alive[l.Holder]
			}
		}
		for _, name := range r.topo.Nodes {
			v.Records[name] = r.records(r.nodes[name])
			v.Devices[name] = r.hostInterfaces(r.nodes[name])
		}
		problems = r.checker.QuietProblems(v)
		if len(problems) > 0 {
			return errorList(problems)
		}
		return nil
	})
	if err != nil {
		for _, p := range problems {
			r.checker.Fail(time.Now(), "leak", "%s", p)
		}
	}
	r.say("quiet: %d leaks", len(problems))
}

// emptyCheck deletes every workload and waits (up to a minute) until
// nothing of galactic is left.
func (r *runner) emptyCheck(judge bool) {
	r.mu.Lock()
	var all []*instance
	for _, in := range r.inst {
		all = append(all, in)
	}
	for _, in := range r.extra {
		all = append(all, in)
	}
	r.inst, r.extra = map[string]*instance{}, map[string]*instance{}
	r.mu.Unlock()
	for _, in := range all {
		if err := r.del(in); err != nil {
			r.checker.Fail(time.Now(), "cleanup", "%v", err)
		}
	}
	for _, a := range statics {
		ns := r.staticNs[a.VPC+"/"+a.Name]
		if _, err := r.nodes["node-c"].CNITool("del", network(a), ns, "eth0"); err != nil {
			r.checker.Fail(time.Now(), "cleanup", "%v", err)
		}
	}
	if !judge {
		return
	}
	var problems []string
	ctx := context.Background()
	err := r.until(time.Minute, "nothing of galactic left", func() error {
		v := EmptyView{Records: map[string][]RecordView{}, Leftovers: map[string][]string{}}
		ads, err := r.env.API.BGPAdvertisements(harness.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, a := range ads.Items {
			v.Advertisements = append(v.Advertisements, a.Name)
		}
		leases, err := r.env.API.Leases(harness.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, l := range leases.Items {
			if isHandoffLease(&l) && heldLease(&l) {
				v.HeldLeases = append(v.HeldLeases, l.Name)
			}
		}
		for _, name := range r.topo.Nodes {
			if recs := r.records(r.nodes[name]); len(recs) > 0 {
				v.Records[name] = recs
			}
			left, err := r.nodes[name].Leftovers()
			if err != nil {
				return err
			}
			if len(left) > 0 {
				v.Leftovers[name] = left
			}
		}
		problems = EmptyProblems(v)
		if len(problems) > 0 {
			return errorList(problems)
		}
		return nil
	})
	if err != nil {
		for _, p := range problems {
			r.checker.Fail(time.Now(), "leak after delete", "%s", p)
		}
		if len(problems) == 0 {
			r.checker.Fail(time.Now(), "leak after delete", "%v", err)
		}
	}
	r.say("empty: %d leftovers", len(problems))
}

func heldLease(l *coordinationv1.Lease) bool {
	return handoff.RecordFromSpec(l.Spec).HolderIdentity != ""
}

type errorList []string

func (e errorList) Error() string { return strings.Join(e, "; ") }
