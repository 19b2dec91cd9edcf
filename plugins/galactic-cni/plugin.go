package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/logging"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

// plugin is one invocation's environment; main fills it from the process,
// tests build their own.
type plugin struct {
	getenv func(string) string
	now    func() time.Time
	// live reports whether a container netns still exists.
	live func(netns string) bool
	// filter is the node's packet filter; nil is the kernel's.
	filter filter.Filter
	// getAttachment, if set, reads VPCAttachments instead of the API
	// server (tests).
	getAttachment attachmentGetter
}

// invocation is what every verb sets up first: node settings and the log.
type invocation struct {
	node settings.Node
	log  *slog.Logger
	host hostif.Host
	// cs is the API client, made on first use (api).
	cs *client.Clients
}

// api is the invocation's one API client, from the node's kubeconfig; a
// node that cannot have one is code 50.
func (inv *invocation) api() (*client.Clients, *types.Error) {
	if inv.cs != nil {
		return inv.cs, nil
	}
	cfg, err := client.LoadConfig(inv.node.Kubeconfig)
	if err == nil {
		inv.cs, err = client.New(cfg)
	}
	if err != nil {
		return nil, types.NewError(types.ErrPluginNotAvailable, "galactic-cni needs the API server: "+err.Error(), "")
	}
	return inv.cs, nil
}

// resolveOptions are parseConf's options for a verb of args.
func (inv *invocation) resolveOptions(args *skel.CmdArgs, required bool) netconf.ResolveOptions {
	return netconf.ResolveOptions{Required: required, RequireObjects: inv.node.RequireAttachmentObjects, CNIArgs: args.Args}
}

// begin loads the node settings and opens the node log with the
// invocation's identity on every line. Settings that cannot be read still
// get a logger (on stderr) and are returned as a code 50 error.
func (p *plugin) begin(verb string, args *skel.CmdArgs) (*invocation, func(), *types.Error) {
	node, err := settings.Load(p.getenv)
	attrs := []any{"plugin", "galactic-cni", "verb", verb, "containerID", args.ContainerID, "ifName", args.IfName}
	log, closeLog := logging.Open(node.LogFile, attrs...)
	inv := &invocation{node: node, log: log, host: hostif.Host{StateDir: node.StateDir, Live: p.live, Now: p.now, Filter: p.filter}}
	if err != nil {
		return inv, closeLog, types.NewError(types.ErrPluginNotAvailable, "galactic node settings are unreadable: "+err.Error(), "")
	}
	return inv, closeLog, nil
}

// finish writes the verb's one log line with its outcome.
func (inv *invocation) finish(verb string, err error, attrs ...any) {
	if err == nil {
		inv.log.Info(verb, append([]any{"outcome", "ok"}, attrs...)...)
		return
	}
	var e *types.Error
	if errors.As(err, &e) {
		attrs = append(attrs, "code", e.Code)
	}
	inv.log.Error(verb, append([]any{"outcome", "error", "error", err.Error()}, attrs...)...)
}

func confAttrs(c *Config) []any {
	if c == nil {
		return nil
	}
	attrs := []any{"network", c.Name, "mode", c.Mode, "routing", c.Routing}
	if c.Names.Inline != nil {
		return append(attrs, "vpc", c.VPC, "attachment", c.Attachment.Attachment)
	}
	if len(c.Names.Objects) > 0 {
		attrs = append(attrs, "namespace", c.Names.Namespace, "attachments", c.Names.Objects)
	}
	return attrs
}

// spec is the hostif spec of the config's attachment on the container
// interface ifName of the ADD of args.
func (c *Config) spec(args *skel.CmdArgs, ifName string) hostif.Spec {
	s := hostif.Spec{
		Network: c.Name, ContainerID: args.ContainerID, IfName: ifName, Netns: args.Netns,
		VPC: c.VPC, Attachment: c.Attachment.Attachment, Mode: c.Mode, Routing: c.Routing,
		Addresses: c.Addresses, AllowedSourcePrefixes: c.AllowedSourcePrefixes, MTU: c.MTU,
		Standby: c.Standby, WaitSeconds: int32(c.Handoff.Wait / time.Second),
	}
	if ifName != args.IfName {
		s.ChainIfName = args.IfName
	}
	if o := c.Object; o != nil {
		s.Namespace, s.AttachmentName, s.AttachmentUID, s.VNI, s.Announce = o.Namespace, o.Name, o.UID, o.VNI, o.Announce
	}
	return s
}

// vrfProbeName is a device name no attachment can have.
func vrfProbeName() string { return fmt.Sprintf("gp%x", os.Getpid()) }

// routingAvailable fails, with a config error, when the kernel lacks what
// the config's routing asks for.
func routingAvailable(c *Config) *types.Error {
	if c.Routing != routing.KindVRF {
		return nil
	}
	if err := routing.ProbeVRF(vrfProbeName()); err != nil {
		if errors.Is(err, routing.ErrNoVRF) {
			return netconf.InvalidConfig(err.Error())
		}
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}

// setupError maps hostif's errors to CNI codes.
func setupError(err error) *types.Error {
	var busy *hostif.BusyError
	switch {
	case errors.As(err, &busy):
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	case errors.Is(err, routing.ErrNoVRF), errors.Is(err, routing.ErrKindMismatch), errors.Is(err, routing.ErrOverlap):
		return netconf.InvalidConfig(err.Error())
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

func (p *plugin) cmdAdd(args *skel.CmdArgs) (err error) {
	inv, closeLog, terr := p.begin("ADD", args)
	defer closeLog()
	var conf *Config
	var done []attached
	defer func() {
		attrs := confAttrs(conf)
		for _, a := range done {
			attrs = append(attrs, slog.Group(a.ifName, "hostInterface", a.att.Host.Name, "table", a.att.Domain.Table, "adoptedTap", a.att.AdoptedTap))
		}
		inv.finish("ADD", err, attrs...)
	}()
	if terr != nil {
		return terr
	}
	if conf, terr = parseConf(args.StdinData, inv.resolveOptions(args, true)); terr != nil {
		return terr
	}
	if terr = routingAvailable(conf); terr != nil {
		return terr
	}
	ts, terr := p.targets(inv, conf, args)
	if terr != nil {
		return terr
	}
	if done, terr = p.addTargets(inv, args, ts); terr != nil {
		return terr
	}
	rememberAttachments(inv, ts)
	return types.PrintResult(result(args, done), conf.CNIVersion)
}

func ipNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// result is the CNI result of an ADD: for each attachment its host
// interface (and the container end of a veth), its addresses with their
// gateways and its routes: the default routes of the first, and the
// networks of the next.
func result(args *skel.CmdArgs, done []attached) *current.Result {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	for _, a := range done {
		res.Interfaces = append(res.Interfaces, &current.Interface{Name: a.att.Host.Name, Mac: a.att.Host.MAC})
		ifIndex := len(res.Interfaces) - 1
		if a.att.Sandbox != nil {
			res.Interfaces = append(res.Interfaces, &current.Interface{Name: a.att.Sandbox.Name, Mac: a.att.Sandbox.MAC, Sandbox: args.Netns})
			ifIndex++
		}
		for _, p := range a.conf.Addresses {
			idx := ifIndex
			res.IPs = append(res.IPs, &current.IPConfig{Interface: &idx, Address: ipNet(p), Gateway: hostif.Gateway(p).AsSlice()})
		}
		for _, d := range hostif.Routes(a.conf.Addresses, a.ifName != args.IfName) {
			res.Routes = append(res.Routes, &types.Route{Dst: ipNet(d.Dst), GW: d.Via.AsSlice()})
		}
	}
	return res
}

func (p *plugin) cmdDel(args *skel.CmdArgs) (err error) {
	inv, closeLog, terr := p.begin("DEL", args)
	defer closeLog()
	var conf *Config
	var recs []state.Record
	defer func() {
		attrs := confAttrs(conf)
		attrs = append(attrs, "recordFound", len(recs) > 0)
		for _, rec := range recs {
			attrs = append(attrs, slog.Group(rec.IfName, "hostInterface", rec.HostInterface))
		}
		inv.finish("DEL", err, attrs...)
	}()
	if terr != nil {
		return terr
	}
	// DEL works from the records, so a config that no longer validates
	// (its ADD failed, or it changed since) does not block the cleanup,
	// and it needs no API server to find what it removes.
	conf, cerr := parseConf(args.StdinData, inv.resolveOptions(args, false))
	if cerr != nil {
		inv.log.Warn("DEL with an invalid network config; using the node records", "error", cerr.Error())
		conf = nil
	}
	recs, err = inv.host.Store().Invocation(args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "reading the node records: "+err.Error(), "")
	}
	// Nothing recorded: ADD never completed here, or DEL already ran.
	var errs []error
	// The leases are read while the host side goes, so that a successor
	// waiting for one is given it by a single write after its interface
	// is gone.
	prepared := p.prepareReleases(inv, recs)
	for i, rec := range recs {
		// The lease goes once the host interface carries nothing, while
		// the kernel deletes it: a successor on another node attaches
		// meanwhile, one on this node waits for the node lock, so none
		// attaches while this interface still works.
		var released func() error
		err := inv.host.TeardownThen(rec, func() {
			released = async(func() error { return p.releaseRecordHandoff(inv, rec, prepared(i)) })
		})
		errs = append(errs, err, released())
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}

func (p *plugin) cmdCheck(args *skel.CmdArgs) (err error) {
	inv, closeLog, terr := p.begin("CHECK", args)
	defer closeLog()
	var conf *Config
	defer func() { inv.finish("CHECK", err, confAttrs(conf)...) }()
	if terr != nil {
		return terr
	}
	if conf, terr = parseConf(args.StdinData, inv.resolveOptions(args, true)); terr != nil {
		return terr
	}
	if conf.PrevResult == nil {
		return netconf.InvalidConfig("CHECK needs a prevResult: the runtime passes the result of ADD")
	}
	recs, err := inv.host.Store().Invocation(args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "reading the node records: "+err.Error(), "")
	}
	if len(recs) == 0 {
		return types.NewError(types.ErrInternal, fmt.Sprintf("no node record for container %s interface %s: ADD did not complete on this node", args.ContainerID, args.IfName), "")
	}
	var diffs []string
	var specs []hostif.Spec
	if conf.Names.Inline != nil {
		diffs = append(diffs, recordDiffs(conf, args, recs[0])...)
		specs = append(specs, checkSpec(conf, args, recs[0]))
	} else {
		// The records say what ADD made of the VPCAttachments; CHECK
		// needs no API server to compare the kernel with them.
		diffs = append(diffs, objectRecordDiffs(conf, args, recs)...)
		for _, rec := range recs {
			specs = append(specs, hostif.RecordSpec(rec))
		}
	}
	diffs = append(diffs, prevResultDiffs(conf, args, specs)...)
	for _, s := range specs {
		if err := inv.host.Check(s); err != nil {
			diffs = append(diffs, err.Error())
		}
	}
	if len(diffs) > 0 {
		return types.NewError(types.ErrInternal, "kernel state differs from the config: "+strings.Join(diffs, "; "), "")
	}
	return nil
}

// recordDiffs compares the node record with an inline config.
func recordDiffs(c *Config, args *skel.CmdArgs, rec state.Record) []string {
	var diffs []string
	field := func(name, have, want string) {
		if have != want {
			diffs = append(diffs, fmt.Sprintf("record has %s %q, the config %q", name, have, want))
		}
	}
	field("vpc", rec.VPC, c.VPC)
	field("attachment", rec.Attachment, c.Attachment.Attachment)
	field("attachmentUID", rec.AttachmentUID, "")
	field("mode", rec.Mode, c.Mode)
	field("routing", rec.Routing, c.Routing)
	field("netns", rec.Netns, args.Netns)
	field("addresses", strings.Join(rec.Addresses, ","), strings.Join(prefixStrings(c.Addresses), ","))
	field("allowedSourcePrefixes", strings.Join(rec.AllowedSourcePrefixes, ","), strings.Join(prefixStrings(c.AllowedSourcePrefixes), ","))
	return diffs
}

// objectRecordDiffs compares the records of an ADD with the VPCAttachments
// the config names, in order, and with the stanza's mode and routing.
func objectRecordDiffs(c *Config, args *skel.CmdArgs, recs []state.Record) []string {
	var diffs []string
	if len(recs) != len(c.Names.Objects) {
		diffs = append(diffs, fmt.Sprintf("the records hold %d attachments, the config names %d (%v)", len(recs), len(c.Names.Objects), c.Names.Objects))
	}
	for i, rec := range recs {
		ifName := args.IfName
		if i > 0 {
			ifName = names.SecondaryIfName(i)
		}
		if i < len(c.Names.Objects) && (rec.Namespace != c.Names.Namespace || rec.AttachmentName != c.Names.Objects[i] || rec.IfName != ifName) {
			diffs = append(diffs, fmt.Sprintf("%s holds %s, the config names VPCAttachment %s/%s there", rec.IfName, recordName(rec), c.Names.Namespace, c.Names.Objects[i]))
		}
		if rec.Mode != c.Mode || rec.Routing != c.Routing || rec.Netns != args.Netns {
			diffs = append(diffs, fmt.Sprintf("the record of %s has mode %s, routing %s, netns %s; the config %s, %s, %s", rec.IfName, rec.Mode, rec.Routing, rec.Netns, c.Mode, c.Routing, args.Netns))
		}
	}
	return diffs
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// prevResultDiffs compares the addresses and interfaces of prevResult with
// the specs of the ADD's attachments.
func prevResultDiffs(c *Config, args *skel.CmdArgs, specs []hostif.Spec) []string {
	res, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return []string{"prevResult cannot be read: " + err.Error()}
	}
	var diffs []string
	var have, want []string
	for _, ip := range res.IPs {
		have = append(have, ip.Address.String())
	}
	for _, s := range specs {
		want = append(want, prefixStrings(s.Addresses)...)
	}
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		diffs = append(diffs, fmt.Sprintf("prevResult has addresses %v, the config %v", have, want))
	}
	for _, s := range specs {
		host := s.HostInterface()
		if !slices.ContainsFunc(res.Interfaces, func(i *current.Interface) bool { return i.Name == host && i.Sandbox == "" }) {
			diffs = append(diffs, fmt.Sprintf("prevResult lacks host interface %s", host))
		}
		if s.Mode == names.ModeVeth && !slices.ContainsFunc(res.Interfaces, func(i *current.Interface) bool { return i.Name == s.IfName && i.Sandbox == args.Netns }) {
			diffs = append(diffs, fmt.Sprintf("prevResult lacks container interface %s in %s", s.IfName, args.Netns))
		}
	}
	return diffs
}

func (p *plugin) cmdStatus(args *skel.CmdArgs) (err error) {
	inv, closeLog, terr := p.begin("STATUS", args)
	defer closeLog()
	var conf *Config
	defer func() { inv.finish("STATUS", err, confAttrs(conf)...) }()
	if terr != nil {
		return terr
	}
	if conf, terr = parseConf(args.StdinData, inv.resolveOptions(args, false)); terr != nil {
		return terr
	}
	unavailable := func(msg string) error { return types.NewError(types.ErrPluginNotAvailable, msg, "") }
	if err := os.MkdirAll(inv.node.StateDir, 0o700); err != nil {
		return unavailable(fmt.Sprintf("state dir %s is not usable: %v", inv.node.StateDir, err))
	}
	if conf.Mode == names.ModeTap {
		if _, err := os.Stat("/dev/net/tun"); err != nil {
			return unavailable("tap mode needs /dev/net/tun: " + err.Error())
		}
	}
	if conf.Routing == routing.KindVRF {
		if err := routing.ProbeVRF(vrfProbeName()); err != nil {
			return unavailable(err.Error())
		}
	}
	if conf.Handoff.Enabled {
		// The lease's name does not matter here: building a lock proves
		// the node name and the kubeconfig usable, without an API call.
		if _, terr := leaseLock(inv, conf.VPC+".status", conf.Attachment.Attachment, conf.leaseSeconds(), handoff.Identity{}); terr != nil {
			return terr
		}
	}
	return nil
}

func (p *plugin) cmdGC(args *skel.CmdArgs) (err error) {
	inv, closeLog, terr := p.begin("GC", args)
	defer closeLog()
	var conf *Config
	removed := 0
	defer func() { inv.finish("GC", err, append(confAttrs(conf), "removed", removed)...) }()
	if terr != nil {
		return terr
	}
	if conf, terr = parseConf(args.StdinData, inv.resolveOptions(args, false)); terr != nil {
		return terr
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	recs, listErr := inv.host.Store().List()
	errs := []error{listErr}
	for _, rec := range recs {
		// A pod's further attachments (net1, ...) are valid with the
		// attachment of their ADD's CNI_IFNAME.
		if rec.Network != conf.Name || valid[types.GCAttachment{ContainerID: rec.ContainerID, IfName: rec.Chain()}] {
			continue
		}
		err := inv.host.Teardown(rec)
		err = errors.Join(err, p.releaseRecordHandoff(inv, rec, nil))
		if err != nil {
			errs = append(errs, fmt.Errorf("container %s interface %s: %w", rec.ContainerID, rec.IfName, err))
			continue
		}
		removed++
		inv.log.Info("GC removed an attachment", "removedContainerID", rec.ContainerID, "removedIfName", rec.IfName, "hostInterface", rec.HostInterface)
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "GC: "+err.Error(), "")
	}
	return nil
}
