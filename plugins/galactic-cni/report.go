package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

// The availability subcommands: `galactic-cni available ...` and
// `galactic-cni unavailable ...`, run by runtimes and scripts on the node,
// never by a container runtime's CNI calls (those set CNI_COMMAND).
const (
	cmdAvailable   = "available"
	cmdUnavailable = "unavailable"
)

// Exit codes of the availability subcommands; docs/concepts/handoff-and-availability.md lists
// them. Codes 2 to 5 mean nothing was written.
const (
	exitOK = 0
	// exitFailed: the node settings, the kubeconfig or the API server
	// failed; retrying is safe (a report that landed is not written again).
	exitFailed = 1
	// exitUsage: bad flags.
	exitUsage = 2
	// exitNoRecord: this node has no record of the container on the
	// attachment (unknown attachment, or DEL ran already).
	exitNoRecord = 3
	// exitNotHolder: the container's ADD took no handoff lease, so it
	// holds nothing to report on.
	exitNotHolder = 4
	// exitStale: the lease moved on from the container's holder and token
	// (handoff.ErrLost): it must stop serving the attachment.
	exitStale = 5
)

// reportTimeout bounds the report's API calls, so a script never hangs on
// an API server that is down.
const reportTimeout = 10 * time.Second

// report runs `available` or `unavailable` with its flags and returns the
// exit code; one line goes to stdout on success, the reason to stderr
// otherwise.
func (p *plugin) report(name string, args []string, stdout, stderr io.Writer) int {
	c := &command{name: name, stderr: stderr}
	defer c.close()
	if code, done := c.open(p, commandFlags(c, stderr, ""), args); done {
		return code
	}
	rec, node, log := c.rec, c.node, c.log
	if rec.Holder == "" || rec.HolderGeneration < 1 {
		return c.fail(exitNotHolder, "container %s took no handoff lease on %s (handoff is disabled in its network config), so it has no availability to report", c.container, c.ref())
	}
	if want := names.Holder(node.NodeName, c.container); rec.Holder != want {
		return c.fail(exitNotHolder, "the record of container %s names holder %s, not %s of this node", c.container, rec.Holder, want)
	}
	lock, err := commandLock(node, rec)
	if err != nil {
		return c.fail(exitFailed, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	available := name == cmdAvailable
	err = lock.SetAvailable(ctx, rec.Holder, rec.HolderGeneration, available, c.reason)
	switch {
	case errors.Is(err, handoff.ErrLost):
		return c.fail(exitStale, "stale token: %v; nothing was written, and this runtime must stop serving the attachment", err)
	case err != nil:
		return c.fail(exitFailed, "%v", err)
	}
	log.Info(name, "outcome", "ok", "holder", rec.Holder, "token", rec.HolderGeneration, "reason", c.reason)
	fmt.Fprintf(stdout, "%s: %s (token %d) reported %s\n", c.ref(), rec.Holder, rec.HolderGeneration, name)
	return exitOK
}

// commandLock is the handoff lock of a record's attachment, built from the
// node settings. The observation dir is ADD's, so a promotion waiting on a
// silent holder continues what this node observed of it.
func commandLock(node settings.Node, rec state.Record) (*handoff.Lock, error) {
	cs, err := commandClient(node)
	if err != nil {
		return nil, err
	}
	return recordLock(cs, node, rec)
}

// commandClient is the API client of a subcommand, from the node's kubeconfig.
func commandClient(node settings.Node) (*client.Clients, error) {
	cfg, err := client.LoadConfig(node.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return client.New(cfg)
}

func recordLock(cs *client.Clients, node settings.Node, rec state.Record) (*handoff.Lock, error) {
	return recordLockWith(cs, node, rec, handoff.Options{})
}

// recordLockWith is recordLock with opts' availability report on acquisition.
func recordLockWith(cs *client.Clients, node settings.Node, rec state.Record, opts handoff.Options) (*handoff.Lock, error) {
	opts.LeaseDuration = time.Duration(max(rec.LeaseSeconds, 1)) * time.Second
	opts.ObservationDir = filepath.Join(node.StateDir, "handoff")
	opts.Identity = recordIdentity(rec)
	return handoff.New(cs.Leases(node.Namespace), node.Namespace, names.Lease(rec.VPC, rec.Attachment), opts)
}

// findRecord finds the node record of container on the attachment ref:
// by ifName when given, and otherwise the container's only record of it.
func findRecord(store state.Store, ref attachmentRef, container, ifName string) (state.Record, int, string) {
	unknown := fmt.Sprintf("this node has no record of container %s on %s: the attachment is unknown here, or its ADD never ran or DEL ran already", container, ref)
	if ifName != "" {
		rec, ok, err := store.Get(container, ifName)
		switch {
		case err != nil:
			return state.Record{}, exitFailed, err.Error()
		case !ok || !ref.matches(rec):
			return state.Record{}, exitNoRecord, unknown
		}
		return rec, exitOK, ""
	}
	recs, err := store.List()
	var found []state.Record
	for _, r := range recs {
		if r.ContainerID == container && ref.matches(r) {
			found = append(found, r)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], exitOK, ""
	case len(found) > 1:
		return state.Record{}, exitUsage, fmt.Sprintf("container %s has %s on %d interfaces: pass --ifname", container, ref, len(found))
	case err != nil:
		return state.Record{}, exitFailed, err.Error()
	}
	return state.Record{}, exitNoRecord, unknown
}
