package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/logging"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

// isCommand says whether argv asks for one of the node subcommands
// (available, unavailable, release, promote) rather than a CNI verb.
func isCommand(getenv func(string) string, args []string) bool {
	if getenv("CNI_COMMAND") != "" || len(args) < 2 {
		return false
	}
	switch args[1] {
	case cmdAvailable, cmdUnavailable, cmdRelease, cmdPromote:
		return true
	}
	return false
}

// runCommand runs a node subcommand and returns its exit code.
func (p *plugin) runCommand(name string, args []string, stdout, stderr io.Writer) int {
	switch name {
	case cmdRelease, cmdPromote:
		return p.migrate(name, args, stdout, stderr)
	}
	return p.report(name, args, stdout, stderr)
}

// command is a node subcommand's common part: the flags naming the
// container's attachment, the node settings, the log and the record.
type command struct {
	name                                          string
	namespace, vpc, attachment, container, ifName string
	reason                                        string
	node                                          settings.Node
	log                                           *slog.Logger
	closeLog                                      func()
	rec                                           state.Record
	stderr                                        io.Writer
}

// fail writes why the command failed and returns code.
func (c *command) fail(code int, format string, a ...any) int {
	msg := fmt.Sprintf(format, a...)
	if c.log != nil {
		c.log.Error(c.name, "outcome", "error", "error", msg, "exitCode", code)
	}
	fmt.Fprintf(c.stderr, "galactic-cni %s: %s\n", c.name, msg)
	return code
}

// commandFlags declares the flags every subcommand has; extra declares
// the subcommand's own.
func commandFlags(c *command, stderr io.Writer, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("galactic-cni "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.namespace, "namespace", "", "the namespace of the VPCAttachment (an object-backed attachment)")
	fs.StringVar(&c.vpc, "vpc", "", "the VPC of an inline attachment")
	fs.StringVar(&c.attachment, "attachment", "", "the VPCAttachment's name, or the inline attachment's (required)")
	fs.StringVar(&c.container, "container", "", "the container ID the runtime passed to CNI ADD (required)")
	fs.StringVar(&c.ifName, "ifname", "", "the CNI_IFNAME of that ADD; needed only when the container has the attachment on several interfaces")
	fs.StringVar(&c.reason, "reason", "", "a condition reason such as Booting or ShuttingDown (optional)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: galactic-cni %s (--namespace NAMESPACE | --vpc VPC) --attachment ATTACHMENT --container ID [--ifname IF] [--reason Reason]%s\n", c.name, usage)
		fs.PrintDefaults()
	}
	return fs
}

// open parses args, loads the node settings, opens the log and finds the
// container's record. done is false when the command has ended with
// code (also for -h, with exitOK).
func (c *command) open(p *plugin, fs *flag.FlagSet, args []string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, true
		}
		return exitUsage, true
	}
	if fs.NArg() > 0 {
		return c.fail(exitUsage, "unexpected arguments %q", fs.Args()), true
	}
	first := struct{ name, value string }{"--vpc", c.vpc}
	switch {
	case c.namespace != "" && c.vpc != "":
		return c.fail(exitUsage, "--namespace and --vpc are both set: --namespace names a VPCAttachment, --vpc an inline attachment"), true
	case c.namespace != "":
		first = struct{ name, value string }{"--namespace", c.namespace}
	case c.vpc == "":
		return c.fail(exitUsage, "--namespace (a VPCAttachment's) or --vpc (an inline attachment's) is required"), true
	}
	for _, f := range []struct{ name, value string }{first, {"--attachment", c.attachment}} {
		if err := names.ValidateLabel(f.name, f.value); err != nil {
			return c.fail(exitUsage, "%v", err), true
		}
	}
	if c.container == "" {
		return c.fail(exitUsage, "--container is required: the container ID of the CNI ADD"), true
	}
	if !handoff.ValidReason(c.reason) {
		return c.fail(exitUsage, "--reason %q is not a condition reason: a letter, then letters, digits, '_', ',' or ':' (such as ShuttingDown)", c.reason), true
	}
	node, err := settings.Load(p.getenv)
	if err != nil {
		return c.fail(exitFailed, "%v", err), true
	}
	if err := node.RequireNodeName(); err != nil {
		return c.fail(exitFailed, "%v", err), true
	}
	c.node = node
	c.log, c.closeLog = logging.Open(node.LogFile, "plugin", "galactic-cni", "verb", c.name, "containerID", c.container, "namespace", c.namespace, "vpc", c.vpc, "attachment", c.attachment)
	rec, code, msg := findRecord(state.NewStore(node.StateDir), c.ref(), c.container, c.ifName)
	if code != exitOK {
		return c.fail(code, "%s", msg), true
	}
	c.rec = rec
	return exitOK, false
}

// attachmentRef names an attachment on the command line: a VPCAttachment
// (namespace and name) or an inline attachment (vpc and name).
type attachmentRef struct {
	namespace, vpc, name string
}

func (c *command) ref() attachmentRef {
	return attachmentRef{namespace: c.namespace, vpc: c.vpc, name: c.attachment}
}

// matches says whether a record is of the attachment: by its VPCAttachment
// for an object-backed one, which is then known by the record's UID and
// data-plane names.
func (r attachmentRef) matches(rec state.Record) bool {
	if r.namespace != "" {
		return rec.AttachmentUID != "" && rec.Namespace == r.namespace && rec.AttachmentName == r.name
	}
	return rec.AttachmentUID == "" && rec.VPC == r.vpc && rec.Attachment == r.name
}

func (r attachmentRef) String() string {
	if r.namespace != "" {
		return "VPCAttachment " + r.namespace + "/" + r.name
	}
	return r.vpc + "/" + r.name
}

func (c *command) close() {
	if c.closeLog != nil {
		c.closeLog()
	}
}
