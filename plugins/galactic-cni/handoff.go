package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
)

// apiTimeout bounds lease calls that must not wait: giving a lease back
// (DEL must not hang on an API server that is down; a lease nobody renews
// expires by itself) and the single attempt of waitSeconds 0.
const apiTimeout = 5 * time.Second

// lease is the handoff lease an ADD holds.
type lease struct {
	holder     string
	generation int64
	seconds    int32
}

// leaseLock builds the attachment's handoff lock from the node settings.
// Settings that cannot serve a handoff are a code 50 error.
func leaseLock(inv *invocation, vpc, attachment string, seconds int32) (*handoff.Lock, *types.Error) {
	unavailable := func(msg string) *types.Error { return types.NewError(types.ErrPluginNotAvailable, msg, "") }
	if err := inv.node.RequireNodeName(); err != nil {
		return nil, unavailable("handoff needs the node name: " + err.Error())
	}
	cfg, err := client.LoadConfig(inv.node.Kubeconfig)
	if err != nil {
		return nil, unavailable("handoff needs the API server: " + err.Error())
	}
	cs, err := client.New(cfg)
	if err != nil {
		return nil, unavailable("handoff needs the API server: " + err.Error())
	}
	lock, err := handoff.New(cs.Leases(inv.node.Namespace), inv.node.Namespace, names.Lease(vpc, attachment), handoff.Options{
		LeaseDuration: time.Duration(seconds) * time.Second,
		// ADD retries are new processes: keep the observation of a silent
		// holder on the node so that retries continue it.
		ObservationDir: filepath.Join(inv.node.StateDir, "handoff"),
	})
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "handoff: "+err.Error(), "")
	}
	return lock, nil
}

// acquireHandoff takes the attachment's handoff lease before ADD touches
// the kernel, waiting up to waitSeconds for the current holder to release
// it or for its lease to expire.
func (p *plugin) acquireHandoff(inv *invocation, c *Config, args *skel.CmdArgs) (lease, *types.Error) {
	if !c.Handoff.Enabled {
		return lease{}, nil
	}
	seconds := int32(c.Handoff.Lease / time.Second)
	if c.Standby {
		// A live-migration target takes the lease at promotion; the
		// record keeps the duration it will ask for.
		return lease{seconds: seconds}, nil
	}
	lock, terr := leaseLock(inv, c.VPC, c.Attachment.Attachment, seconds)
	if terr != nil {
		return lease{}, terr
	}
	holder := names.Holder(inv.node.NodeName, args.ContainerID)
	start := p.now()
	var g handoff.Grant
	var err error
	if c.Handoff.Wait == 0 {
		// A zero wait is one attempt; a deadline of now would fail its reads.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		g, err = lock.TryAcquire(ctx, holder)
		cancel()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), c.Handoff.Wait)
		g, err = lock.Acquire(ctx, holder)
		cancel()
	}
	if err != nil {
		var held *handoff.HeldError
		if errors.As(err, &held) {
			return lease{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
				"attachment %s/%s is held by %s (lease %s, token %d), which did not release it within waitSeconds (%s); retry later",
				c.VPC, c.Attachment.Attachment, held.Holder, held.Lease, held.Token, c.Handoff.Wait), "")
		}
		return lease{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("acquiring the handoff lease of %s/%s: %v", c.VPC, c.Attachment.Attachment, err), "")
	}
	inv.log.Info("handoff lease acquired", "holder", g.Holder, "token", g.Token, "waited", p.now().Sub(start).String())
	return lease{holder: g.Holder, generation: g.Token, seconds: seconds}, nil
}

// releaseHandoff gives back a lease acquireHandoff took, when ADD fails.
func (p *plugin) releaseHandoff(inv *invocation, c *Config, args *skel.CmdArgs, l lease) {
	if l.holder == "" {
		return
	}
	// A repeated ADD of a container that is attached already must not take
	// the lease from under it: its record still says it holds it.
	if rec, ok, err := inv.host.Store().Get(args.ContainerID, args.IfName); err == nil && ok && rec.Holder == l.holder {
		return
	}
	p.release(inv, c.VPC, c.Attachment.Attachment, l)
}

// releaseRecordHandoff gives back the lease a record holds (DEL and GC).
// A lease that is no longer this container's is left alone; one that
// cannot be released now is logged and expires by itself, since nothing
// renews it once the record is gone.
func (p *plugin) releaseRecordHandoff(inv *invocation, rec state.Record) error {
	if rec.Holder == "" {
		return nil
	}
	p.release(inv, rec.VPC, rec.Attachment, lease{holder: rec.Holder, generation: rec.HolderGeneration, seconds: rec.LeaseSeconds})
	return nil
}

func (p *plugin) release(inv *invocation, vpc, attachment string, l lease) {
	lock, terr := leaseLock(inv, vpc, attachment, max(l.seconds, 1))
	if terr != nil {
		inv.log.Warn("handoff lease not released; it expires after its duration", "holder", l.holder, "error", terr.Error())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := lock.Release(ctx, handoff.Grant{Holder: l.holder, Token: l.generation})
	switch {
	case err == nil:
		inv.log.Info("handoff lease released", "holder", l.holder, "token", l.generation)
	case errors.Is(err, handoff.ErrLost):
		inv.log.Info("handoff lease already passed on; left to its holder", "holder", l.holder, "token", l.generation)
	default:
		inv.log.Warn("handoff lease not released; it expires after its duration", "holder", l.holder, "token", l.generation, "error", err.Error())
	}
}
