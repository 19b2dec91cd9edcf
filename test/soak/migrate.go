package soak

import (
	"fmt"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
)

// migration is the reference driver's migration of old to a new container
// c on node to; vmm nil without a guest.
func (r *runner) migration(old *instance, to string, c *harness.Netns, vmm migration.VMM) *migration.Migration {
	return &migration.Migration{
		Namespace: old.a.Namespace, VPC: old.a.VPC, Attachment: old.a.Name, Network: network(old.a), IfName: ifName,
		Source: migration.Side{Node: r.nodes[old.node].Node, Container: old.netns},
		Target: migration.Side{Node: r.nodes[to].Node, Container: c}, VMM: vmm,
	}
}

// Migrate runs the reference driver (test/migration) without a VMM: the
// source container keeps answering until its DEL, the target container
// answers once promoted, as a migrated guest would.
func (r *runner) Migrate(key, to string) error {
	old, err := r.current(key)
	if err != nil {
		return err
	}
	if old.vm != nil {
		return r.migrateVM(old, to)
	}
	c, err := r.container()
	if err != nil {
		return err
	}
	a := old.a
	res, err := r.migration(old, to, c, nil).Run(r.ctx)
	if err != nil {
		if res.FellBack {
			// The source promoted itself back: it holds a new token and
			// reports available again.
			old.available = a.Announce == "whenAvailable"
		}
		return fmt.Errorf("migrating %s from %s to %s: %w", key, old.node, to, err)
	}
	old.netns.Delete()
	in := &instance{a: a, node: to, netns: c, available: a.Announce == "whenAvailable"}
	r.mu.Lock()
	r.inst[key] = in
	r.mu.Unlock()
	return nil
}
