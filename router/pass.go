package router

import (
	"context"
	"time"

	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/router/dataplane"
)

// pass brings the desired state up to date with what changed (everything
// on a resync) and applies the difference, stage by stage: what the
// peers sent, the identity check, the API, the kernel, export. It returns
// when the next hold or bound ends.
func (d *Daemon) pass(ctx context.Context) time.Time {
	now := d.clock.Now()
	defer func() { d.metrics.observePass(d.clock.Since(now)) }()
	anyPeer, established, next := d.rib.receive(now, d.log)
	d.ids.check(ctx, d.spk, d.rib.imp.Duplicates())
	// Taken whatever else makes the pass full, so one request is one resync.
	asked := d.watch.resyncNow.Swap(false)
	full := d.cadence.full(asked, d.clock)
	apiSynced := d.api.synced()
	adverts, vnis, apiMoved := d.api.list(apiSynced, full, d.exp.saved.VNIs, d.exp.savedGen)
	devices, holdEnd, ok := d.install(ctx, now, vnis, full)
	if !holdEnd.IsZero() && (next.IsZero() || holdEnd.Before(next)) {
		next = holdEnd
	}
	if !ok {
		d.cadence.failures++
		return next
	}
	installed := 0
	for vpc := range devices {
		installed += d.rib.holder.Count(vpc)
	}
	errs := d.kernel.deviceErrs
	d.exp.sync(ctx, exportView{adverts: adverts, vnis: vnis, devices: devices, deviceErrs: errs, dups: d.ids.dups,
		anyPeer: anyPeer, available: d.api.available, attachments: d.api.lookup()}, apiSynced, apiMoved, full, now)
	d.cadence.settle(len(errs) > 0)
	d.metrics.set(len(d.exp.announced), installed, established)
	d.metrics.deviceErrors.Set(float64(len(errs)))
	return next
}

// install makes the kernel hold the routes the selection and the hold
// want in the VPCs of vnis, with their devices, and the speaker import
// their route targets. It returns the devices, when the next hold ends,
// and false when the node lock could not be taken: nothing was written.
func (d *Daemon) install(ctx context.Context, now time.Time, vnis map[string]uint32, full bool) (map[string]*dataplane.Device, time.Time, bool) {
	kp, devices := d.kernel.devicesStage(vnis, full)
	holdEnd := d.rib.hold(now, vnis, devices, d.kernel.deviceErrs)
	kp.routesStage(devices, &d.rib.holder)
	// The membership goes out before the writes, so the peers send a new
	// VPC's routes while its device is made (a node of many new VPCs
	// spends seconds on devices); a device that fails leaves it again below.
	d.syncMembership(ctx, vnis, devices)
	kp.apply(devices, &d.rib.holder)
	if kp.lockErr != nil {
		return devices, holdEnd, false
	}
	d.rib.holder.Synced()
	d.metrics.observeCost(kp.cost)
	d.syncMembership(ctx, vnis, devices)
	return devices, holdEnd, true
}

// cadence is when the loop runs a full pass and how it backs off: every
// resync, on request, and while local errors last.
type cadence struct {
	resync   time.Duration
	lastFull time.Time
	// failures is how many passes in a row had a local error.
	failures int
}

// full says whether this pass reads everything: asked, the first, a
// resync after the last, or after a failure.
func (c *cadence) full(asked bool, clk clock.PassiveClock) bool {
	full := asked || c.lastFull.IsZero() || clk.Since(c.lastFull) >= c.resync || c.failures > 0
	if full {
		c.lastFull = clk.Now()
	}
	return full
}

// settle counts a pass that ended with a device error, or ends the count.
func (c *cadence) settle(failed bool) {
	if failed {
		c.failures++
	} else {
		c.failures = 0
	}
}

// wait is how long the loop sleeps after a pass whose next hold or bound
// ends at next, unless an event comes first.
func (d *Daemon) wait(next time.Time) time.Duration {
	wait := d.o.Resync
	if !next.IsZero() {
		wait = min(wait, next.Sub(d.clock.Now())+10*time.Millisecond)
	}
	if !d.rib.ready {
		wait = min(wait, time.Second)
	}
	if f := d.cadence.failures; f > 0 {
		// Local errors are retried with backoff, up to the resync.
		wait = min(wait, time.Duration(1<<min(f-1, 6))*500*time.Millisecond)
	}
	return max(wait, 10*time.Millisecond)
}
