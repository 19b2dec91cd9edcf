package soak

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/router/dataplane"
)

func live(netnsPath string) bool {
	if netnsPath == "" {
		return false
	}
	_, err := os.Stat(netnsPath)
	return err == nil
}

// snapshot samples the API caches and every up node's kernel.
func (r *runner) snapshot() Snapshot {
	s := Snapshot{At: time.Now(), Leases: map[string]LeaseView{}, Routes: map[RouteKey]string{}}
	byLease := map[string]string{}
	for _, a := range r.topo.Attachments {
		byLease[names.Lease(r.dataplane(a))] = a.Key()
	}
	for _, obj := range r.lInf.GetStore().List() {
		l := obj.(*coordinationv1.Lease)
		key, ok := byLease[l.Name]
		if !ok {
			continue
		}
		rec := handoff.RecordFromSpec(l.Spec)
		v := LeaseView{Holder: rec.HolderIdentity, Token: int64(rec.LeaseTransitions)}
		if v.Holder != "" {
			st, _, _ := handoff.Availability(l, v.Holder, v.Token)
			v.Available = st == metav1.ConditionTrue
		}
		s.Leases[key] = v
	}
	ads := r.advInf.GetStore().List()
	for _, obj := range ads {
		adv := obj.(*v1alpha1.BGPAdvertisement)
		key, ok := byLease[names.Lease(adv.Spec.VPC, adv.Spec.Attachment)]
		if !ok {
			continue
		}
		for _, e := range adv.Spec.Containers {
			s.Entries = append(s.Entries, EntryView{Key: key, Node: adv.Spec.Node, ContainerID: e.ContainerID,
				Generation: e.HolderGeneration, Live: live(e.Netns), Standby: e.Standby})
		}
	}
	for _, name := range r.topo.Nodes {
		recs, _ := state.NewStore(r.nodes[name].Settings.StateDir).List()
		for _, rec := range recs {
			if key, ok := byLease[names.Lease(rec.VPC, rec.Attachment)]; ok && rec.Holder != "" {
				s.Records = append(s.Records, EntryView{Key: key, Node: name, ContainerID: rec.ContainerID, Generation: rec.HolderGeneration, Live: live(rec.Netns)})
			}
		}
	}
	for _, n := range r.upNodes() {
		for rk, via := range r.remoteRoutes(n) {
			s.Routes[rk] = via
		}
	}
	s.Claims = r.claims(ads)
	return s
}

// remoteRoutes are galactic-router's routes on n for the attachments'
// prefixes, for each VPC with a routing domain on n.
func (r *runner) remoteRoutes(n *node) map[RouteKey]string {
	out := map[RouteKey]string{}
	_ = n.Do(func() error {
		var vpcs []string
		for _, a := range r.topo.Attachments {
			if !slices.Contains(vpcs, a.VPC) {
				vpcs = append(vpcs, a.VPC)
			}
		}
		for _, vpc := range vpcs {
			dom, err := routing.Find(r.dpVPC[vpc])
			if err != nil || dom == nil {
				continue
			}
			routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: dom.Table}, netlink.RT_FILTER_TABLE)
			if err != nil {
				continue
			}
			for _, a := range r.topo.Attachments {
				if a.VPC != vpc {
					continue
				}
				rk := RouteKey{Observer: n.Name, Key: a.Key()}
				out[rk] = ""
				want := netip.PrefixFrom(addrOf(a), 32)
				for _, rt := range routes {
					p, ok := routing.PrefixOf(rt.Dst)
					if !ok || p != want || int(rt.Protocol) != dataplane.Protocol || rt.Type == unix.RTN_UNREACHABLE {
						continue
					}
					gw, _ := netip.AddrFromSlice(rt.Gw)
					via := r.byUL[gw.Unmap().String()]
					if via == "" {
						via = "?" + gw.String()
					}
					out[rk] = via
				}
			}
		}
		return nil
	})
	return out
}

// upNodes are the nodes that are not crashed now, in the topology's order.
func (r *runner) upNodes() []*node {
	r.mu.Lock()
	defer r.mu.Unlock()
	var up []*node
	for _, name := range r.topo.Nodes {
		if n := r.nodes[name]; !n.down {
			up = append(up, n)
		}
	}
	return up
}

// observe starts the checkers (every 100 ms), the canary probes and the
// resource sampler; the returned func stops them.
func (r *runner) observe() func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	every(&wg, stop, sampleEvery, false, func() {
		s := r.snapshot()
		r.mu.Lock()
		r.checker.Observe(s)
		r.trace.note(s)
		r.mu.Unlock()
	})
	every(&wg, stop, probeEvery, false, func() {
		r.mu.Lock()
		var senders []*instance
		for _, in := range r.inst {
			// A guest's container holds no interface of it.
			if in.vm == nil {
				senders = append(senders, in)
			}
		}
		r.mu.Unlock()
		for _, in := range senders {
			probe(in.a.VPC, in.netns)
		}
	})
	every(&wg, stop, 5*time.Second, true, r.sampleResources)
	return func() { close(stop); wg.Wait() }
}

// every runs fn in a goroutine of wg every interval until stop is closed,
// and once at the start too when now is set.
func every(wg *sync.WaitGroup, stop <-chan struct{}, interval time.Duration, now bool, fn func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		if now {
			fn()
		}
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			fn()
		}
	}()
}

func (r *runner) sampleResources() {
	at := time.Since(r.start)
	for _, name := range r.topo.Nodes {
		n := r.nodes[name]
		for _, p := range []struct {
			what string
			pid  int
		}{{"galactic-router", n.router.Pid()}, {"galactic-gc", n.gc.Pid()}} {
			if st, ok := harnessProc(p.pid); ok {
				r.mu.Lock()
				r.report.Resources = append(r.report.Resources, Resource{At: at, Process: name + " " + p.what, RSSKiB: st.RSSKiB, Threads: st.Threads, FDs: st.FDs})
				r.mu.Unlock()
			}
		}
	}
}

// setReachable notes whether key should answer its client from now.
func (r *runner) setReachable(key string, ok bool) {
	v := fmt.Sprint(ok)
	h := r.reachable[key]
	if len(h) == 0 || h[len(h)-1].val != v {
		r.reachable[key] = append(h, change{time.Now(), v})
	}
}

func (r *runner) reachableAt(key string, t time.Time) bool {
	v := false
	for _, c := range r.reachable[key] {
		if c.at.After(t) {
			break
		}
		v = c.val == "true"
	}
	return v
}

// reachableThroughout: reachable at the window's start and end.
func (r *runner) reachableThroughout(key string, w Window) bool {
	return r.reachableAt(key, w.From) && r.reachableAt(key, w.To)
}
