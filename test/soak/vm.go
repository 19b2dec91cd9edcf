package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/migration"
	"github.com/galactic-cni/galactic/test/vm"
)

// The VM's settings: the guest of test/migration, small, so that its
// migrations under TCG stay short.
const (
	vmMemoryMB      = 128
	vmMigrationPort = 4444
	vmBootTimeout   = 4 * time.Minute
)

// vmAttachment is the soak's qemu guest: a blue workload on a tap, on an
// address no container uses, so it fits any node.
var vmAttachment = Attachment{VPC: "blue", Name: "vm-0", VNI: vniBlue, Address: "10.20.0.9/24", Announce: "always", VM: true}

// WithVM adds the qemu guest to topo, starting on node-a.
func WithVM(topo Topology) Topology {
	topo.Attachments = append(append([]Attachment(nil), topo.Attachments...), vmAttachment)
	initial := map[string]string{}
	for k, v := range topo.Initial {
		initial[k] = v
	}
	initial[vmAttachment.Key()] = "node-a"
	topo.Initial = initial
	return topo
}

// guest is a running VM instance: the qemu that runs the guest now, and
// the migration that brought it there (nil before the first one).
type guest struct {
	assets *vm.GuestAssets
	accel  string
	g      *vm.Guest
	qmp    string
	last   *migration.QEMU
	broken bool
}

func (r *runner) guestAssets() (*vm.GuestAssets, error) {
	if r.assets != nil {
		return r.assets, nil
	}
	if err := vm.Available(); err != nil {
		return nil, fmt.Errorf("the soak's VM (SOAK_VM=0 leaves it out): %w", err)
	}
	a, err := vm.EnsureGuestAssets(r.dir, r.o.Out)
	if err != nil {
		return nil, fmt.Errorf("the soak's VM (SOAK_VM=0 leaves it out): %w", err)
	}
	r.assets = a
	return a, nil
}

// qmpPath is a short path for a QMP socket (unix socket paths are short).
func (r *runner) qmpPath(node string) string {
	r.qmpSeq++
	return filepath.Join(r.sockDir, fmt.Sprintf("%s-%d.qmp", node, r.qmpSeq))
}

// bootVM ADDs the VM's tap on node and boots the guest on it.
func (r *runner) bootVM(key, node string) (*instance, error) {
	as, err := r.guestAssets()
	if err != nil {
		return nil, err
	}
	a := r.attachment(key)
	c, err := r.container()
	if err != nil {
		return nil, err
	}
	out, err := r.nodes[node].CNITool("add", network(a), c, ifName)
	if err != nil {
		return nil, fmt.Errorf("ADD of %s on %s: %w", key, node, err)
	}
	res := &current.Result{}
	if err := json.Unmarshal([]byte(out), res); err != nil {
		return nil, fmt.Errorf("the ADD result of %s: %w", key, err)
	}
	accel, _ := vm.Accelerator()
	o := vm.GuestOptions{Netns: r.nodes[node].Netns.Name, Accel: accel, MTU: mtu, MemoryMB: vmMemoryMB, QMP: r.qmpPath(node)}
	if err := o.FromResult(res); err != nil {
		return nil, err
	}
	g, took, err := as.Boot(r.ctx, o, vmBootTimeout)
	if err != nil {
		return nil, fmt.Errorf("booting %s on %s: %w", key, node, err)
	}
	r.undo = append(r.undo, g.Kill)
	r.say("%s: the guest booted on %s in %.1fs (%s)", key, node, took.Seconds(), accel)
	return &instance{a: a, node: node, netns: c, vm: &guest{assets: as, accel: accel, g: g, qmp: o.QMP}}, nil
}

// migrateVM live-migrates the guest with qemu: standby ADD on to, an
// incoming qemu there, QMP migrate, release, promote, resume, and DEL of
// the source.
func (r *runner) migrateVM(old *instance, to string) error {
	gs := old.vm
	if gs == nil || gs.g == nil || gs.broken {
		return fmt.Errorf("%s has no guest that can migrate (an earlier migration failed)", old.a.Key())
	}
	n := r.nodes[to]
	var q *migration.QEMU
	if gs.last != nil {
		q = gs.last.Next(n.Node, n.underlay, r.qmpPath(to))
	} else {
		q = &migration.QEMU{Assets: gs.assets, Accel: gs.accel, MTU: mtu, MemoryMB: vmMemoryMB, Source: gs.g, SourceQMP: gs.qmp,
			TargetNode: n.Node, TargetAddr: n.underlay, Port: vmMigrationPort, TargetQMP: r.qmpPath(to)}
	}
	c, err := r.container()
	if err != nil {
		return err
	}
	a := old.a
	ctx, cancel := context.WithTimeout(r.ctx, 3*time.Minute)
	defer cancel()
	res, err := r.migration(old, to, c, q).Run(ctx)
	if err != nil {
		// The guest runs on the source again (or nowhere), and the failed
		// attempt holds its QMP connection: it is not migrated again.
		gs.broken = true
		return fmt.Errorf("migrating %s from %s to %s: %w", a.Key(), old.node, to, err)
	}
	old.netns.Delete()
	r.undo = append(r.undo, q.Target.Kill)
	r.say("  %s: qemu downtime %s, release→promote %s", a.Key(), res.Timings.QEMUDowntime, res.Timings.Promoted.Sub(res.Timings.Released).Round(time.Millisecond))
	in := &instance{a: a, node: to, netns: c, vm: &guest{assets: gs.assets, accel: gs.accel, g: q.Target, qmp: q.TargetQMP, last: q}}
	r.mu.Lock()
	r.inst[a.Key()] = in
	r.mu.Unlock()
	return nil
}

// stop ends the guest before its DEL.
func (gs *guest) stop() {
	if gs != nil && gs.g != nil {
		gs.g.Kill()
	}
}
