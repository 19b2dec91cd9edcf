package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
	"github.com/galactic-cni/galactic/test/vm"
)

// MigrationResult is one run of the live-migration section: one guest
// moved back and forth between two nodes under a 10 ms pinger from a
// third, the routes going through Reflector.
type MigrationResult struct {
	Accel     string
	Reflector string
	// Blackout is the longest time between two answered pings around each
	// migration; QEMUDowntime qemu's own measure of the pause; Galactic
	// the source's release returning until the client node's kernel route
	// changed; Release and Promote the two commands' wall times.
	Blackout, QEMUDowntime, Galactic, Release, Promote Sample
	// RouteChanges is how often the client node's route changed in all.
	RouteChanges int
	Skipped      string
}

const (
	migrationVPC  = "mig"
	migrationRuns = 10
	migrationPing = 10 * time.Millisecond
)

// Reflectors of the live-migration runs.
const (
	viaFRR      = "FRR"
	viaGalactic = "galactic"
)

// liveMigration runs the live-migration section with the reference
// driver of test/migration, once through FRR as route reflector and once
// through galactic's reflector, in separate fabrics with their own nodes.
func (b *bench) liveMigration() error {
	for i, via := range []string{viaFRR, viaGalactic} {
		r := &MigrationResult{Reflector: via}
		b.res.Migration = append(b.res.Migration, r)
		if err := b.migrateVia(r, i); err != nil {
			return fmt.Errorf("through %s: %w", via, err)
		}
	}
	return nil
}

// migrateVia runs the ten migrations of run i through r.Reflector.
func (b *bench) migrateVia(r *MigrationResult, i int) error {
	skip := func(why string) error {
		r.Skipped = why
		b.say("live migration: skipped: %s", why)
		return nil
	}
	if _, err := os.Stat(harness.FRRBgpd); err != nil {
		return skip("FRR is not installed")
	}
	if err := vm.Available(); err != nil {
		return skip(err.Error())
	}
	assets, err := vm.EnsureGuestAssets(b.dir, b.out)
	if err != nil {
		return skip("no guest kernel: " + err.Error())
	}
	r.Accel, _ = vm.Accelerator()
	f, err := harness.CreateFabric(harness.FabricOptions{})
	if err != nil {
		return err
	}
	b.undo = append(b.undo, f.Close)
	routerConfig := f.FabricRouterConfig
	if r.Reflector == viaGalactic {
		rr, err := f.LaunchReflector(b.env.BinDir, f.FabricReflectorConfig())
		if err != nil {
			return err
		}
		b.undo = append(b.undo, rr.Close)
		routerConfig = func(ul netip.Addr) config.File { return rr.RouterConfig(f, ul) }
	}
	var nodes []*routedNode
	for _, name := range []string{"a", "b", "c"} {
		n, err := b.fabricNode(f, fmt.Sprintf("m%d%s", i, name), false)
		if err != nil {
			return err
		}
		if n.router, err = n.LaunchRouter(routerConfig(n.underlay)); err != nil {
			return err
		}
		b.undo = append(b.undo, n.router.Kill)
		nodes = append(nodes, n)
	}
	a, bn, c := nodes[0], nodes[1], nodes[2]
	guestAddr := fmt.Sprintf("10.20.4.%d/16", 10+2*i)
	vmName := fmt.Sprintf("vm-%d", i)
	guest := migratableConf(vmName, "tap", guestAddr)
	for _, n := range []*routedNode{a, bn} {
		if err := n.WriteConflistFile(guest); err != nil {
			return err
		}
	}
	client, err := b.attach(c, migratableConf(fmt.Sprintf("client-%d", i), "veth", fmt.Sprintf("10.20.4.%d/16", 11+2*i)))
	if err != nil {
		return err
	}
	src, err := b.container()
	if err != nil {
		return err
	}
	add, err := b.addConf(a, guest, src)
	if err != nil {
		return err
	}
	res := &current.Result{}
	if err := json.Unmarshal(add.Stdout, res); err != nil {
		return fmt.Errorf("the ADD result: %w", err)
	}
	o := vm.GuestOptions{Netns: a.Netns.Name, Accel: r.Accel, MemoryMB: 128, QMP: filepath.Join(b.dir, fmt.Sprintf("m%da.qmp", i))}
	if err := o.FromResult(res); err != nil {
		return err
	}
	g, _, err := assets.Boot(b.ctx, o, 3*time.Minute)
	if err != nil {
		return err
	}
	b.undo = append(b.undo, g.Kill)
	addr := netip.MustParsePrefix(guestAddr).Addr()
	if err := client.PingUntil(addr, 50*time.Millisecond, time.Now().Add(time.Minute)); err != nil {
		return fmt.Errorf("the client does not reach the guest: %w", err)
	}
	routes, err := c.WatchRoute(b.ctx, netip.PrefixFrom(addr, 32))
	if err != nil {
		return err
	}
	pinger, err := client.StartPinger(addr, migrationPing)
	if err != nil {
		return err
	}
	q := &migration.QEMU{Assets: assets, Accel: r.Accel, MemoryMB: o.MemoryMB, Source: g, SourceQMP: o.QMP,
		TargetNode: bn.Node, TargetAddr: bn.underlay, Port: 4444, TargetQMP: filepath.Join(b.dir, fmt.Sprintf("m%db.qmp", i))}
	from, to := a, bn
	var runs []migration.Timings
	for k := range migrationRuns {
		tgt, err := b.container()
		if err != nil {
			return err
		}
		m := &migration.Migration{VPC: migrationVPC, Attachment: vmName, Network: confName(guest), IfName: ifName,
			Source: migration.Side{Node: from.Node, Container: src}, Target: migration.Side{Node: to.Node, Container: tgt}, VMM: q}
		mr, err := m.Run(b.ctx)
		b.undo = append(b.undo, q.StopTarget)
		if err != nil {
			return fmt.Errorf("migration %d: %w", k+1, err)
		}
		runs = append(runs, mr.Timings)
		if err := client.PingUntil(addr, 20*time.Millisecond, time.Now().Add(time.Minute)); err != nil {
			return fmt.Errorf("after migration %d: %w", k+1, err)
		}
		q = q.Next(from.Node, from.underlay, filepath.Join(b.dir, fmt.Sprintf("m%d-%d.qmp", i, k)))
		src, from, to = tgt, to, from
	}
	// The last guest and its attachment go with the run.
	last, holder := src, from
	b.undo = append(b.undo, func() { _, _ = b.delConf(holder, guest, last) })
	pinger.Stop()
	ch := routes.Changes()
	r.RouteChanges = len(ch)
	for k, t := range runs {
		end := t.SourceDeleted
		if k+1 < len(runs) {
			end = runs[k+1].Start
		}
		st := pinger.StatsBetween(t.Start.Add(-200*time.Millisecond), end)
		r.Blackout = append(r.Blackout, st.LongestGap)
		r.QEMUDowntime = append(r.QEMUDowntime, t.QEMUDowntime)
		r.Release = append(r.Release, t.Released.Sub(t.Migrated))
		r.Promote = append(r.Promote, t.Promoted.Sub(t.Released))
		for _, c := range ch {
			if c.At.After(t.Released) {
				r.Galactic = append(r.Galactic, c.At.Sub(t.Released))
				break
			}
		}
	}
	b.say("live migration (%s, through %s): blackout p50 %s p99 %s; qemu downtime p50 %s; galactic p50 %s; route changes %d in %d migrations",
		r.Accel, r.Reflector, ms(r.Blackout.P50()), ms(r.Blackout.Quantile(0.99)), ms(r.QEMUDowntime.P50()), ms(r.Galactic.P50()), r.RouteChanges, len(runs))
	if r.RouteChanges != len(runs) {
		return errors.New("the client node's route did not change exactly once per migration")
	}
	return nil
}

// migratableConf is a chain whose galactic-cni stanza takes pod
// annotations (the target's runtime passes network.galactic.dev/standby).
func migratableConf(att, mode, addr string) map[string]any {
	conf := routedConf(migrationVPC, att, mode, []string{addr}, true, "")
	conf["plugins"].([]any)[0].(map[string]any)["capabilities"] = map[string]bool{netconf.CapabilityPodAnnotations: true}
	return conf
}

// The live migration's goals: a blackout of at most 200 ms p50 and 500 ms
// p99, of which galactic's part (release returned → the client node's
// route changed) at most 60 ms p50.
const (
	migrationBlackoutP50 = 200 * time.Millisecond
	migrationBlackoutP99 = 500 * time.Millisecond
	migrationGalacticP50 = 60 * time.Millisecond
)

// migrationTargets judges each reflector's run against the goals.
func (r *Results) migrationTargets() []Target {
	var ts []Target
	for _, m := range r.Migration {
		if m.Skipped != "" || len(m.Blackout) == 0 {
			continue
		}
		for _, g := range []struct {
			key, what string
			v, limit  time.Duration
		}{
			{"blackout-p50", "blackout p50", m.Blackout.P50(), migrationBlackoutP50},
			{"blackout-p99", "blackout p99", m.Blackout.Quantile(0.99), migrationBlackoutP99},
			{"galactic-p50", "galactic's part p50", m.Galactic.P50(), migrationGalacticP50},
		} {
			t := Target{Key: "migration/" + m.Reflector + "/" + g.key, Section: "live-migration", What: fmt.Sprintf("live migration via %s: %s", m.Reflector, g.what),
				Measured: ms(g.v), Ref: "≤ " + ms(g.limit), Met: g.v <= g.limit}
			if !t.Met {
				t.Miss = ms(g.v-g.limit) + " over"
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// migrationReason says where a missed migration goal's time goes.
func (r *Results) migrationReason(key string) string {
	parts := strings.SplitN(key, "/", 3)
	var m *MigrationResult
	for _, x := range r.Migration {
		if x.Reflector == parts[1] {
			m = x
		}
	}
	switch parts[2] {
	case "blackout-p50", "blackout-p99":
		return fmt.Sprintf("The blackout is qemu's pause (p50 %s, p99 %s), the release (p50 %s) and galactic's part (p50 %s, p99 %s); under TCG a guest that dirtied much memory pauses longest at the last copy.",
			ms(m.QEMUDowntime.P50()), ms(m.QEMUDowntime.Quantile(0.99)), ms(m.Release.P50()), ms(m.Galactic.P50()), ms(m.Galactic.Quantile(0.99)))
	case "galactic-p50":
		hold := ""
		if strings.Contains(m.Reflector, "FRR") {
			hold = " FRR's bgpd holds every received update for 50 ms before it processes it (its route work queue), which leaves 10 ms of the goal for everything else."
		}
		return fmt.Sprintf("Galactic's part is promote (p50 %s: a process start, the TLS handshake, the lease and the entry) and the route's way from the target's router through the reflector to the client node's kernel.%s", ms(m.Promote.P50()), hold)
	}
	panic("no reason for migration goal " + key)
}

func renderMigration(w *strings.Builder, r *Results) {
	if len(r.Migration) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "live-migration")
	p("")
	var runs []*MigrationResult
	for _, m := range r.Migration {
		if m.Skipped != "" {
			p("Not measured through %s: %s.", m.Reflector, m.Skipped)
			p("")
			continue
		}
		runs = append(runs, m)
	}
	if len(runs) == 0 {
		return
	}
	p("One qemu guest (%s, 128 MiB) moved %d times back and forth between two nodes by the reference driver (test/migration, see [live migration](concepts/live-migration.md)), with a client on a third node pinging it every %s; once with FRR as the fabric's route reflector and once, in a fabric of its own, with galactic-router as reflector (`role: reflector`). *Blackout* is the longest time between two answered pings around a migration; *galactic* runs from the source's `galactic-cni release` returning to the client node's kernel route changing (promote, then the route's way through the reflector). FRR holds every received update for 50 ms before it processes it (bgpd's route work queue), which the galactic reflector does not.", runs[0].Accel, len(runs[0].Blackout), migrationPing)
	p("")
	head, rule := "| |", "|---|"
	for _, m := range runs {
		head += fmt.Sprintf(" via %s p50 | p99 |", m.Reflector)
		rule += "---|---|"
	}
	p("%s goal |", head)
	p("%s---|", rule)
	row := func(name, goal string, s func(*MigrationResult) Sample) {
		line := "| " + name + " |"
		for _, m := range runs {
			line += fmt.Sprintf(" %s | %s |", ms(s(m).P50()), ms(s(m).Quantile(0.99)))
		}
		p("%s %s |", line, goal)
	}
	row("blackout", "p50 ≤ 200 ms, p99 ≤ 500 ms", func(m *MigrationResult) Sample { return m.Blackout })
	row("qemu's downtime", "", func(m *MigrationResult) Sample { return m.QEMUDowntime })
	row("galactic's part", "p50 ≤ 60 ms", func(m *MigrationResult) Sample { return m.Galactic })
	row("release (wall)", "", func(m *MigrationResult) Sample { return m.Release })
	row("promote (wall)", "", func(m *MigrationResult) Sample { return m.Promote })
	p("")
	for _, m := range runs {
		p("Through %s the client node's route changed %d times in %d migrations.", m.Reflector, m.RouteChanges, len(m.Blackout))
	}
	p("")
}
