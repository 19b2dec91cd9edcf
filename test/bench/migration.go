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
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
	"github.com/galactic-cni/galactic/test/vm"
)

// MigrationResult is the live-migration section: one guest moved back
// and forth between two nodes under a 10 ms pinger from a third.
type MigrationResult struct {
	Accel string
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
	migrationVPC   = "mig"
	migrationRuns  = 10
	migrationPing  = 10 * time.Millisecond
	migrationGuest = "10.20.4.5/16"
)

// liveMigration runs the live-migration section with the reference
// driver of test/migration.
func (b *bench) liveMigration() error {
	r := &MigrationResult{}
	b.res.Migration = r
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
	nodes := map[string]*routedNode{}
	for _, name := range []string{"ma", "mb", "mc"} {
		if nodes[name], err = b.fabricNode(f, name, true); err != nil {
			return err
		}
	}
	a, bn, c := nodes["ma"], nodes["mb"], nodes["mc"]
	guest := migratableConf("vm-0", "tap", migrationGuest)
	for _, n := range []*routedNode{a, bn} {
		if err := n.WriteConflistFile(guest); err != nil {
			return err
		}
	}
	client, err := b.attach(c, migratableConf("client", "veth", "10.20.4.7/16"))
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
	o := vm.GuestOptions{Netns: a.Netns.Name, Accel: r.Accel, MemoryMB: 128, QMP: filepath.Join(b.dir, "ma.qmp")}
	if err := o.FromResult(res); err != nil {
		return err
	}
	g, _, err := assets.Boot(b.ctx, o, 3*time.Minute)
	if err != nil {
		return err
	}
	b.undo = append(b.undo, g.Kill)
	addr := netip.MustParsePrefix(migrationGuest).Addr()
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
		TargetNode: bn.Node, TargetAddr: bn.underlay, Port: 4444, TargetQMP: filepath.Join(b.dir, "mb.qmp")}
	from, to := a, bn
	var runs []migration.Timings
	for i := range migrationRuns {
		tgt, err := b.container()
		if err != nil {
			return err
		}
		m := &migration.Migration{VPC: migrationVPC, Attachment: "vm-0", Network: confName(guest), IfName: ifName,
			Source: migration.Side{Node: from.Node, Container: src}, Target: migration.Side{Node: to.Node, Container: tgt}, VMM: q}
		mr, err := m.Run(b.ctx)
		b.undo = append(b.undo, q.StopTarget)
		if err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
		runs = append(runs, mr.Timings)
		if err := client.PingUntil(addr, 20*time.Millisecond, time.Now().Add(time.Minute)); err != nil {
			return fmt.Errorf("after migration %d: %w", i+1, err)
		}
		q = q.Next(from.Node, from.underlay, filepath.Join(b.dir, fmt.Sprintf("m%d.qmp", i)))
		src, from, to = tgt, to, from
	}
	// The last guest and its attachment go with the run.
	last, holder := src, from
	b.undo = append(b.undo, func() { _, _ = b.delConf(holder, guest, last) })
	pinger.Stop()
	ch := routes.Changes()
	r.RouteChanges = len(ch)
	for i, t := range runs {
		end := t.SourceDeleted
		if i+1 < len(runs) {
			end = runs[i+1].Start
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
	b.say("live migration (%s): blackout p50 %s p99 %s; qemu downtime p50 %s; galactic p50 %s; route changes %d in %d migrations",
		r.Accel, ms(r.Blackout.P50()), ms(r.Blackout.Quantile(0.99)), ms(r.QEMUDowntime.P50()), ms(r.Galactic.P50()), r.RouteChanges, len(runs))
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

func renderMigration(w *strings.Builder, r *Results) {
	m := r.Migration
	if m == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Live migration")
	p("")
	if m.Skipped != "" {
		p("Not measured: %s.", m.Skipped)
		p("")
		return
	}
	p("One qemu guest (%s, 128 MiB) moved %d times back and forth between two nodes by the reference driver (test/migration, see [live migration](live-migration.md)), with a client on a third node pinging it every %s. *Blackout* is the longest time between two answered pings around a migration; *galactic* runs from the source's `galactic-cni release` returning to the client node's kernel route changing (promote, then the route's way through the reflector).", m.Accel, len(m.Blackout), migrationPing)
	p("")
	p("| | p50 | p99 | goal |")
	p("|---|---|---|---|")
	p("| blackout | %s | %s | p50 ≤ 200 ms, p99 ≤ 500 ms |", ms(m.Blackout.P50()), ms(m.Blackout.Quantile(0.99)))
	p("| qemu's downtime | %s | %s | |", ms(m.QEMUDowntime.P50()), ms(m.QEMUDowntime.Quantile(0.99)))
	p("| galactic's part | %s | %s | p50 ≤ 60 ms |", ms(m.Galactic.P50()), ms(m.Galactic.Quantile(0.99)))
	p("| release (wall) | %s | %s | |", ms(m.Release.P50()), ms(m.Release.Quantile(0.99)))
	p("| promote (wall) | %s | %s | |", ms(m.Promote.P50()), ms(m.Promote.Quantile(0.99)))
	p("")
	p("The client node's route changed %d times in %d migrations.", m.RouteChanges, len(m.Blackout))
	p("")
}
