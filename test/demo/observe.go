package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
)

// Report is what the demo measured, step by step.
type Report struct {
	// Live is the live migration of a second VM from node-a to node-b.
	Live LiveMigration
	// Attach: replies the client got before the guest reported available,
	// how long after the report the first came, and whether the VM's IPv6
	// address was reached too.
	RepliesBeforeAvailable int
	FirstReplyAfterReport  time.Duration
	IPv6Routed             bool
	Upgrade, Move          Figures
	// Crash is node-b crashing up to node-a's takeover; ViaAtLeaseExpiry is
	// where node-c's route led when node-a's ADD took over.
	Crash            Figures
	ViaAtLeaseExpiry string
	// Return is node-b coming back after the crash.
	Return  Figures
	Restart Figures
	// Drain: replies lost before the unavailable report, how long after it
	// the last reply came, replies to requests sent after node-c's route
	// went, and whether the VM's IPv6 address still answered afterwards.
	LostBeforeDrain        int
	LastReplyAfterReport   time.Duration
	RepliesAfterWithdrawal int
	IPv6AfterDrain         bool
	// Tenants: two tenants' VPC blue with the same names and addresses.
	Tenants Tenants
}

// Figures are one step's measurements.
type Figures struct {
	Sent, Lost int
	// Blackout is the longest run of unanswered requests, from the first
	// of them to the next answer.
	Blackout time.Duration
	// Announced and Withdrawn are the updates FRR received for the VM's
	// prefix, by sending node.
	Announced, Withdrawn map[string]int
	// RouteChanges are node-c's kernel route changes for the prefix in
	// blue's table.
	RouteChanges []string
}

func (f Figures) summary() string {
	return fmt.Sprintf("%d ms blackout, %d of %d replies lost; FRR received announcements %s, withdrawals %s; node-c's route changed %d times",
		f.Blackout.Milliseconds(), f.Lost, f.Sent, counts(f.Announced), counts(f.Withdrawn), len(f.RouteChanges))
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s×%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func (r *Report) print(out io.Writer) {
	fmt.Fprintf(out, `
what the demo measured (the client on node-c pinging the VM every %s):
  0. live migration:  %s
  1. attach:          %d replies before the guest reported available; the first %d ms after the report; IPv6 routed too: %v
  2. upgrade:         %s
  3. move to node-b:  %s
  4. node-b crashes:  %s; at the lease's expiry node-c's route still led to %s
     node-b returns:  %s
  5. router restart:  %s
  6. drain:           %d replies lost before the report; the last reply %d ms after it; %d replies after node-c's route went; IPv6 answered after it: %v
  7. two tenants:     %s
`, pingInterval, r.Live.summary(), r.RepliesBeforeAvailable, r.FirstReplyAfterReport.Milliseconds(), r.IPv6Routed, r.Upgrade.summary(), r.Move.summary(),
		r.Crash.summary(), r.ViaAtLeaseExpiry, r.Return.summary(), r.Restart.summary(), r.LostBeforeDrain, r.LastReplyAfterReport.Milliseconds(), r.RepliesAfterWithdrawal, r.IPv6AfterDrain,
		r.Tenants.summary())
}

// mark is where a step's measurement starts.
type mark struct {
	at      time.Time
	log     int64
	monitor int
}

func (d *demo) mark() mark {
	return mark{at: time.Now(), log: d.fabric.LogOffset(), monitor: d.monitor.count()}
}

// figures measures since m: the pinger up to a second ago, FRR's updates,
// node-c's route changes.
func (d *demo) figures(m mark) (Figures, error) {
	st := d.pinger.StatsBetween(m.at, time.Now())
	u, err := d.fabric.CountUpdates(m.log, prefix)
	if err != nil {
		return Figures{}, err
	}
	f := Figures{Sent: st.Sent, Lost: st.Lost, Blackout: st.LongestOutage, Announced: map[string]int{}, Withdrawn: map[string]int{}}
	// Red's route for the same prefix comes from node-c and never changes
	// while the demo measures; naming nodes keeps the counts readable.
	for addr, n := range u.Announced {
		f.Announced[d.nodeName(addr)] += n
	}
	for addr, n := range u.Withdrawn {
		f.Withdrawn[d.nodeName(addr)] += n
	}
	f.RouteChanges = d.monitor.since(m.monitor)
	return f, nil
}

// settle waits until the pinger has judged every request sent so far.
func settle() { time.Sleep(1100 * time.Millisecond) }

func (d *demo) nodeName(underlay string) string {
	if n, ok := d.byUnderlay[underlay]; ok {
		return n
	}
	return underlay
}

// bluePaths are FRR's paths for the VM's prefix in VPC blue.
func (d *demo) bluePaths() ([]harness.EVPNPath, error) {
	routes, err := d.fabric.EVPNRoutes()
	if err != nil {
		return nil, err
	}
	return vpcPaths(routes[prefix], vniBlue), nil
}

// vpcPaths keeps the paths of one VPC's route target.
func vpcPaths(paths []harness.EVPNPath, vni int) []harness.EVPNPath {
	var out []harness.EVPNPath
	rt := fmt.Sprintf("RT:%d:%d", harness.FabricASN, vni)
	for _, p := range paths {
		if strings.Contains(p.Extended, rt) {
			out = append(out, p)
		}
	}
	return out
}

// drained reports whether a path carries the drain marking.
func drained(p harness.EVPNPath) bool {
	return strings.Contains(p.Large, fmt.Sprintf("%d:2:0", harness.FabricASN))
}

// routeVia is the node node-c's blue route for the prefix leads to, ""
// when there is none.
func (d *demo) routeVia() (string, string, error) {
	c := d.nodes["node-c"]
	var table int
	if err := c.Do(func() error {
		dom, err := routing.Find("blue")
		if err == nil && dom != nil {
			table = dom.Table
		}
		return err
	}); err != nil {
		return "", "", err
	}
	if table == 0 {
		return "", "", fmt.Errorf("node-c has no routing domain for blue")
	}
	out, err := c.Run("ip", "route", "show", "table", fmt.Sprint(table), prefix.String())
	if err != nil {
		return "", "", fmt.Errorf("ip route: %v %s", err, out)
	}
	out = strings.TrimSpace(out)
	f := strings.Fields(out)
	for i := range f {
		if f[i] == "via" && i+1 < len(f) {
			return d.nodeName(f[i+1]), out, nil
		}
	}
	return "", out, nil
}

// waitVia waits until node-c's blue route for the prefix leads to want
// ("" for no route).
func (d *demo) waitVia(want string, limit time.Duration) error {
	return d.until(limit, fmt.Sprintf("node-c's route for %s via %q", prefix, want), func() error {
		via, line, err := d.routeVia()
		if err != nil {
			return err
		}
		if via != want {
			return fmt.Errorf("route %q", line)
		}
		return nil
	})
}

// waitFRR waits until FRR's blue paths for the prefix are exactly those of
// the named nodes, drained or not as asked.
func (d *demo) waitFRR(limit time.Duration, drainedToo bool, nodes ...string) error {
	sort.Strings(nodes)
	return d.until(limit, fmt.Sprintf("FRR holding blue's %s from %v", prefix, nodes), func() error {
		paths, err := d.bluePaths()
		if err != nil {
			return err
		}
		var from []string
		for _, p := range paths {
			if drained(p) != drainedToo {
				return fmt.Errorf("path %+v", p)
			}
			from = append(from, d.nodeName(p.NextHop))
		}
		sort.Strings(from)
		if strings.Join(from, ",") != strings.Join(nodes, ",") {
			return fmt.Errorf("paths from %v", from)
		}
		return nil
	})
}

// waitReply waits until the client has an answer to a request sent after t.
func (d *demo) waitReply(t time.Time, limit time.Duration) (time.Time, error) {
	var first time.Time
	err := d.until(limit, "a reply at the client", func() error {
		st := d.pinger.StatsBetween(t, time.Now().Add(time.Second))
		if st.Received == 0 {
			return fmt.Errorf("%d requests unanswered", st.Sent)
		}
		first = st.FirstReply
		return nil
	})
	return first, err
}

// status prints the four things each step watches: FRR, node-c's route,
// the lease and the pinger.
func (d *demo) status(m mark) {
	paths, err := d.bluePaths()
	var frr []string
	for _, p := range paths {
		s := fmt.Sprintf("RD %s next hop %s (%s)", p.RD, p.NextHop, d.nodeName(p.NextHop))
		if drained(p) {
			s += " drained"
		}
		frr = append(frr, s)
	}
	switch {
	case err != nil:
		d.show("FRR:    " + err.Error())
	case len(frr) == 0:
		d.show(fmt.Sprintf("FRR:    no blue path for %s", prefix))
	default:
		d.show(fmt.Sprintf("FRR:    blue %s: %s", prefix, strings.Join(frr, "; ")))
	}
	if _, line, err := d.routeVia(); err != nil {
		d.show("node-c: " + err.Error())
	} else if line == "" {
		d.show(fmt.Sprintf("node-c: no route for %s in blue's table (its unreachable default answers)", prefix))
	} else {
		d.show("node-c: " + line)
	}
	if l, err := d.lease(); err != nil {
		d.show("lease:  " + err.Error())
	} else if l == nil {
		d.show("lease:  none")
	} else {
		d.show(fmt.Sprintf("lease:  holder %q token %d available %q (token %q)", harness.LeaseHolder(l), harness.LeaseToken(l),
			l.Annotations[handoff.AnnotationAvailable], l.Annotations[handoff.AnnotationAvailableToken]))
	}
	st := d.pinger.StatsBetween(m.at, time.Now())
	all := d.pinger.Stats()
	d.show(fmt.Sprintf("pinger: %d of %d replies lost in this step, %d of %d since the start", st.Lost, st.Sent, all.Lost, all.Sent))
}

func (d *demo) lease() (*coordinationv1.Lease, error) {
	l, err := d.env.Kube.CoordinationV1().Leases(harness.Namespace).Get(d.ctx, names.Lease(theVM.VPC, theVM.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return l, err
}

// advertisements are the VM's advertisements by node.
func (d *demo) advertisements() (map[string]v1alpha1.BGPAdvertisement, error) {
	l, err := d.env.API.BGPAdvertisements(harness.Namespace).List(d.ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(theVM.VPC, theVM.Name)})
	if err != nil {
		return nil, err
	}
	out := map[string]v1alpha1.BGPAdvertisement{}
	for _, a := range l.Items {
		out[a.Spec.Node] = a
	}
	return out, nil
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// routeMonitor records `ip monitor route` on node-c.
type routeMonitor struct {
	proc *harness.Process
	mu   sync.Mutex
	out  bytes.Buffer
}

func startRouteMonitor(n *harness.Node) (*routeMonitor, error) {
	m := &routeMonitor{}
	cmd := exec.Command("ip", "-n", n.Netns.Name, "monitor", "route")
	cmd.Stdout = m
	var err error
	if m.proc, err = harness.StartProcess("ip monitor route", cmd, ""); err != nil {
		return nil, err
	}
	// ip subscribes before it prints anything; give it that moment.
	time.Sleep(100 * time.Millisecond)
	return m, nil
}

func (m *routeMonitor) Write(b []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.out.Write(b)
}

func (m *routeMonitor) stop() { m.proc.Kill() }

// lines are the monitor's lines about the prefix outside red's table.
func (m *routeMonitor) lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, line := range strings.Split(m.out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "Deleted" {
			f = f[1:]
		}
		// A host prefix prints without its length; red's route is its
		// workload's own, on a galactic veth, never via another node.
		if len(f) > 0 && (f[0] == prefix.Addr().String() || f[0] == prefix.String()) && strings.Contains(line, " via ") {
			out = append(out, line)
		}
	}
	return out
}

func (m *routeMonitor) count() int { return len(m.lines()) }

func (m *routeMonitor) since(n int) []string { return m.lines()[n:] }

// watcher records every holder of the lease and every advertisement of
// the VM while a step runs.
type watcher struct {
	mu       sync.Mutex
	holders  []string
	maxAdvs  int
	live     map[string]bool
	timeline []string
	stop     func()
}

func (d *demo) watch(existing ...string) (*watcher, error) {
	w := &watcher{live: map[string]bool{}}
	for _, name := range existing {
		w.live[name] = true
	}
	w.maxAdvs = len(w.live)
	ctx, cancel := context.WithCancel(d.ctx)
	lw, err := d.env.Kube.CoordinationV1().Leases(harness.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + names.Lease(theVM.VPC, theVM.Name)})
	if err != nil {
		cancel()
		return nil, err
	}
	aw, err := d.env.API.BGPAdvertisements(harness.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(theVM.VPC, theVM.Name)})
	if err != nil {
		lw.Stop()
		cancel()
		return nil, err
	}
	var wg sync.WaitGroup
	w.stop = func() { lw.Stop(); aw.Stop(); cancel(); wg.Wait() }
	start := time.Now()
	note := func(s string) {
		w.timeline = append(w.timeline, fmt.Sprintf("+%5.2fs %s", time.Since(start).Seconds(), s))
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ev := range lw.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			w.mu.Lock()
			if h := harness.LeaseHolder(l); len(w.holders) == 0 || w.holders[len(w.holders)-1] != h {
				w.holders = append(w.holders, h)
				note(fmt.Sprintf("lease holder %q token %d", h, harness.LeaseToken(l)))
			}
			w.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for ev := range aw.ResultChan() {
			a, ok := ev.Object.(*v1alpha1.BGPAdvertisement)
			if !ok {
				continue
			}
			w.mu.Lock()
			switch ev.Type {
			case watch.Added:
				w.live[a.Name] = true
				note("advertisement " + a.Name + " created")
			case watch.Deleted:
				delete(w.live, a.Name)
				note("advertisement " + a.Name + " deleted")
			}
			w.maxAdvs = max(w.maxAdvs, len(w.live))
			w.mu.Unlock()
		}
	}()
	return w, nil
}
