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
	name                               string
	vpc, attachment, container, ifName string
	reason                             string
	node                               settings.Node
	log                                *slog.Logger
	closeLog                           func()
	rec                                state.Record
	stderr                             io.Writer
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
	fs.StringVar(&c.vpc, "vpc", "", "the attachment's VPC (required)")
	fs.StringVar(&c.attachment, "attachment", "", "the VPC attachment (required)")
	fs.StringVar(&c.container, "container", "", "the container ID the runtime passed to CNI ADD (required)")
	fs.StringVar(&c.ifName, "ifname", "", "the CNI_IFNAME of that ADD; needed only when the container has the attachment on several interfaces")
	fs.StringVar(&c.reason, "reason", "", "a condition reason such as Booting or ShuttingDown (optional)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: galactic-cni %s --vpc VPC --attachment ATTACHMENT --container ID [--ifname IF] [--reason Reason]%s\n", c.name, usage)
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
	for _, f := range []struct{ name, value string }{{"--vpc", c.vpc}, {"--attachment", c.attachment}} {
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
	c.log, c.closeLog = logging.Open(node.LogFile, "plugin", "galactic-cni", "verb", c.name, "containerID", c.container, "vpc", c.vpc, "attachment", c.attachment)
	rec, code, msg := findRecord(state.NewStore(node.StateDir), c.vpc, c.attachment, c.container, c.ifName)
	if code != exitOK {
		return c.fail(code, "%s", msg), true
	}
	c.rec = rec
	return exitOK, false
}

func (c *command) close() {
	if c.closeLog != nil {
		c.closeLog()
	}
}
