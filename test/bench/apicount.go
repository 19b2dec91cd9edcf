package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

// The programs whose requests are counted, by user agent.
const (
	AgentCNI = "galactic-cni"
	AgentBGP = "galactic-bgp"
	AgentGC  = "galactic-gc"
)

// OpCount is the API requests one operation made.
type OpCount struct {
	Op string
	// Common marks the common ADD and DEL paths the targets are about.
	Common   string
	Requests []Request
	// Note says what a GC pass reported doing.
	Note    string
	Skipped string
}

// Count is the number of requests, of one agent or (empty) of all.
func (o OpCount) Count(agent string) int {
	n := 0
	for _, r := range o.Requests {
		if agent == "" || r.Agent == agent {
			n++
		}
	}
	return n
}

// Describe lists the requests of an agent as "get 404, create 201, list".
func (o OpCount) Describe(agent string) string {
	var parts []string
	for _, r := range o.Requests {
		if r.Agent != agent {
			continue
		}
		s := r.Verb() + " " + r.Resource()
		if r.Status >= 300 {
			s += fmt.Sprintf(" (%d)", r.Status)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// counted runs f and keeps the galactic programs' requests it caused.
func (b *bench) counted(op, common string, f func() (string, error)) error {
	mark := b.proxy.Mark()
	note, err := f()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var reqs []Request
	for _, r := range b.proxy.Since(mark, "") {
		if strings.HasPrefix(r.Agent, "galactic-") {
			reqs = append(reqs, r)
		}
	}
	b.res.Ops = append(b.res.Ops, OpCount{Op: op, Common: common, Requests: reqs, Note: note})
	return nil
}

// gcOnce runs one pass of the real galactic-gc in the node.
func (b *bench) gcOnce(n *node) (Exec, error) {
	return b.run(n, nil, nil, filepath.Join(b.env.BinDir, "galactic-gc"), "--once", "--config", n.ConfigPath)
}

// apiCounts counts, through the proxy, what each kind of operation asks
// of the API server.
func (b *bench) apiCounts() error {
	a, err := b.newNode("api-a")
	if err != nil {
		return err
	}
	nb, err := b.newNode("api-b")
	if err != nil {
		return err
	}
	for _, n := range []*node{a, nb} {
		if err := n.viaProxy(b, true); err != nil {
			return err
		}
		if err := n.WriteConflistFile(galacticConf("bench-api", "api", "api-0", false, true)); err != nil {
			return err
		}
		if err := n.WriteConflistFile(galacticConf("bench-api-h", "apih", "api-h", true, true)); err != nil {
			return err
		}
	}
	if err := a.WriteConflistFile(objectConf("bench-api-o", "bench-api", "api-obj", false, true)); err != nil {
		return err
	}
	objs, err := b.objectChain(a, "bench-api", "api-obj")
	if err != nil {
		return err
	}
	obj := objs[0]
	cs := make([]*harness.Netns, 7)
	for i := range cs {
		if cs[i], err = b.container(); err != nil {
			return err
		}
	}
	cni := func(verb, network string, n *node, c *harness.Netns) func() (string, error) {
		return func() (string, error) { _, err := b.cnitool(n, verb, network, c, ifName); return "", err }
	}
	add := func(n *node, c *harness.Netns) func() (string, error) { return cni("add", "bench-api", n, c) }
	del := func(n *node, c *harness.Netns) func() (string, error) { return cni("del", "bench-api", n, c) }
	gc := func(n *node) func() (string, error) {
		return func() (string, error) {
			e, err := b.gcOnce(n)
			if err != nil {
				return "", err
			}
			rep, err := parseGCLog(e.Stderr)
			return rep.Summary(), err
		}
	}
	steps := []struct {
		op, common string
		f          func() (string, error)
	}{
		{"ADD: first container of the attachment on the node", "ADD", add(a, cs[0])},
		{"ADD: replacement while its predecessor is live (upgrade on one node)", "", add(a, cs[1])},
		{"DEL: predecessor after the replacement (entry removed, advertisement kept)", "", del(a, cs[0])},
		{"DEL: last container of the attachment on the node", "DEL", del(a, cs[1])},
		{"", "", add(a, cs[2])},
		{"move: ADD on the new node (deletes the old node's advertisement)", "", add(nb, cs[3])},
		{"move: late DEL on the old node (its advertisement is already gone)", "", del(a, cs[2])},
		{"", "", del(nb, cs[3])},
		{"", "", add(a, cs[4])},
		{"GC pass: one live attachment, nothing to collect", "", gc(a)},
		{"", "", func() (string, error) { cs[4].Delete(); return "", nil }},
		{"GC pass after a crash (netns gone, no DEL)", "", gc(a)},
		{"GC pass after that", "", gc(a)},
		{"ADD of a VPCAttachment: first container of the attachment on the node", "ADD+object", cni("add", "bench-api-o", a, cs[6])},
		{"DEL of a VPCAttachment: last container of the attachment on the node", "DEL+object", cni("del", "bench-api-o", a, cs[6])},
	}
	for _, s := range steps {
		if s.op == "" {
			if _, err := s.f(); err != nil {
				return err
			}
			continue
		}
		if err := b.counted(s.op, s.common, s.f); err != nil {
			return err
		}
	}
	if err := b.checkReleased(a, "api", "api-0"); err != nil {
		return err
	}
	if err := b.checkReleased(nb, "api", "api-0"); err != nil {
		return err
	}
	if err := b.checkReleased(a, obj.Status.Dataplane.VPC, obj.Status.Dataplane.Attachment); err != nil {
		return err
	}

	// Handoff on, if this build has it.
	if _, err := b.cnitool(a, "add", "bench-api-h", cs[5], ifName); err != nil {
		_, _ = b.cnitool(a, "del", "bench-api-h", cs[5], ifName)
		if !strings.Contains(err.Error(), "not available in this build") {
			return err
		}
		b.res.Ops = append(b.res.Ops, OpCount{Op: "ADD and DEL with handoff on", Skipped: "this build of galactic-cni refuses an enabled handoff"})
	} else {
		if _, err := b.cnitool(a, "del", "bench-api-h", cs[5], ifName); err != nil {
			return err
		}
		for _, s := range []struct {
			op, common string
			f          func() (string, error)
		}{
			{"ADD with handoff: first container, lease free", "ADD+handoff", cni("add", "bench-api-h", a, cs[5])},
			{"GC pass with a live handoff holder", "", gc(a)},
			{"DEL with handoff: last container, lease released", "DEL+handoff", cni("del", "bench-api-h", a, cs[5])},
		} {
			if err := b.counted(s.op, s.common, s.f); err != nil {
				return err
			}
		}
	}
	for _, o := range b.res.Ops {
		if o.Skipped != "" {
			b.say("%-75s skipped: %s", o.Op, o.Skipped)
			continue
		}
		b.say("%-75s %d requests (cni %d, bgp %d, gc %d) %s", o.Op, o.Count(""), o.Count(AgentCNI), o.Count(AgentBGP), o.Count(AgentGC), o.Note)
	}
	return nil
}

// GCReport is what galactic-gc logged about one pass.
type GCReport struct {
	Duration              time.Duration
	EntriesPruned         int
	AdvertisementsDeleted int
	RecordsRemoved        int
	TapsDetached          int
	TapsReclaimed         int
	LeasesRenewed         int
	LeasesReleased        int
	Errors                map[string]int
}

// parseGCLog reads the "gc pass finished" line galactic-gc writes.
func parseGCLog(stderr []byte) (GCReport, error) {
	var r GCReport
	for _, line := range bytes.Split(stderr, []byte("\n")) {
		var l struct {
			Msg                   string         `json:"msg"`
			Duration              string         `json:"duration"`
			EntriesPruned         int            `json:"entriesPruned"`
			AdvertisementsDeleted int            `json:"advertisementsDeleted"`
			RecordsRemoved        int            `json:"recordsRemoved"`
			TapsDetached          int            `json:"tapsDetached"`
			TapsReclaimed         int            `json:"tapsReclaimed"`
			LeasesRenewed         int            `json:"leasesRenewed"`
			LeasesReleased        int            `json:"leasesReleased"`
			Errors                map[string]int `json:"errors"`
		}
		if json.Unmarshal(line, &l) != nil || !strings.HasPrefix(l.Msg, "gc pass finished") {
			continue
		}
		d, err := time.ParseDuration(l.Duration)
		if err != nil {
			return r, fmt.Errorf("galactic-gc logged duration %q: %w", l.Duration, err)
		}
		return GCReport{Duration: d, EntriesPruned: l.EntriesPruned, AdvertisementsDeleted: l.AdvertisementsDeleted,
			RecordsRemoved: l.RecordsRemoved, TapsDetached: l.TapsDetached, TapsReclaimed: l.TapsReclaimed,
			LeasesRenewed: l.LeasesRenewed, LeasesReleased: l.LeasesReleased, Errors: l.Errors}, nil
	}
	return r, fmt.Errorf("galactic-gc logged no pass: %s", strings.TrimSpace(string(stderr)))
}

// Summary says what the pass did, in words.
func (r GCReport) Summary() string {
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", what, n))
		}
	}
	add(r.EntriesPruned, "entries pruned")
	add(r.AdvertisementsDeleted, "advertisements deleted")
	add(r.RecordsRemoved, "records removed")
	add(r.TapsReclaimed, "taps reclaimed")
	add(r.LeasesRenewed, "leases renewed")
	add(r.LeasesReleased, "leases released")
	for _, k := range sortedKeys(r.Errors) {
		add(r.Errors[k], "errors "+k)
	}
	if len(parts) == 0 {
		return "nothing changed"
	}
	return strings.Join(parts, ", ")
}
