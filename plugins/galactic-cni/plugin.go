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

	"github.com/galactic-cni/galactic/pkg/filter"
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
}

// invocation is what every verb sets up first: node settings and the log.
type invocation struct {
	node settings.Node
	log  *slog.Logger
	host hostif.Host
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
	return []any{"network", c.Name, "vpc", c.VPC, "attachment", c.Attachment.Attachment, "mode", c.Mode, "routing", c.Routing}
}

func (c *Config) spec(args *skel.CmdArgs) hostif.Spec {
	return hostif.Spec{
		Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
		VPC: c.VPC, Attachment: c.Attachment.Attachment, Mode: c.Mode, Routing: c.Routing,
		Addresses: c.Addresses, AllowedSourcePrefixes: c.AllowedSourcePrefixes, MTU: c.MTU,
		Standby: c.Standby, WaitSeconds: int32(c.Handoff.Wait / time.Second),
	}
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
	var att *hostif.Attached
	defer func() {
		attrs := confAttrs(conf)
		if att != nil {
			attrs = append(attrs, "hostInterface", att.Host.Name, "table", att.Domain.Table, "adoptedTap", att.AdoptedTap)
		}
		inv.finish("ADD", err, attrs...)
	}()
	if terr != nil {
		return terr
	}
	if conf, terr = parseConf(args.StdinData, true); terr != nil {
		return terr
	}
	if terr = routingAvailable(conf); terr != nil {
		return terr
	}
	lease, terr := p.acquireHandoff(inv, conf, args)
	if terr != nil {
		return terr
	}
	spec := conf.spec(args)
	spec.Holder, spec.HolderGeneration, spec.LeaseSeconds = lease.holder, lease.generation, lease.seconds
	att, err = inv.host.Setup(spec)
	if err != nil {
		p.releaseHandoff(inv, conf, args, lease)
		return setupError(err)
	}
	return types.PrintResult(result(conf, args, att), conf.CNIVersion)
}

func ipNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// result is the CNI result of an ADD: the host interface (and the
// container end of a veth), the workload's addresses with their gateways,
// and its default routes.
func result(c *Config, args *skel.CmdArgs, att *hostif.Attached) *current.Result {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	res.Interfaces = []*current.Interface{{Name: att.Host.Name, Mac: att.Host.MAC}}
	ifIndex := 0
	if att.Sandbox != nil {
		res.Interfaces = append(res.Interfaces, &current.Interface{Name: att.Sandbox.Name, Mac: att.Sandbox.MAC, Sandbox: args.Netns})
		ifIndex = 1
	}
	for _, p := range c.Addresses {
		idx := ifIndex
		res.IPs = append(res.IPs, &current.IPConfig{Interface: &idx, Address: ipNet(p), Gateway: hostif.Gateway(p).AsSlice()})
	}
	for _, d := range hostif.Defaults(c.Addresses) {
		res.Routes = append(res.Routes, &types.Route{Dst: ipNet(d.Dst), GW: d.Via.AsSlice()})
	}
	return res
}

func (p *plugin) cmdDel(args *skel.CmdArgs) (err error) {
	inv, closeLog, terr := p.begin("DEL", args)
	defer closeLog()
	var conf *Config
	var rec state.Record
	var found bool
	defer func() {
		attrs := confAttrs(conf)
		attrs = append(attrs, "recordFound", found)
		if found {
			attrs = append(attrs, "hostInterface", rec.HostInterface)
		}
		inv.finish("DEL", err, attrs...)
	}()
	if terr != nil {
		return terr
	}
	// DEL works from the record, so a config that no longer validates
	// (its ADD failed, or it changed since) does not block the cleanup.
	conf, cerr := parseConf(args.StdinData, true)
	if cerr != nil {
		inv.log.Warn("DEL with an invalid network config; using the node record", "error", cerr.Error())
		conf = nil
	}
	rec, found, err = inv.host.Store().Get(args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "reading the node record: "+err.Error(), "")
	}
	if !found {
		// Nothing recorded: ADD never completed here, or DEL already ran.
		return nil
	}
	// Detach before releasing the lease, so that a successor never
	// attaches while this host interface is still there.
	var errs []error
	if err := inv.host.Teardown(rec); err != nil {
		errs = append(errs, err)
	}
	if err := p.releaseRecordHandoff(inv, rec); err != nil {
		errs = append(errs, err)
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
	if conf, terr = parseConf(args.StdinData, true); terr != nil {
		return terr
	}
	if conf.PrevResult == nil {
		return netconf.InvalidConfig("CHECK needs a prevResult: the runtime passes the result of ADD")
	}
	rec, found, err := inv.host.Store().Get(args.ContainerID, args.IfName)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "reading the node record: "+err.Error(), "")
	}
	if !found {
		return types.NewError(types.ErrInternal, fmt.Sprintf("no node record for container %s interface %s: ADD did not complete on this node", args.ContainerID, args.IfName), "")
	}
	var diffs []string
	diffs = append(diffs, recordDiffs(conf, args, rec)...)
	diffs = append(diffs, prevResultDiffs(conf, args)...)
	if err := inv.host.Check(checkSpec(conf, args, rec)); err != nil {
		diffs = append(diffs, err.Error())
	}
	if len(diffs) > 0 {
		return types.NewError(types.ErrInternal, "kernel state differs from the config: "+strings.Join(diffs, "; "), "")
	}
	return nil
}

// recordDiffs compares the node record with the config.
func recordDiffs(c *Config, args *skel.CmdArgs, rec state.Record) []string {
	var diffs []string
	field := func(name, have, want string) {
		if have != want {
			diffs = append(diffs, fmt.Sprintf("record has %s %q, the config %q", name, have, want))
		}
	}
	field("vpc", rec.VPC, c.VPC)
	field("attachment", rec.Attachment, c.Attachment.Attachment)
	field("mode", rec.Mode, c.Mode)
	field("routing", rec.Routing, c.Routing)
	field("netns", rec.Netns, args.Netns)
	field("addresses", strings.Join(rec.Addresses, ","), strings.Join(prefixStrings(c.Addresses), ","))
	field("allowedSourcePrefixes", strings.Join(rec.AllowedSourcePrefixes, ","), strings.Join(prefixStrings(c.AllowedSourcePrefixes), ","))
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
// the config.
func prevResultDiffs(c *Config, args *skel.CmdArgs) []string {
	res, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return []string{"prevResult cannot be read: " + err.Error()}
	}
	var diffs []string
	var have []string
	for _, ip := range res.IPs {
		have = append(have, ip.Address.String())
	}
	want := prefixStrings(c.Addresses)
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		diffs = append(diffs, fmt.Sprintf("prevResult has addresses %v, the config %v", have, want))
	}
	host := names.HostInterface(c.Mode, c.VPC, c.Attachment.Attachment)
	if !slices.ContainsFunc(res.Interfaces, func(i *current.Interface) bool { return i.Name == host && i.Sandbox == "" }) {
		diffs = append(diffs, fmt.Sprintf("prevResult lacks host interface %s", host))
	}
	if c.Mode == names.ModeVeth && !slices.ContainsFunc(res.Interfaces, func(i *current.Interface) bool { return i.Name == args.IfName && i.Sandbox == args.Netns }) {
		diffs = append(diffs, fmt.Sprintf("prevResult lacks container interface %s in %s", args.IfName, args.Netns))
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
	if conf, terr = parseConf(args.StdinData, false); terr != nil {
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
		if _, terr := leaseLock(inv, conf.VPC, conf.Attachment.Attachment, int32(conf.Handoff.Lease/time.Second)); terr != nil {
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
	if conf, terr = parseConf(args.StdinData, false); terr != nil {
		return terr
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	recs, listErr := inv.host.Store().List()
	errs := []error{listErr}
	for _, rec := range recs {
		if rec.Network != conf.Name || valid[types.GCAttachment{ContainerID: rec.ContainerID, IfName: rec.IfName}] {
			continue
		}
		err := inv.host.Teardown(rec)
		err = errors.Join(err, p.releaseRecordHandoff(inv, rec))
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
