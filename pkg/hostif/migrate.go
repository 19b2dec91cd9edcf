package hostif

import (
	"fmt"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/pkg/state"
)

// Activate gives the attachment of a record the host routes that lead
// traffic to its interface, records what change makes and writes the
// record: a live-migration target's promotion, or a source taking its
// attachment back. It is a no-op for routes that are there already.
func (h Host) Activate(containerID, ifName string, change func(*state.Record)) (state.Record, error) {
	unlock, err := h.lock()
	if err != nil {
		return state.Record{}, err
	}
	defer unlock()
	rec, ok, err := h.Store().Get(containerID, ifName)
	if err != nil {
		return state.Record{}, err
	}
	if !ok {
		return state.Record{}, fmt.Errorf("no node record of container %s interface %s", containerID, ifName)
	}
	d, err := routing.Find(rec.VPC)
	if err != nil {
		return rec, err
	}
	if d == nil {
		return rec, fmt.Errorf("VPC %s has no routing domain on this node", rec.VPC)
	}
	name := recordInterface(rec)
	l, err := linkByName(name)
	if err != nil {
		return rec, err
	}
	if l == nil {
		return rec, fmt.Errorf("host interface %s of %s/%s does not exist", name, rec.VPC, rec.Attachment)
	}
	if l.Attrs().Alias != names.Alias(rec.VPC, rec.Attachment) {
		return rec, fmt.Errorf("%s belongs to %q, not to %s/%s", name, l.Attrs().Alias, rec.VPC, rec.Attachment)
	}
	for _, a := range parseAddrs(rec.Addresses) {
		if err := d.AddHostRoute(l, a); err != nil {
			return rec, err
		}
	}
	change(&rec)
	if err := h.Store().Put(rec); err != nil {
		return rec, fmt.Errorf("writing the node record: %w", err)
	}
	return rec, nil
}

// UpdateRecord changes the record of (containerID, ifName) under the node
// lock; ok is false when there is none.
func (h Host) UpdateRecord(containerID, ifName string, change func(*state.Record)) (rec state.Record, ok bool, err error) {
	unlock, err := h.lock()
	if err != nil {
		return state.Record{}, false, err
	}
	defer unlock()
	rec, ok, err = h.Store().Get(containerID, ifName)
	if err != nil || !ok {
		return rec, ok, err
	}
	change(&rec)
	return rec, true, h.Store().Put(rec)
}
