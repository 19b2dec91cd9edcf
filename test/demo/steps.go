package demo

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// How long the demo waits for what follows a report or a boot: routes
// take a reconcile and two BGP hops.
const routeLimit = 20 * time.Second

// 1. The VM attaches on node-a; it is routed only once the guest reports
// available.
func (d *demo) attach() error {
	d.say("== 1. the VM attaches on node-a (announce: whenAvailable, handoff on)")
	m := d.mark()
	r, err := d.launch("node-a")
	if err != nil {
		return err
	}
	d.vm = r
	if err := d.until(routeLimit, "node-a's router to judge the new holder unavailable", func() error {
		advs, err := d.advertisements()
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(advs["node-a"].Status.Conditions, v1alpha1.ConditionProgrammed)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonHolderUnavailable {
			return fmt.Errorf("conditions %+v", advs["node-a"].Status.Conditions)
		}
		return nil
	}); err != nil {
		return err
	}
	d.say("the guest is ready but has not reported available: node-a's advertisement is Programmed=False (%s)", v1alpha1.ReasonHolderUnavailable)
	// A second more, so a route that should not be there has time to show.
	time.Sleep(time.Second)
	d.status(m)
	paths, err := d.bluePaths()
	if err != nil {
		return err
	}
	via, _, err := d.routeVia()
	if err != nil {
		return err
	}
	errs := []error{
		expect(len(paths) == 0, "FRR to hold no blue path before the report, got %+v", paths),
		expect(via == "", "node-c to have no route before the report, got one via %s", via),
	}

	reported, first, err := d.servesFrom(r, "node-a")
	if err != nil {
		return err
	}
	settle()
	pre := d.pinger.StatsBetween(m.at, reported)
	d.report.RepliesBeforeAvailable = pre.Received
	d.report.FirstReplyAfterReport = first.Sub(reported)
	d.say("routed: the first reply %d ms after the report; %d of the %d requests sent before it were answered",
		d.report.FirstReplyAfterReport.Milliseconds(), d.report.RepliesBeforeAvailable, pre.Sent)
	// The same route for the VM's IPv6 address, over the IPv4 underlay.
	d.report.IPv6Routed = d.until(routeLimit, "the client reaching "+vmAddr6.String(), func() error {
		return d.clientNetns.Ping(vmAddr6)
	}) == nil
	d.say("the client reaches the VM's %s too: %v", vmAddr6, d.report.IPv6Routed)
	d.status(m)
	// Red's workload on node-c held 10.20.0.5 all along, so no reply
	// before the report also means blue never reached red.
	return errors.Join(append(errs,
		expect(d.report.RepliesBeforeAvailable == 0, "no reply before the guest reported available, got %d", d.report.RepliesBeforeAvailable),
		expect(d.report.IPv6Routed, "the client to reach the VM on %s", vmAddr6),
	)...)
}

// 2. The VM is upgraded in place on node-a: the old guest stops and its
// DEL runs, the replacement's ADD takes the lease, the new guest boots
// and reports available.
func (d *demo) upgrade() error {
	d.say("== 2. the VM is upgraded in place on node-a")
	l, err := d.lease()
	if err != nil {
		return err
	}
	before := harness.LeaseToken(l)
	m := d.mark()
	old := d.vm
	if err := d.stopVM(old); err != nil {
		return err
	}
	r, err := d.launch("node-a")
	if err != nil {
		return err
	}
	d.vm = r
	if err := d.availability(r, "available"); err != nil {
		return err
	}
	if _, err := d.waitReply(time.Now(), routeLimit); err != nil {
		return err
	}
	settle()
	f, err := d.figures(m)
	if err != nil {
		return err
	}
	d.report.Upgrade = f
	d.say("upgraded: %s", f.summary())
	d.say("the blackout is the replacement's boot; node-c held the withdrawn route (%ds hold) until node-a announced it again", withdrawHold)
	d.status(m)
	if l, err = d.lease(); err != nil {
		return err
	}
	via, _, _ := d.routeVia()
	return errors.Join(
		expect(harness.LeaseToken(l) == before+1, "the lease token to rise by one, %d -> %d", before, harness.LeaseToken(l)),
		expect(via == "node-a", "node-c's route via node-a, got %q", via),
		expect(f.Lost > 0 && f.Lost < f.Sent, "an upgrade to lose some replies (the replacement boots) and not all"),
		expect(len(f.RouteChanges) == 0, "node-c's route unchanged by an upgrade on one node, got %q", f.RouteChanges),
	)
}

// 3. The VM moves to node-b with the handoff: node-b's ADD waits until
// node-a's DEL releases the lease; FRR sees one withdrawal and one
// announcement, node-c's route changes once.
func (d *demo) move() error {
	d.say("== 3. the VM moves to node-b with the handoff")
	advs, err := d.advertisements()
	if err != nil {
		return err
	}
	w, err := d.watch(advs["node-a"].Name)
	if err != nil {
		return err
	}
	defer func() { w.stop() }()
	m := d.mark()
	c, err := d.container()
	if err != nil {
		return err
	}
	type addResult struct {
		out string
		err error
	}
	added := make(chan addResult, 1)
	go func() {
		out, err := d.cnitool("node-b", "add", theVM, c)
		added <- addResult{out, err}
	}()
	select {
	case r := <-added:
		return fmt.Errorf("expected node-b's ADD to wait for the lease, but it returned (%v)", r.err)
	case <-time.After(2 * time.Second):
		d.say("node-b: ADD is waiting for the lease")
	}
	// A move keeps the route until the successor replaces it, so the old
	// runtime does not drain first.
	old := d.vm
	if err := d.stopVM(old); err != nil {
		return err
	}
	var res addResult
	select {
	case res = <-added:
	case <-time.After(40 * time.Second):
		return errors.New("expected node-b's ADD to complete once node-a released the lease")
	}
	if res.err != nil {
		return fmt.Errorf("node-b's ADD after the release: %w", res.err)
	}
	d.say("node-b: ADD completed after node-a's DEL released the lease")
	if d.vm, err = d.boot("node-b", c, res.out); err != nil {
		return err
	}
	if _, _, err := d.servesFrom(d.vm, "node-b"); err != nil {
		return err
	}
	// FRR's log and the watches deliver their last lines.
	time.Sleep(time.Second)
	settle()
	f, err := d.figures(m)
	if err != nil {
		return err
	}
	d.report.Move = f
	w.stop()
	w.stop = func() {}
	d.say("what the API watches saw during the move:")
	d.show(strings.Join(w.timeline, "\n"))
	d.say("node-c's route changes: %s", strings.Join(f.RouteChanges, " | "))
	d.say("moved: %s", f.summary())
	d.say("the blackout is node-b's boot; node-c held node-a's withdrawn route until node-b's announcement replaced it")
	d.status(m)
	want := []string{names.Holder("node-a", harness.ContainerID(old.netns.Path)), "", names.Holder("node-b", harness.ContainerID(c.Path))}
	holders := w.holders
	if len(holders) > 0 && holders[0] != want[0] {
		holders = append([]string{want[0]}, holders...)
	}
	return errors.Join(
		expect(slices.Equal(holders, want), "the lease to pass node-a -> released -> node-b, saw %q", holders),
		expect(w.maxAdvs <= 1, "never two advertisements at once, saw %d", w.maxAdvs),
		expect(d.tapOn("node-a") == 0 && d.tapOn("node-b") != 0, "the tap gone from node-a and on node-b"),
		expect(f.Withdrawn["node-a"] == 1 && len(f.Withdrawn) == 1, "FRR to receive one withdrawal, from node-a; got %s", counts(f.Withdrawn)),
		expect(f.Announced["node-b"] == 1 && len(f.Announced) == 1, "FRR to receive one announcement, from node-b; got %s", counts(f.Announced)),
		expect(len(f.RouteChanges) == 1, "node-c's route to change once, got %d: %q", len(f.RouteChanges), f.RouteChanges),
	)
}

// 4. node-b crashes: it leaves the fabric and the API, its router, GC and
// VM die, no DEL runs. node-c keeps its route to node-b while FRR drops
// the session (withdrawal hold), node-a's ADD takes over once the lease
// expires, its announcement replaces the route; when node-b returns its
// router and GC remove what it left.
func (d *demo) crash() error {
	d.say("== 4. node-b crashes; the VM is rescheduled on node-a")
	b := d.nodes["node-b"]
	// node-b ran for a while before it crashed: its GC has seen the VM
	// holding the tap, not only the moment between ADD and boot.
	if err := d.waitGCPass("node-b", d.vmStarted["node-b"]); err != nil {
		return err
	}
	l, err := d.lease()
	if err != nil {
		return err
	}
	before := harness.LeaseToken(l)
	m := d.mark()
	if out, err := b.Run("ip", "link", "set", "ul0", "down"); err != nil {
		return fmt.Errorf("taking node-b off the fabric: %v %s", err, out)
	}
	if err := b.SetAPIReachable(false); err != nil {
		return err
	}
	b.router.Kill()
	d.stopGC("node-b")
	d.vm.guest.crash()
	d.vm.netns.Delete()
	d.say("node-b: off the fabric and the API, galactic-router and galactic-gc killed, qemu killed, the container's netns gone; no DEL ran")
	c, err := d.container()
	if err != nil {
		return err
	}
	start := time.Now()
	out, err := d.cnitool("node-a", "add", theVM, c)
	if err != nil {
		return err
	}
	waited := time.Since(start)
	viaAtExpiry, _, err := d.routeVia()
	if err != nil {
		return err
	}
	d.report.ViaAtLeaseExpiry = viaAtExpiry
	d.say("node-a: ADD took over after %.1fs (lease duration %ds, judged by node-a's own clock); node-c's route still leads to %s",
		waited.Seconds(), leaseSeconds, viaAtExpiry)
	d.status(m)
	r, err := d.boot("node-a", c, out)
	if err != nil {
		return err
	}
	d.vm = r
	if paths, err := d.bluePaths(); err == nil && len(paths) == 0 {
		via, _, _ := d.routeVia()
		d.say("FRR has dropped node-b's session (its hold time passed) and with it node-b's path; node-c's route still leads to %s: it holds a withdrawn route for %ds", via, withdrawHold)
	}
	if _, _, err := d.servesFrom(r, "node-a"); err != nil {
		return err
	}
	settle()
	f, err := d.figures(m)
	if err != nil {
		return err
	}
	d.report.Crash = f
	d.say("taken over: %s", f.summary())
	d.say("node-c's route changes: %s", strings.Join(f.RouteChanges, " | "))
	d.status(m)
	if l, err = d.lease(); err != nil {
		return err
	}
	advs, err := d.advertisements()
	if err != nil {
		return err
	}
	errs := []error{
		expect(waited >= leaseSeconds*time.Second, "node-a's ADD to wait at least the lease duration, it took %s", waited),
		expect(harness.LeaseToken(l) == before+1, "the lease token to rise by one"),
		expect(keys(advs)[0] == "node-a" && len(advs) == 1, "node-b's leftover advertisement deleted by node-a's ADD, got %v", keys(advs)),
		expect(viaAtExpiry == "node-b", "node-c's route kept to node-b until the lease expired, got %q", viaAtExpiry),
		expect(len(f.RouteChanges) == 1, "node-c's route to change once (to node-a), got %d: %q", len(f.RouteChanges), f.RouteChanges),
		expect(d.tapOn("node-b") != 0, "node-b's tap left behind, detached"),
	}
	return errors.Join(append(errs, d.comeBack())...)
}

// comeBack returns node-b: its router re-joins and removes what it
// announced for the VM, its GC reclaims the detached tap, and node-c's
// route stays on node-a.
func (d *demo) comeBack() error {
	d.say("node-b returns: back on the fabric and the API, galactic-router and galactic-gc started")
	b := d.nodes["node-b"]
	m := d.mark()
	if out, err := b.Run("ip", "link", "set", "ul0", "up"); err != nil {
		return fmt.Errorf("node-b back on the fabric: %v %s", err, out)
	}
	if err := b.SetAPIReachable(true); err != nil {
		return err
	}
	if err := b.router.Start(); err != nil {
		return err
	}
	if err := d.startGC("node-b"); err != nil {
		return err
	}
	if err := d.until(30*time.Second, "node-b's GC to reclaim the detached tap", func() error {
		if d.tapOn("node-b") != 0 || !strings.Contains(d.gcLog("node-b"), "reclaimed detached tap") {
			return errors.New("the tap is still there")
		}
		return nil
	}); err != nil {
		return err
	}
	for _, line := range strings.Split(d.gcLog("node-b"), "\n") {
		if strings.Contains(line, "tap") && !strings.Contains(line, "gc pass finished") {
			d.show(line)
		}
	}
	if err := d.until(routeLimit, "node-b's session with FRR back", d.allEstablished); err != nil {
		return err
	}
	// Its router has had the time to re-announce and withdraw.
	time.Sleep(2 * time.Second)
	if err := d.waitFRR(routeLimit, false, "node-a"); err != nil {
		return err
	}
	settle()
	f, err := d.figures(m)
	if err != nil {
		return err
	}
	d.report.Return = f
	left, err := d.leftovers("node-b")
	if err != nil {
		return err
	}
	d.say("node-b returned: its tap reclaimed and nothing of blue left there (%d galactic devices or rules), %s", len(left), f.summary())
	d.status(m)
	return errors.Join(
		expect(len(left) == 0, "nothing of galactic left on node-b, got %q", left),
		expect(len(f.RouteChanges) == 0, "node-c's route untouched by node-b's return, got %q", f.RouteChanges),
		expect(f.Lost == 0, "no reply lost while node-b returned, lost %d", f.Lost),
	)
}

// 5. galactic-router on node-a restarts, as in a rolling upgrade: the
// kernel keeps what it programmed, the router comes back with the same
// routes, no reply is lost.
func (d *demo) restartRouter() error {
	d.say("== 5. galactic-router on node-a restarts (SIGTERM, then started again)")
	a := d.nodes["node-a"]
	m := d.mark()
	time.Sleep(500 * time.Millisecond)
	a.router.Terminate()
	d.say("node-a: galactic-router stopped")
	if err := a.router.Start(); err != nil {
		return err
	}
	if err := d.until(routeLimit, "node-a's session with FRR back", d.allEstablished); err != nil {
		return err
	}
	if err := d.until(routeLimit, "node-a to re-announce the VM", func() error {
		u, err := d.fabric.CountUpdates(m.log, prefix)
		if err != nil {
			return err
		}
		if u.Announced[a.underlay.String()] == 0 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil {
		return err
	}
	d.say("node-a: galactic-router is back, its session with FRR established, the VM re-announced")
	time.Sleep(2 * time.Second)
	settle()
	f, err := d.figures(m)
	if err != nil {
		return err
	}
	d.report.Restart = f
	d.say("restarted: %s", f.summary())
	d.status(m)
	via, _, _ := d.routeVia()
	return errors.Join(
		expect(f.Lost == 0, "no reply lost across the router's restart, lost %d", f.Lost),
		expect(f.Sent > 0, "requests sent across the restart"),
		expect(len(f.RouteChanges) == 0, "node-c's route untouched, got %q", f.RouteChanges),
		expect(via == "node-a", "node-c's route via node-a, got %q", via),
	)
}

// 6. The VM is drained, then deleted: it reports unavailable, its route is
// re-announced drained and node-c removes it at once, then the guest stops
// and DEL runs. Pings fail only after the report.
func (d *demo) drain() error {
	d.say("== 6. the VM drains, then it is deleted")
	m := d.mark()
	time.Sleep(time.Second)
	if err := d.availability(d.vm, "unavailable"); err != nil {
		return err
	}
	reported := time.Now()
	if err := d.waitFRR(routeLimit, true, "node-a"); err != nil {
		return err
	}
	if err := d.waitVia("", 5*time.Second); err != nil {
		return err
	}
	gone := time.Now()
	d.say("drained: FRR holds the path marked (large community %d:2:0); node-c removed its route %d ms after the report, without the %ds withdrawal hold",
		harness.FabricASN, gone.Sub(reported).Milliseconds(), withdrawHold)
	d.status(m)
	if err := d.stopVM(d.vm); err != nil {
		return err
	}
	if err := d.waitFRR(routeLimit, false); err != nil {
		return err
	}
	// Blue's client keeps pinging 10.20.0.5, which red's workload on
	// node-c holds: isolation means not one answer.
	time.Sleep(2 * time.Second)
	settle()
	beforeDrain := d.pinger.StatsBetween(m.at, reported)
	after := d.pinger.StatsBetween(gone, time.Now())
	all := d.pinger.StatsBetween(m.at, time.Now())
	d.report.LostBeforeDrain = beforeDrain.Lost
	d.report.RepliesAfterWithdrawal = after.Received
	d.report.LastReplyAfterReport = all.LastReply.Sub(reported)
	d.say("deleted: %d replies lost before the report, the last reply %d ms after it, %d of %d requests answered since node-c's route went",
		beforeDrain.Lost, d.report.LastReplyAfterReport.Milliseconds(), after.Received, after.Sent)
	d.report.IPv6AfterDrain = d.clientNetns.Ping(vmAddr6) == nil
	redAnswers := d.nodes["node-c"].Ping(vmAddr) == nil
	d.say("red's workload on node-c still answers node-c on %s: %v; blue's client got none of it", vmAddr, redAnswers)
	d.status(m)

	// The client and red's workload go too: nothing of galactic is left.
	for _, w := range []struct {
		a harness.Attachment
		c *harness.Netns
	}{{client, d.clientNetns}, {red, d.redNetns}} {
		if _, err := d.cnitool("node-c", "del", w.a, w.c); err != nil {
			return err
		}
	}
	var left []string
	if err := d.until(10*time.Second, "nothing of galactic left on the nodes", func() error {
		left = nil
		for _, name := range []string{"node-a", "node-b", "node-c"} {
			l, err := d.leftovers(name)
			if err != nil {
				return err
			}
			for _, x := range l {
				left = append(left, name+": "+x)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%q", left)
		}
		return nil
	}); err != nil {
		return err
	}
	d.say("every attachment deleted: no galactic device or rule left on any node (the routers removed their VXLAN devices with the last attachments)")
	advs, err := d.advertisements()
	if err != nil {
		return err
	}
	l, err := d.lease()
	if err != nil {
		return err
	}
	return errors.Join(
		expect(beforeDrain.Lost == 0 && beforeDrain.Sent > 0, "no reply lost before the drain, lost %d of %d", beforeDrain.Lost, beforeDrain.Sent),
		expect(after.Received == 0 && after.Sent > 0, "no reply after node-c's route went, got %d of %d", after.Received, after.Sent),
		expect(redAnswers, "red's workload to answer node-c on the VM's address"),
		expect(!d.report.IPv6AfterDrain, "no answer on %s after the drain", vmAddr6),
		expect(len(advs) == 0, "no advertisement of the VM left, got %v", keys(advs)),
		expect(harness.LeaseHolder(l) == "", "the lease released"),
	)
}

// leftovers are the galactic devices (taps, veths, VXLAN devices) and the
// policy rules of galactic's protocols on a node, but for the node-wide
// local rule galactic keeps for good.
func (d *demo) leftovers(name string) ([]string, error) {
	n := d.nodes[name]
	var out []string
	links, err := n.Run("ip", "-br", "link")
	if err != nil {
		return nil, fmt.Errorf("ip link on %s: %v %s", name, err, links)
	}
	for _, line := range strings.Split(links, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (strings.HasPrefix(f[0], "gt") || strings.HasPrefix(f[0], "gv") || strings.HasPrefix(f[0], "gx")) {
			out = append(out, "device "+f[0])
		}
	}
	for _, family := range []string{"-4", "-6"} {
		rules, err := n.Run("ip", family, "rule")
		if err != nil {
			return nil, fmt.Errorf("ip rule on %s: %v %s", name, err, rules)
		}
		for _, line := range strings.Split(rules, "\n") {
			if strings.Contains(line, "proto") && !strings.Contains(line, "lookup local") {
				out = append(out, "rule "+strings.TrimSpace(line))
			}
		}
	}
	return out, nil
}

// servesFrom reports the VM available, as its runtime does once it is
// ready, and waits until FRR holds node's path, node-c routes to node and
// the client gets a reply. It returns when the report was made and when
// the first reply came.
func (d *demo) servesFrom(vm *running, node string) (reported, first time.Time, err error) {
	if err := d.availability(vm, "available"); err != nil {
		return time.Time{}, time.Time{}, err
	}
	reported = time.Now()
	if err := d.waitFRR(routeLimit, false, node); err != nil {
		return reported, time.Time{}, err
	}
	if err := d.waitVia(node, routeLimit); err != nil {
		return reported, time.Time{}, err
	}
	first, err = d.waitReply(reported, routeLimit)
	return reported, first, err
}
