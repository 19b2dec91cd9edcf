package demo

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// 2. The VM is upgraded in place: the old runtime's DEL, then the
// replacement's ADD, on the same node.
func (d *demo) upgrade() error {
	d.say("== 2. the VM is upgraded in place on node-a")
	before, err := d.observe(false)
	if err != nil {
		return err
	}
	old := d.current
	if err := d.stopVMM("node-a"); err != nil {
		return err
	}
	if _, err := d.cnitool("node-a", "del", old.netns); err != nil {
		return err
	}
	c, err := d.launch("node-a")
	if err != nil {
		return err
	}
	old.netns.Delete()
	d.current = &workload{node: "node-a", netns: c}
	after, err := d.observe(true)
	if err != nil {
		return err
	}
	d.say("tap ifindex %d -> %d under the same name; lease token %d -> %d", before.tapIndex["node-a"], after.tapIndex["node-a"], token(before.lease), token(after.lease))
	return errors.Join(
		expect(after.tapIndex["node-a"] != 0 && after.tapIndex["node-a"] != before.tapIndex["node-a"], "the tap recreated under the same name"),
		expect(token(after.lease) == token(before.lease)+1, "the lease token to rise by one"),
		expect(holder(after.lease) == names.Holder("node-a", harness.ContainerID(c.Path)), "the replacement to hold the lease"),
		expect(slices.Equal(after.advs["node-a"].Spec.Prefixes, before.advs["node-a"].Spec.Prefixes), "the advertised prefixes unchanged"),
		expect(len(after.advs) == 1 && len(after.advs["node-a"].Spec.Containers) == 1, "one advertisement with the replacement's entry only"),
		expect(entryToken(after.advs["node-a"]) == int64(token(after.lease)), "the entry to carry the new token"),
	)
}

// watcher records every version of the lease and of the attachment's
// advertisements while a step runs.
type watcher struct {
	mu       sync.Mutex
	holders  []string
	maxAdvs  int
	live     map[string]bool
	timeline []string
	stop     func()
	done     sync.WaitGroup
}

func (d *demo) watch() (*watcher, error) {
	w := &watcher{live: map[string]bool{}}
	ctx := d.ctx
	lw, err := d.env.Kube.CoordinationV1().Leases(harness.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + names.Lease(vpc, attachment)})
	if err != nil {
		return nil, err
	}
	aw, err := d.env.API.BGPAdvertisements(harness.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, attachment)})
	if err != nil {
		lw.Stop()
		return nil, err
	}
	w.stop = func() { lw.Stop(); aw.Stop(); w.done.Wait() }
	start := time.Now()
	note := func(s string) {
		w.timeline = append(w.timeline, fmt.Sprintf("+%5.2fs %s", time.Since(start).Seconds(), s))
	}
	w.done.Add(2)
	go func() {
		defer w.done.Done()
		for ev := range lw.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			w.mu.Lock()
			h := holder(l)
			if len(w.holders) == 0 || w.holders[len(w.holders)-1] != h {
				w.holders = append(w.holders, h)
				note(fmt.Sprintf("lease holder %q token %d", h, token(l)))
			}
			w.mu.Unlock()
		}
	}()
	go func() {
		defer w.done.Done()
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

// 3. The VM moves to node-b with the handoff: node-b's ADD waits until
// node-a's DEL releases the lease.
func (d *demo) move() error {
	d.say("== 3. the VM moves to node-b with the handoff")
	before, err := d.observe(false)
	if err != nil {
		return err
	}
	w, err := d.watch()
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.live[before.advs["node-a"].Name] = true
	w.maxAdvs = 1
	w.mu.Unlock()
	c, err := d.container()
	if err != nil {
		w.stop()
		return err
	}
	type addResult struct {
		out string
		err error
	}
	added := make(chan addResult, 1)
	go func() {
		out, err := d.cnitool("node-b", "add", c)
		added <- addResult{out, err}
	}()
	select {
	case r := <-added:
		w.stop()
		return fmt.Errorf("expected node-b's ADD to wait for the lease, but it returned (%v)", r.err)
	case <-time.After(2 * time.Second):
		d.say("node-b: ADD is waiting: the lease is held by %q", holder(before.lease))
	}
	old := d.current
	if err := d.stopVMM("node-a"); err != nil {
		w.stop()
		return err
	}
	if _, err := d.cnitool("node-a", "del", old.netns); err != nil {
		w.stop()
		return err
	}
	var res addResult
	select {
	case res = <-added:
		if res.err != nil {
			w.stop()
			return fmt.Errorf("node-b's ADD after the release: %w", res.err)
		}
	case <-time.After(40 * time.Second):
		w.stop()
		return errors.New("expected node-b's ADD to complete once node-a released the lease")
	}
	d.say("node-b: ADD completed after node-a's DEL released the lease")
	if err := d.startVMM("node-b", res.out); err != nil {
		w.stop()
		return err
	}
	old.netns.Delete()
	d.current = &workload{node: "node-b", netns: c}
	time.Sleep(300 * time.Millisecond) // let the watches deliver the last events
	w.stop()
	d.say("what the watches saw during the move:")
	d.show(strings.Join(w.timeline, "\n"))
	after, err := d.observe(true)
	if err != nil {
		return err
	}
	want := []string{names.Holder("node-a", harness.ContainerID(old.netns.Path)), "", names.Holder("node-b", harness.ContainerID(c.Path))}
	holders := w.holders
	if len(holders) > 0 && holders[0] != want[0] {
		holders = append([]string{want[0]}, holders...)
	}
	return errors.Join(
		expect(slices.Equal(holders, want), "the lease to pass node-a -> released -> node-b and never straight between holders, saw %q", holders),
		expect(w.maxAdvs <= 1, "never two advertisements at once, saw %d", w.maxAdvs),
		expect(after.tapIndex["node-a"] == 0, "node-a's tap removed by its DEL"),
		expect(after.tapIndex["node-b"] != 0, "a tap on node-b"),
		expect(len(after.advs) == 1 && after.advs["node-b"].Name != "", "only node-b's advertisement, got %v", keys(after.advs)),
		expect(token(after.lease) == token(before.lease)+1, "the lease token to rise by one"),
	)
}

// 4. node-b crashes: its container's netns vanishes, no DEL runs and no GC
// runs there. The VM is rescheduled on node-a, whose ADD waits for node-b's
// lease to expire, takes over and deletes node-b's leftover advertisement.
func (d *demo) crash() error {
	d.say("== 4. node-b crashes; the VM is rescheduled on node-a")
	before, err := d.observe(false)
	if err != nil {
		return err
	}
	// node-b ran normally for a while before it crashed: its GC has seen
	// the VM holding the tap, not only the moment between ADD and VMM start.
	if err := d.waitGCPass("node-b", d.vmmStarted["node-b"]); err != nil {
		return err
	}
	d.stopGC("node-b")
	d.crashVMM("node-b")
	d.current.netns.Delete()
	if err := d.nodes["node-b"].SetAPIReachable(false); err != nil {
		return err
	}
	d.say("node-b: GC stopped, VMM gone, container netns deleted, API server unreachable; no DEL ran")
	c, err := d.launch("node-a")
	if err != nil {
		return err
	}
	waited := d.lastAdd
	d.say("node-a: ADD took over after %.1fs (lease duration %ds, judged by node-a's own clock)", waited.Seconds(), leaseSeconds)
	d.current = &workload{node: "node-a", netns: c}
	after, err := d.observe(true)
	if err != nil {
		return err
	}
	return errors.Join(
		expect(waited >= leaseSeconds*time.Second, "node-a's ADD to wait at least the lease duration, it took %s", waited),
		expect(holder(after.lease) == names.Holder("node-a", harness.ContainerID(c.Path)), "node-a to hold the lease"),
		expect(token(after.lease) == token(before.lease)+1, "the lease token to rise by one"),
		expect(len(after.advs) == 1 && after.advs["node-a"].Name != "", "node-b's leftover advertisement deleted, got %v", keys(after.advs)),
		expect(after.tapIndex["node-b"] != 0, "node-b's tap left behind, detached"),
	)
}

// 5. node-b comes back: its GC keeps the detached tap on the first pass and
// reclaims it on the second, since only node-a advertises the attachment.
func (d *demo) comeBack() error {
	d.say("== 5. node-b comes back; its GC reclaims the detached tap")
	b := d.nodes["node-b"]
	if err := b.SetAPIReachable(true); err != nil {
		return err
	}
	var errs []error
	for pass := 1; pass <= 2; pass++ {
		out, err := d.gcOnce("node-b")
		if err != nil {
			return fmt.Errorf("galactic-gc --once on node-b: %v\n%s", err, out)
		}
		d.say("node-b: galactic-gc --once (pass %d)", pass)
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "tap") && !strings.Contains(line, "gc pass finished") {
				d.show(line)
			}
		}
		s, err := d.observe(false)
		if err != nil {
			return err
		}
		if pass == 1 {
			errs = append(errs, expect(s.tapIndex["node-b"] != 0 && strings.Contains(out, "first-sighting"), "the first pass to keep the tap"))
		} else {
			errs = append(errs, expect(s.tapIndex["node-b"] == 0, "the second pass to reclaim the tap"))
		}
	}
	if _, err := d.observe(true); err != nil {
		return err
	}
	return errors.Join(errs...)
}

func (d *demo) gcOnce(node string) (string, error) {
	n := d.nodes[node]
	out, err := exec.CommandContext(d.ctx, "ip", "netns", "exec", n.Netns.Name,
		filepath.Join(d.env.BinDir, "galactic-gc"), "--once", "--config", n.ConfigPath).CombinedOutput()
	return string(out), err
}

// 6. The VM is deleted for good.
func (d *demo) finish() error {
	d.say("== 6. the VM is deleted for good")
	if err := d.stopVMM("node-a"); err != nil {
		return err
	}
	if _, err := d.cnitool("node-a", "del", d.current.netns); err != nil {
		return err
	}
	s, err := d.observe(true)
	if err != nil {
		return err
	}
	return errors.Join(
		expect(len(s.advs) == 0, "no advertisement left, got %v", keys(s.advs)),
		expect(holder(s.lease) == "", "the lease released"),
		expect(len(s.tapIndex) == 0, "no tap left on any node"),
	)
}
