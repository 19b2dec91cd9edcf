package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/logging"
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

// Exit codes of the availability subcommands; docs/availability.md lists
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

// isReportCommand says whether argv asks for an availability subcommand
// rather than a CNI verb.
func isReportCommand(getenv func(string) string, args []string) bool {
	return getenv("CNI_COMMAND") == "" && len(args) > 1 && (args[1] == cmdAvailable || args[1] == cmdUnavailable)
}

// report runs `available` or `unavailable` with its flags and returns the
// exit code; one line goes to stdout on success, the reason to stderr
// otherwise.
func (p *plugin) report(name string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("galactic-cni "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	vpc := fs.String("vpc", "", "the attachment's VPC (required)")
	attachment := fs.String("attachment", "", "the VPC attachment (required)")
	container := fs.String("container", "", "the container ID the runtime passed to CNI ADD (required)")
	ifName := fs.String("ifname", "", "the CNI_IFNAME of that ADD; needed only when the container has the attachment on several interfaces")
	reason := fs.String("reason", "", "a condition reason such as Booting or ShuttingDown (optional)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: galactic-cni %s --vpc VPC --attachment ATTACHMENT --container ID [--ifname IF] [--reason Reason]\n", name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "galactic-cni %s: %s\n", name, fmt.Sprintf(format, a...))
		return code
	}
	if fs.NArg() > 0 {
		return fail(exitUsage, "unexpected arguments %q", fs.Args())
	}
	for _, f := range []struct{ name, value string }{{"--vpc", *vpc}, {"--attachment", *attachment}} {
		if err := names.ValidateLabel(f.name, f.value); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	if *container == "" {
		return fail(exitUsage, "--container is required: the container ID of the CNI ADD")
	}
	if !handoff.ValidReason(*reason) {
		return fail(exitUsage, "--reason %q is not a condition reason: a letter, then letters, digits, '_', ',' or ':' (such as ShuttingDown)", *reason)
	}

	node, err := settings.Load(p.getenv)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	if err := node.RequireNodeName(); err != nil {
		return fail(exitFailed, "%v", err)
	}
	log, closeLog := logging.Open(node.LogFile, "plugin", "galactic-cni", "verb", name, "containerID", *container, "vpc", *vpc, "attachment", *attachment)
	defer closeLog()

	rec, code, msg := findRecord(state.NewStore(node.StateDir), *vpc, *attachment, *container, *ifName)
	if code != exitOK {
		log.Error(name, "outcome", "error", "error", msg, "exitCode", code)
		return fail(code, "%s", msg)
	}
	if rec.Holder == "" || rec.HolderGeneration < 1 {
		msg = fmt.Sprintf("container %s took no handoff lease on %s/%s (handoff is disabled in its network config), so it has no availability to report", *container, *vpc, *attachment)
		log.Error(name, "outcome", "error", "error", msg, "exitCode", exitNotHolder)
		return fail(exitNotHolder, "%s", msg)
	}
	if want := names.Holder(node.NodeName, *container); rec.Holder != want {
		msg = fmt.Sprintf("the record of container %s names holder %s, not %s of this node", *container, rec.Holder, want)
		log.Error(name, "outcome", "error", "error", msg, "exitCode", exitNotHolder)
		return fail(exitNotHolder, "%s", msg)
	}

	cfg, err := client.LoadConfig(node.Kubeconfig)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	cs, err := client.New(cfg)
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	lock, err := handoff.New(cs.Leases(node.Namespace), node.Namespace, names.Lease(rec.VPC, rec.Attachment),
		handoff.Options{LeaseDuration: time.Duration(max(rec.LeaseSeconds, 1)) * time.Second})
	if err != nil {
		return fail(exitFailed, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	available := name == cmdAvailable
	err = lock.SetAvailable(ctx, rec.Holder, rec.HolderGeneration, available, *reason)
	switch {
	case errors.Is(err, handoff.ErrLost):
		log.Error(name, "outcome", "error", "error", err.Error(), "holder", rec.Holder, "token", rec.HolderGeneration, "exitCode", exitStale)
		return fail(exitStale, "stale token: %v; nothing was written, and this runtime must stop serving the attachment", err)
	case err != nil:
		log.Error(name, "outcome", "error", "error", err.Error(), "holder", rec.Holder, "token", rec.HolderGeneration, "exitCode", exitFailed)
		return fail(exitFailed, "%v", err)
	}
	log.Info(name, "outcome", "ok", "holder", rec.Holder, "token", rec.HolderGeneration, "reason", *reason)
	fmt.Fprintf(stdout, "%s/%s: %s (token %d) reported %s\n", rec.VPC, rec.Attachment, rec.Holder, rec.HolderGeneration, name)
	return exitOK
}

// findRecord finds the node record of container on vpc/attachment: by
// ifName when given, and otherwise the container's only record of it.
func findRecord(store state.Store, vpc, attachment, container, ifName string) (state.Record, int, string) {
	unknown := fmt.Sprintf("this node has no record of container %s on attachment %s/%s: the attachment is unknown here, or its ADD never ran or DEL ran already", container, vpc, attachment)
	if ifName != "" {
		rec, ok, err := store.Get(container, ifName)
		switch {
		case err != nil:
			return state.Record{}, exitFailed, err.Error()
		case !ok || rec.VPC != vpc || rec.Attachment != attachment:
			return state.Record{}, exitNoRecord, unknown
		}
		return rec, exitOK, ""
	}
	recs, err := store.List()
	var found []state.Record
	for _, r := range recs {
		if r.ContainerID == container && r.VPC == vpc && r.Attachment == attachment {
			found = append(found, r)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], exitOK, ""
	case len(found) > 1:
		return state.Record{}, exitUsage, fmt.Sprintf("container %s has %s/%s on %d interfaces: pass --ifname", container, vpc, attachment, len(found))
	case err != nil:
		return state.Record{}, exitFailed, err.Error()
	}
	return state.Record{}, exitNoRecord, unknown
}
