package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/state"
)

// The live-migration subcommands (docs/concepts/live-migration.md): the source
// runs release once its VMM paused the guest, the target runs promote.
const (
	cmdRelease = "release"
	cmdPromote = "promote"
)

// exitHeld: promote gave up because a live holder kept the lease for
// waitSeconds; nothing was written.
const exitHeld = 6

// parseStandby reads the stanza's standby, else the pod's annotation. A
// standby target takes the lease when promoted, so it needs handoff.
func parseStandby(n NetConf, handoffEnabled bool) (bool, *types.Error) {
	standby, key, terr := n.RuntimeConfig.Standby(n.Standby)
	if terr != nil {
		return false, terr
	}
	if standby && !handoffEnabled {
		return false, netconf.FromAnnotation(key, netconf.InvalidConfig(`standby needs the handoff lease, which promotion takes from the source: enable "handoff", or leave standby out`))
	}
	return standby, nil
}

// checkSpec is what CHECK compares the kernel with: a record still on
// standby has no host routes, a promoted one has them whatever the
// stanza says.
func checkSpec(c *Config, args *skel.CmdArgs, rec state.Record) hostif.Spec {
	s := c.spec(args, args.IfName)
	s.Standby = rec.Standby
	return s
}

// migrate runs release or promote with its flags and returns the exit code.
func (p *plugin) migrate(name string, args []string, stdout, stderr io.Writer) int {
	c := &command{name: name, stderr: stderr}
	defer c.close()
	usage := ""
	if name == cmdPromote {
		usage = " [--available=false] [--wait-seconds N]"
	}
	fs := commandFlags(c, stderr, usage)
	available, wait := true, -1
	if name == cmdPromote {
		fs.BoolVar(&available, "available", true, "report the instance available once promoted")
		fs.IntVar(&wait, "wait-seconds", -1, "how long to wait for the source to release; default the network config's handoff.waitSeconds")
	}
	if code, done := c.open(p, fs, args); done {
		return code
	}
	if wait < -1 || wait > maxWaitSeconds {
		return c.fail(exitUsage, "--wait-seconds %d is out of range: use 0..%d", wait, maxWaitSeconds)
	}
	if name == cmdRelease {
		if c.reason != "" {
			return c.fail(exitUsage, "--reason is promote's: a release always reports %s", handoff.ReasonReleased)
		}
		return p.releaseCommand(c, stdout)
	}
	return p.promoteCommand(c, available, wait, stdout)
}

// releaseCommand gives up the source's lease and keeps everything else: the
// interface, the host routes and the advertisement entry with its token,
// so receivers keep the source's path until the target's higher token
// replaces it. The record keeps the token but no longer holds the lease,
// so neither galactic-gc nor DEL renews or releases it.
func (p *plugin) releaseCommand(c *command, stdout io.Writer) int {
	rec := c.rec
	holder := names.Holder(c.node.NodeName, c.container)
	switch {
	case rec.Standby:
		return c.fail(exitNotHolder, "container %s is a standby target of %s and holds no lease: to abort the migration, DEL it", c.container, c.ref())
	case rec.HolderGeneration < 1:
		return c.fail(exitNotHolder, "container %s took no handoff lease on %s (handoff is disabled in its network config), so it has nothing to release", c.container, c.ref())
	case rec.Holder != "" && rec.Holder != holder:
		return c.fail(exitNotHolder, "the record of container %s names holder %s, not %s of this node", c.container, rec.Holder, holder)
	}
	lock, err := commandLock(c.node, rec)
	if err != nil {
		return c.fail(exitFailed, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	if rec.Holder != "" {
		err := lock.Release(ctx, handoff.Grant{Holder: holder, Token: rec.HolderGeneration})
		if errors.Is(err, handoff.ErrLost) && releasedAlready(ctx, lock, rec.HolderGeneration) {
			// An earlier release freed the lease but could not write the record.
			err = nil
		}
		switch {
		case errors.Is(err, handoff.ErrLost):
			return c.fail(exitStale, "stale token: %v; nothing was written, and this runtime must stop serving the attachment", err)
		case err != nil:
			return c.fail(exitFailed, "%v", err)
		}
	}
	host := hostif.Host{StateDir: c.node.StateDir, Live: p.live, Now: p.now, Filter: p.filter}
	if _, _, err := host.UpdateRecord(rec.ContainerID, rec.IfName, func(r *state.Record) { r.Holder = "" }); err != nil {
		return c.fail(exitFailed, "the lease is released, but the node record could not be written (run release again): %v", err)
	}
	c.log.Info(c.name, "outcome", "ok", "holder", holder, "token", rec.HolderGeneration)
	fmt.Fprintf(stdout, "%s: %s released token %d; its path stays announced until a higher token replaces it\n", c.ref(), holder, rec.HolderGeneration)
	return exitOK
}

// releasedAlready says whether the lease is free and still at token.
func releasedAlready(ctx context.Context, lock *handoff.Lock, token int64) bool {
	cur, err := lock.Get(ctx)
	return err == nil && cur.HolderIdentity == "" && int64(cur.LeaseTransitions) == token
}

// promoteCommand makes this container the attachment's holder: it takes the
// lease with a new token (waiting, like ADD, for a live holder to release
// it) and, unless told not to, the report that it is available in the same
// write; turns on the host routes and takes the entry off standby with the
// new token, which receivers prefer to the source's. Every step is idempotent, so a failed promote is
// retried as a whole.
func (p *plugin) promoteCommand(c *command, available bool, waitSeconds int, stdout io.Writer) int {
	rec := c.rec
	holder := names.Holder(c.node.NodeName, c.container)
	switch {
	case !rec.Standby && rec.HolderGeneration < 1:
		return c.fail(exitNotHolder, "container %s took no handoff lease on %s (handoff is disabled in its network config), so it cannot be promoted", c.container, c.ref())
	case rec.Holder != "" && rec.Holder != holder:
		return c.fail(exitNotHolder, "the record of container %s names holder %s, not %s of this node", c.container, rec.Holder, holder)
	}
	wait := time.Duration(rec.WaitSeconds) * time.Second
	if waitSeconds >= 0 {
		wait = time.Duration(waitSeconds) * time.Second
	}
	cs, err := commandClient(c.node)
	if err != nil {
		return c.fail(exitFailed, "%v", err)
	}
	// An available target reports so in the acquiring write: its entry is
	// still on standby, so nothing routes to it before the entry goes live.
	lock, err := recordLockWith(cs, c.node, rec, handoff.Options{ReportAvailable: available, ReportReason: c.reason})
	if err != nil {
		return c.fail(exitFailed, "%v", err)
	}
	start := p.now()
	var g handoff.Grant
	if wait == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		g, err = lock.TryAcquire(ctx, holder)
		cancel()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		g, err = lock.Acquire(ctx, holder)
		cancel()
	}
	var held *handoff.HeldError
	switch {
	case errors.As(err, &held):
		return c.fail(exitHeld, "%s is held by %s (lease %s, token %d), which did not release it within %s: nothing was changed; the source runs `galactic-cni release` first",
			c.ref(), held.Holder, held.Lease, held.Token, wait)
	case err != nil:
		return c.fail(exitFailed, "acquiring the handoff lease: %v", err)
	}
	acquired := p.now()
	c.log.Info("handoff lease acquired", "holder", g.Holder, "token", g.Token, "waited", acquired.Sub(start).String())

	host := hostif.Host{StateDir: c.node.StateDir, Live: p.live, Now: p.now, Filter: p.filter}
	if _, err := host.Activate(rec.ContainerID, rec.IfName, func(r *state.Record) {
		r.Standby, r.Holder, r.HolderGeneration = false, g.Holder, g.Token
	}); err != nil {
		// Give the lease back, so that the source can take it again.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		rerr := lock.Release(ctx, g)
		cancel()
		return c.fail(exitFailed, "activating the host interface: %v (lease released: %v)", err, rerr == nil)
	}

	activated := p.now()
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	adv := &advert.Advertiser{API: cs.BGPAdvertisements(c.node.Namespace), Live: p.live}
	key := recordKey(rec, c.node.NodeName)
	res, err := adv.Promote(ctx, key, rec.ContainerID, rec.IfName, g.Token)
	if err != nil {
		return c.fail(exitFailed, "taking the advertisement entry off standby (run promote again): %v", err)
	}
	end := p.now()
	c.log.Info(c.name, "outcome", "ok", "holder", g.Holder, "token", g.Token, "available", available, "advertisement", string(res.Outcome),
		"acquireMs", acquired.Sub(start).Milliseconds(), "activateMs", activated.Sub(acquired).Milliseconds(),
		"advertiseMs", end.Sub(activated).Milliseconds())
	report := "reported available"
	if !available {
		report = "not reported available"
	}
	fmt.Fprintf(stdout, "%s: %s promoted with token %d, %s\n", c.ref(), g.Holder, g.Token, report)
	return exitOK
}
