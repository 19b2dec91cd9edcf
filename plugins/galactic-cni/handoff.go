package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

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

// leaseLock builds the handoff lock of the attachment vpc/attachment (its
// data-plane names for a VPCAttachment, whose identity id is) from the
// node settings. Settings that cannot serve a handoff are a code 50 error.
func leaseLock(inv *invocation, vpc, attachment string, seconds int32, id handoff.Identity) (*handoff.Lock, *types.Error) {
	if err := inv.node.RequireNodeName(); err != nil {
		return nil, types.NewError(types.ErrPluginNotAvailable, "handoff needs the node name: "+err.Error(), "")
	}
	cs, terr := inv.api()
	if terr != nil {
		return nil, terr
	}
	lock, err := handoff.New(cs.Leases(inv.node.Namespace), inv.node.Namespace, names.Lease(vpc, attachment), handoff.Options{
		LeaseDuration: time.Duration(seconds) * time.Second,
		// ADD retries are new processes: keep the observation of a silent
		// holder on the node so that retries continue it.
		ObservationDir: filepath.Join(inv.node.StateDir, "handoff"),
		Identity:       id,
	})
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "handoff: "+err.Error(), "")
	}
	return lock, nil
}

// leaseRead is a VPCAttachment's lease read while the attachment was: the
// lock of the names and UID the node's hint gave, and the read's outcome.
type leaseRead struct {
	hint state.AttachmentHint
	lock *handoff.Lock
	// seen waits for the read; nil when it failed.
	seen func() *handoff.Observed
}

// of is r when the attachment c now describes is the hint's (UID and
// data-plane names), else nil: the lease read is another's.
func (r *leaseRead) of(c *Config) *leaseRead {
	if r == nil || c.Object == nil || r.hint != (state.AttachmentHint{UID: c.Object.UID, VPC: c.VPC, Attachment: c.Attachment.Attachment}) {
		return nil
	}
	return r
}

// readHintedLeases starts reading, for each VPCAttachment the config names
// that this node has a hint of, the lease the hint names, so that the
// read overlaps the attachment's: a restart or an upgrade in place then
// acquires with one write after the attachment is read. The i-th element
// is the read of the i-th name, nil without a hint.
func (p *plugin) readHintedLeases(inv *invocation, c *Config) []*leaseRead {
	reads := make([]*leaseRead, len(c.Names.Objects))
	if !c.Handoff.Enabled || c.Standby {
		return reads
	}
	hints := state.NewHints(inv.node.StateDir)
	for i, name := range c.Names.Objects {
		h, ok := hints.Get(c.Names.Namespace, name)
		if !ok {
			continue
		}
		lock, terr := leaseLock(inv, h.VPC, h.Attachment, c.leaseSeconds(), handoff.Identity{Namespace: c.Names.Namespace, UID: h.UID})
		if terr != nil {
			continue
		}
		reads[i] = &leaseRead{hint: h, lock: lock, seen: async(func() *handoff.Observed {
			ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
			defer cancel()
			// From the cache, as the attachment: the acquisition's write
			// is guarded by the version read.
			o, err := lock.ReadCached(ctx)
			if err != nil {
				return nil
			}
			return &o
		})}
	}
	return reads
}

// rememberAttachments keeps, for the next ADD of each VPCAttachment of ts
// on this node, its UID and data-plane names. A hint this ADD's lease read
// confirmed is only marked as used.
func rememberAttachments(inv *invocation, ts []target) {
	hints := state.NewHints(inv.node.StateDir)
	for _, t := range ts {
		o := t.conf.Object
		if o == nil || !t.conf.Handoff.Enabled {
			continue
		}
		var err error
		if t.lease != nil {
			err = hints.Touch(o.Namespace, o.Name)
		} else {
			err = hints.Put(o.Namespace, o.Name, state.AttachmentHint{UID: o.UID, VPC: t.conf.VPC, Attachment: t.conf.Attachment.Attachment})
		}
		if err != nil {
			inv.log.Warn("keeping the attachment's hint for the next ADD", "attachment", o.Namespace+"/"+o.Name, "error", err.Error())
		}
	}
}

// acquireHandoff takes the attachment's handoff lease before ADD touches
// the kernel, waiting up to waitSeconds for the current holder to release
// it or for its lease to expire. With read, it decides first from the
// lease read beside the attachment.
func (p *plugin) acquireHandoff(inv *invocation, c *Config, args *skel.CmdArgs, read *leaseRead) (lease, *types.Error) {
	if !c.Handoff.Enabled {
		return lease{}, nil
	}
	seconds := c.leaseSeconds()
	if c.Standby {
		// A live-migration target takes the lease at promotion; the
		// record keeps the duration it will ask for.
		return lease{seconds: seconds}, nil
	}
	var lock *handoff.Lock
	var seen *handoff.Observed
	if read != nil {
		lock, seen = read.lock, read.seen()
	} else {
		var terr *types.Error
		if lock, terr = leaseLock(inv, c.VPC, c.Attachment.Attachment, seconds, c.identity()); terr != nil {
			return lease{}, terr
		}
	}
	holder := names.Holder(inv.node.NodeName, args.ContainerID)
	start := p.now()
	var g handoff.Grant
	var err error
	if c.Handoff.Wait == 0 {
		// A zero wait is one attempt; a deadline of now would fail its reads.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		g, err = lock.TryAcquireFrom(ctx, holder, seen)
		cancel()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), c.Handoff.Wait)
		g, err = lock.AcquireFrom(ctx, holder, seen)
		cancel()
	}
	if err != nil {
		var held *handoff.HeldError
		switch {
		case errors.As(err, &held) && held.Predecessor != nil:
			return lease{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
				"%s: its lease %s belongs to a predecessor (attachment UID %s) that galactic-controller has not removed yet; retry later",
				c.describe(), held.Lease, held.Predecessor.UID), "")
		case errors.As(err, &held):
			return lease{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
				"%s is held by %s (lease %s, token %d), which did not release it within waitSeconds (%s); retry later",
				c.describe(), held.Holder, held.Lease, held.Token, c.Handoff.Wait), "")
		}
		return lease{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("acquiring the handoff lease of %s: %v", c.describe(), err), "")
	}
	inv.log.Info("handoff lease acquired", "holder", g.Holder, "token", g.Token, "waited", p.now().Sub(start).String(), "leaseReadWithAttachment", read != nil)
	return lease{holder: g.Holder, generation: g.Token, seconds: seconds}, nil
}

// leaseSeconds is the lease duration the config asks for, in the lease's
// unit.
func (c *Config) leaseSeconds() int32 { return int32(c.Handoff.Lease / time.Second) }

// async runs f in a goroutine; the function returned waits for f and
// gives its result, the same to every call.
func async[T any](f func() T) func() T {
	done := make(chan T, 1)
	go func() { done <- f() }()
	return sync.OnceValue(func() T { return <-done })
}

// identity is the lease identity of the config's attachment: its
// VPCAttachment's, none for an inline one.
func (c *Config) identity() handoff.Identity {
	if c.Object == nil {
		return handoff.Identity{}
	}
	return handoff.Identity{Namespace: c.Object.Namespace, UID: c.Object.UID}
}

// describe names the config's attachment in messages.
func (c *Config) describe() string {
	if c.Object != nil {
		return fmt.Sprintf("VPCAttachment %s/%s (%s/%s)", c.Object.Namespace, c.Object.Name, c.VPC, c.Attachment.Attachment)
	}
	return "attachment " + c.VPC + "/" + c.Attachment.Attachment
}

// releaseHandoff gives back a lease acquireHandoff took for the container
// interface ifName, when ADD fails.
func (p *plugin) releaseHandoff(inv *invocation, c *Config, containerID, ifName string, l lease) {
	if l.holder == "" {
		return
	}
	// A repeated ADD of a container that is attached already must not take
	// the lease from under it: its record still says it holds it.
	if rec, ok, err := inv.host.Store().Get(containerID, ifName); err == nil && ok && rec.Holder == l.holder && rec.AttachmentUID == c.identity().UID {
		return
	}
	p.release(inv, c.VPC, c.Attachment.Attachment, c.identity(), l, nil)
}

// releaseRecordHandoff gives back the lease a record holds (DEL and GC),
// from pre when DEL prepared it. A lease that is no longer this
// container's is left alone; one that cannot be released now is logged
// and expires by itself, since nothing renews it once the record is gone.
func (p *plugin) releaseRecordHandoff(inv *invocation, rec state.Record, pre *preparedRelease) error {
	if rec.Holder == "" {
		return nil
	}
	p.release(inv, rec.VPC, rec.Attachment, recordIdentity(rec), lease{holder: rec.Holder, generation: rec.HolderGeneration, seconds: rec.LeaseSeconds}, pre)
	return nil
}

// preparedRelease is a record's lease lock built and its lease read
// before the record's teardown.
type preparedRelease struct {
	lock *handoff.Lock
	// seen is the lease read; nil when reading failed.
	seen *handoff.Observed
	// deadline bounds the release when the read failed, so that an API
	// server that is down costs DEL one apiTimeout in all.
	deadline time.Time
	err      *types.Error
}

// prepareReleases builds the lease lock of every record that holds a
// lease and reads its lease, in one goroutine beside the teardown: the
// API client's connection and the read are then done when the interface
// is gone, and the release is one write. The function returned waits for
// that goroutine and gives the i-th record's preparation, nil for a
// record that holds no lease.
func (p *plugin) prepareReleases(inv *invocation, recs []state.Record) func(i int) *preparedRelease {
	if !slices.ContainsFunc(recs, func(r state.Record) bool { return r.Holder != "" }) {
		return func(int) *preparedRelease { return nil }
	}
	prepared := async(func() []*preparedRelease {
		out := make([]*preparedRelease, len(recs))
		deadline := time.Now().Add(apiTimeout)
		for i, rec := range recs {
			if rec.Holder == "" {
				continue
			}
			pre := &preparedRelease{deadline: deadline}
			out[i] = pre
			pre.lock, pre.err = leaseLock(inv, rec.VPC, rec.Attachment, max(rec.LeaseSeconds, 1), recordIdentity(rec))
			if pre.err != nil {
				continue
			}
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			if o, err := pre.lock.Read(ctx); err == nil {
				pre.seen = &o
			}
			cancel()
		}
		return out
	})
	return func(i int) *preparedRelease { return prepared()[i] }
}

// recordIdentity is the lease identity of a record's attachment.
func recordIdentity(rec state.Record) handoff.Identity {
	if rec.AttachmentUID == "" {
		return handoff.Identity{}
	}
	return handoff.Identity{Namespace: rec.Namespace, UID: rec.AttachmentUID}
}

// release gives back lease l of vpc/attachment, through pre when DEL
// prepared it.
func (p *plugin) release(inv *invocation, vpc, attachment string, id handoff.Identity, l lease, pre *preparedRelease) {
	if pre == nil {
		lock, terr := leaseLock(inv, vpc, attachment, max(l.seconds, 1), id)
		pre = &preparedRelease{lock: lock, err: terr, deadline: time.Now().Add(apiTimeout)}
	}
	if pre.err != nil {
		inv.log.Warn("handoff lease not released; it expires after its duration", "holder", l.holder, "error", pre.err.Error())
		return
	}
	deadline := pre.deadline
	if pre.seen != nil {
		// The API server answered the read: the write has a timeout of
		// its own.
		deadline = time.Now().Add(apiTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	err := pre.lock.ReleaseFrom(ctx, handoff.Grant{Holder: l.holder, Token: l.generation}, pre.seen)
	switch {
	case err == nil:
		inv.log.Info("handoff lease released", "holder", l.holder, "token", l.generation)
	case errors.Is(err, handoff.ErrLost):
		inv.log.Info("handoff lease already passed on; left to its holder", "holder", l.holder, "token", l.generation)
	default:
		inv.log.Warn("handoff lease not released; it expires after its duration", "holder", l.holder, "token", l.generation, "error", err.Error())
	}
}
