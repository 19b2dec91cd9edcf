package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/advert"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/logging"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

// timeouts bound each verb's API work. CNI gives plugins no deadline, so
// these are ours: ADD may wait out a busy API server, DEL must not hold
// up galactic-cni's DEL behind it for long.
type timeouts struct {
	add, cleanup, del, check, status, gc time.Duration
}

var defaultTimeouts = timeouts{
	add:     20 * time.Second,
	cleanup: 5 * time.Second,
	del:     5 * time.Second,
	check:   10 * time.Second,
	status:  5 * time.Second,
	gc:      20 * time.Second,
}

// plugin is one process's environment: main fills it from the process,
// tests build their own.
type plugin struct {
	getenv func(string) string
	stdout io.Writer
	now    func() time.Time
	// live reports whether an advertisement entry's netns still exists.
	live func(netns string) bool
	// connect returns the BGPAdvertisement client of the node's namespace;
	// each verb calls it at most once.
	connect func(settings.Node) (advert.API, error)
	// apiRequests, if set, counts the API requests made so far; each
	// verb's log line reports it.
	apiRequests func() int64
	timeouts    timeouts
	// sleep, if set, replaces the advertiser's backoff timer.
	sleep func(ctx context.Context, d time.Duration) error
}

// connect builds the process's one API client from the node's kubeconfig.
func connect(n settings.Node) (advert.API, error) { return connectCounting(n, nil) }

// connectCounting is connect with every HTTP request counted in n.
func connectCounting(n settings.Node, count *atomic.Int64) (advert.API, error) {
	cfg, err := client.LoadConfig(n.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if count != nil {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				count.Add(1)
				return rt.RoundTrip(r)
			})
		})
	}
	c, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	return c.BGPAdvertisements(n.Namespace), nil
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// invocation is one verb's settings, log and outcome.
type invocation struct {
	p       *plugin
	verb    string
	node    settings.Node
	nodeErr error
	log     *slog.Logger
	closeFn func()
	start   time.Time
	// attrs describe the outcome; they go on the verb's one log line.
	attrs []any
	// warn marks a verb that succeeded without doing all it should.
	warn bool
}

func (p *plugin) begin(verb string, args *skel.CmdArgs) *invocation {
	inv := &invocation{p: p, verb: verb, start: p.now()}
	inv.node, inv.nodeErr = settings.Load(p.getenv)
	attrs := []any{"plugin", "galactic-bgp", "verb", verb}
	if args.ContainerID != "" {
		attrs = append(attrs, "containerID", args.ContainerID, "ifName", args.IfName)
	}
	inv.log, inv.closeFn = logging.Open(inv.node.LogFile, attrs...)
	return inv
}

func (inv *invocation) set(attrs ...any) { inv.attrs = append(inv.attrs, attrs...) }

// finish writes the verb's one log line and closes the log.
func (inv *invocation) finish(err error) {
	defer inv.closeFn()
	attrs := append(inv.attrs, "durationMs", inv.p.now().Sub(inv.start).Milliseconds())
	if inv.p.apiRequests != nil {
		attrs = append(attrs, "apiRequests", inv.p.apiRequests())
	}
	var terr *types.Error
	switch {
	case errors.As(err, &terr):
		inv.log.Error(inv.verb, append(attrs, "outcome", "error", "code", terr.Code, "error", terr.Error())...)
	case err != nil:
		inv.log.Error(inv.verb, append(attrs, "outcome", "error", "error", err.Error())...)
	case inv.warn:
		inv.log.Warn(inv.verb, attrs...)
	default:
		inv.log.Info(inv.verb, attrs...)
	}
}

// resolveOptions are parseConf's options for a verb of args.
func (inv *invocation) resolveOptions(args *skel.CmdArgs, required bool) netconf.ResolveOptions {
	return netconf.ResolveOptions{Required: required, RequireObjects: inv.node.RequireAttachmentObjects, CNIArgs: args.Args}
}

// setNames puts what the config names on the verb's log line.
func (inv *invocation) setNames(c *Config) {
	if c.Names.Inline != nil {
		inv.set("vpc", c.VPC, "attachment", c.Attachment.Attachment)
	} else if len(c.Names.Objects) > 0 {
		inv.set("namespace", c.Names.Namespace, "attachments", c.Names.Objects)
	}
}

// attachmentConf parses the stanza of a verb that needs the previous
// result, the attachment and the node settings (ADD, CHECK).
func (inv *invocation) attachmentConf(args *skel.CmdArgs) (*Config, *types.Error) {
	conf, terr := parseConf(args.StdinData, true, inv.resolveOptions(args, true))
	if terr != nil {
		return nil, terr
	}
	inv.setNames(conf)
	if terr := inv.requireNode(); terr != nil {
		return nil, terr
	}
	return conf, nil
}

// requireNode returns the code 50 error STATUS would give when the node
// settings cannot say which node this is.
func (inv *invocation) requireNode() *types.Error {
	if inv.nodeErr != nil {
		return types.NewError(types.ErrPluginNotAvailable, "galactic node settings are unusable: "+inv.nodeErr.Error(), "")
	}
	if err := inv.node.RequireNodeName(); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return nil
}

// advertiser connects to the API server, or says why it cannot (code 50).
func (inv *invocation) advertiser() (*advert.Advertiser, *types.Error) {
	if err := inv.requireNode(); err != nil {
		return nil, err
	}
	api, err := inv.p.connect(inv.node)
	if err != nil {
		return nil, types.NewError(types.ErrPluginNotAvailable, "galactic-bgp cannot build its API client: "+err.Error(), "")
	}
	return &advert.Advertiser{API: api, Live: inv.p.live, Sleep: inv.p.sleep}, nil
}

func (inv *invocation) key(c *Config) advert.Key {
	return advert.Key{VPC: c.VPC, Attachment: c.Attachment.Attachment, Node: inv.node.NodeName}
}

// apiError maps an API failure to a CNI error: a refusal that retrying
// cannot fix says so, anything else is worth trying again later.
func apiError(err error, what string) *types.Error {
	msg := what + ": " + err.Error()
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return types.NewError(types.ErrPluginNotAvailable, msg+" (check the node's kubeconfig and RBAC for bgpadvertisements)", "")
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return types.NewError(types.ErrInternal, msg, "")
	}
	return types.NewError(types.ErrTryAgainLater, msg, "")
}

func entryIDs(entries []v1alpha1.ContainerEntry) []string {
	ids := []string{}
	for _, e := range entries {
		ids = append(ids, e.ContainerID+"/"+e.IfName)
	}
	return ids
}

func (p *plugin) cmdAdd(args *skel.CmdArgs) (err error) {
	inv := p.begin("ADD", args)
	defer func() { inv.finish(err) }()
	conf, terr := inv.attachmentConf(args)
	if terr != nil {
		return terr
	}
	if conf.Names.Inline == nil {
		return p.addObjects(inv, conf, args)
	}
	prefixes := advert.HostPrefixes(conf.IPs)
	rec, terr := checkRecord(inv.node, args, conf, prefixes)
	if terr != nil {
		return terr
	}
	if conf.Routing.Announce == v1alpha1.AnnounceWhenAvailable && rec.Holder == "" && !rec.Standby {
		return netconf.InvalidConfig(`announce "whenAvailable" needs the handoff lease: enable "handoff" in the galactic-cni stanza, or use announce "always"`)
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	key := inv.key(conf)
	inv.set("advertisement", key.Name(), "prefixes", prefixes)

	if len(prefixes) == 0 {
		// The workload manages its own addressing: there is no route to
		// publish, so there is no entry either.
		inv.set("outcome", "nothing to advertise")
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.add)
		res, err := publisher(adv, rec)(ctx, key, v1alpha1.ContainerEntry{
			ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
			Prefixes: prefixes, HolderGeneration: rec.HolderGeneration, Standby: rec.Standby,
		}, conf.Routing)
		cancel()
		inv.set("outcome", string(res.Outcome), "pruned", entryIDs(res.Removed), "conflicts", res.Conflicts)
		if err != nil {
			return apiError(err, "publishing the advertisement entry")
		}
	}

	if rec.Standby {
		// A live-migration target: the source on another node is the
		// holder and keeps its advertisement until its own DEL.
		inv.set("standby", true)
		return conf.Prev.PrintTo(p.stdout)
	}
	// A predecessor on another node whose DEL never ran: its advertisement
	// would keep routers flapping between the nodes. Best effort only.
	ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.cleanup)
	deleted, err := adv.DeleteOthers(ctx, key)
	cancel()
	inv.set("deletedOthers", deleted)
	if err != nil {
		inv.warn = true
		inv.set("deleteOthersError", err.Error())
	}
	return conf.Prev.PrintTo(p.stdout)
}

// publisher is how an ADD publishes rec's entry. The handoff lease's
// holder is the attachment's only runtime: its predecessor on this node, if
// any, released its entry before the lease, so the advertisement is
// created without a read first.
func publisher(adv *advert.Advertiser, rec state.Record) func(context.Context, advert.Key, v1alpha1.ContainerEntry, advert.Routing) (advert.Result, error) {
	if rec.Holder != "" && !rec.Standby {
		return adv.PublishNew
	}
	return adv.Publish
}

// checkRecord compares prevResult with what galactic-cni recorded for this
// container and returns the record (the zero record when there is none).
func checkRecord(node settings.Node, args *skel.CmdArgs, conf *Config, prefixes []v1alpha1.Prefix) (state.Record, *types.Error) {
	rec, ok, err := state.NewStore(node.StateDir).Get(args.ContainerID, args.IfName)
	if err != nil {
		return state.Record{}, types.NewError(types.ErrIOFailure, "cannot read galactic-cni's record of this container: "+err.Error(), "")
	}
	if !ok {
		return state.Record{}, nil
	}
	if rec.VPC != conf.VPC || rec.Attachment != conf.Attachment.Attachment || rec.AttachmentUID != "" {
		return state.Record{}, netconf.InvalidConfig(fmt.Sprintf("galactic-bgp names %s/%s but galactic-cni attached this container to %s/%s: both stanzas must name the same vpc and attachment",
			conf.VPC, conf.Attachment.Attachment, rec.VPC, rec.Attachment))
	}
	if len(rec.Addresses) > 0 && len(prefixes) == 0 {
		return state.Record{}, netconf.InvalidConfig(fmt.Sprintf("prevResult has no IPs although galactic-cni configured %v for this container: galactic-bgp must follow galactic-cni, and any plugin between them must pass the IPs on", rec.Addresses))
	}
	return rec, nil
}

func (p *plugin) cmdDel(args *skel.CmdArgs) (err error) {
	inv := p.begin("DEL", args)
	defer func() { inv.finish(err) }()
	// DEL always succeeds: galactic-cni's DEL runs after this one (the
	// chain runs in reverse) and must get to remove the host interface.
	// What is not released here, the node GC releases.
	conf, terr := parseConf(args.StdinData, false, inv.resolveOptions(args, false))
	// galactic-cni's records, still there (its DEL comes next), say
	// which VPCAttachments ADD published, config or not.
	recs, rerr := state.NewStore(inv.node.StateDir).Invocation(args.ContainerID, args.IfName)
	recs = slices.DeleteFunc(recs, func(r state.Record) bool { return r.AttachmentUID == "" })
	if rerr != nil {
		inv.set("recordsError", rerr.Error())
	}
	if len(recs) > 0 {
		return p.delObjects(inv, args, recs)
	}
	if terr != nil || conf.Names.Inline == nil {
		// ADD rejects the same stanza before publishing, and published
		// nothing for VPCAttachments without records.
		inv.warn = terr != nil
		reason := "no record of a VPCAttachment"
		if terr != nil {
			reason = terr.Msg
		}
		inv.set("outcome", "nothing to release", "reason", reason)
		return nil
	}
	inv.setNames(conf)
	adv, terr := inv.advertiser()
	if terr != nil {
		inv.warn = true
		inv.set("outcome", "not released; left for the node GC", "reason", terr.Msg)
		return nil
	}
	key := inv.key(conf)
	inv.set("advertisement", key.Name())
	ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.del)
	defer cancel()
	res, err := adv.Release(ctx, key, args.ContainerID, args.IfName)
	inv.set("conflicts", res.Conflicts)
	if err != nil {
		inv.warn = true
		inv.set("outcome", "not released; left for the node GC", "reason", err.Error())
		return nil
	}
	inv.set("outcome", string(res.Outcome), "released", entryIDs(res.Removed))
	return nil
}

func (p *plugin) cmdCheck(args *skel.CmdArgs) (err error) {
	inv := p.begin("CHECK", args)
	defer func() { inv.finish(err) }()
	conf, terr := inv.attachmentConf(args)
	if terr != nil {
		return terr
	}
	if conf.Names.Inline == nil {
		return p.checkObjects(inv, conf, args)
	}
	want := advert.HostPrefixes(conf.IPs)
	if len(want) == 0 {
		inv.set("outcome", "nothing to advertise")
		return nil
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	key := inv.key(conf)
	ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.check)
	defer cancel()
	obj, err := adv.API.Get(ctx, key.Name(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s does not exist: this node does not advertise %v", key.Name(), want), "")
	}
	if err != nil {
		return apiError(err, "reading advertisement "+key.Name())
	}
	i := slices.IndexFunc(obj.Spec.Containers, func(e v1alpha1.ContainerEntry) bool {
		return e.ContainerID == args.ContainerID && e.IfName == args.IfName
	})
	if i < 0 {
		return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s has no entry for container %s interface %s", key.Name(), args.ContainerID, args.IfName), "")
	}
	e := obj.Spec.Containers[i]
	if got := advert.SortPrefixes(e.Prefixes); !slices.Equal(got, want) {
		return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s lists %v for this container, prevResult has %v", key.Name(), got, want), "")
	}
	if e.Netns != args.Netns {
		return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s records netns %q for this container, not %q", key.Name(), e.Netns, args.Netns), "")
	}
	for _, p := range want {
		if !slices.Contains(obj.Spec.Prefixes, p) {
			return types.NewError(types.ErrInternal, fmt.Sprintf("advertisement %s does not advertise %s in spec.prefixes", key.Name(), p), "")
		}
	}
	inv.set("outcome", "published", "advertisement", key.Name())
	return nil
}

func (p *plugin) cmdStatus(args *skel.CmdArgs) (err error) {
	inv := p.begin("STATUS", args)
	defer func() { inv.finish(err) }()
	if _, terr := parseConf(args.StdinData, false, inv.resolveOptions(args, false)); terr != nil {
		return terr
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	// One cheap read proves the API server answers and the node may read
	// its advertisements.
	ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.status)
	defer cancel()
	if _, err := adv.API.List(ctx, metav1.ListOptions{LabelSelector: names.NodeSelector(inv.node.NodeName), Limit: 1}); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "the API server cannot be used: "+err.Error(), "")
	}
	inv.set("outcome", "available")
	return nil
}

func (p *plugin) cmdGC(args *skel.CmdArgs) (err error) {
	inv := p.begin("GC", args)
	defer func() { inv.finish(err) }()
	conf, terr := parseConf(args.StdinData, false, inv.resolveOptions(args, false))
	if terr != nil {
		return terr
	}
	inv.setNames(conf)
	inv.set("valid", len(conf.ValidAttachments))
	if len(conf.Names.Objects) > 0 {
		return p.gcObjects(inv, conf)
	}
	if conf.Names.Inline == nil {
		// A network config shared by pods that name their attachments in
		// annotations: GC has no annotations, and galactic-gc prunes
		// this node's dead entries instead.
		inv.set("outcome", "no attachment in the network config; left to galactic-gc")
		return nil
	}
	adv, terr := inv.advertiser()
	if terr != nil {
		return terr
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	// The valid list covers this network only, so GC touches only this
	// network's attachment on this node.
	key := inv.key(conf)
	inv.set("advertisement", key.Name())
	ctx, cancel := context.WithTimeout(context.Background(), p.timeouts.gc)
	defer cancel()
	res, err := adv.Remove(ctx, key, func(e v1alpha1.ContainerEntry) bool {
		return !valid[types.GCAttachment{ContainerID: e.ContainerID, IfName: e.IfName}]
	})
	inv.set("outcome", string(res.Outcome), "removed", entryIDs(res.Removed), "conflicts", res.Conflicts)
	if err != nil {
		return apiError(err, "removing entries not in cni.dev/valid-attachments")
	}
	return nil
}
