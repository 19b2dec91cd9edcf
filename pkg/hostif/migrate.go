package hostif

import (
	"fmt"
	"net/netip"
	"slices"

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
	if l.Attrs().Alias != recordAlias(rec) {
		return rec, fmt.Errorf("%s belongs to %q, not to %q", name, l.Attrs().Alias, recordAlias(rec))
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

// RecordSpec is the spec a record was set up from, as far as Check needs it.
func RecordSpec(r state.Record) Spec {
	return Spec{
		Network: r.Network, ContainerID: r.ContainerID, IfName: r.IfName, Netns: r.Netns,
		VPC: r.VPC, Attachment: r.Attachment, Mode: r.Mode, Routing: r.Routing,
		Addresses: parsePrefixes(r.Addresses), AllowedSourcePrefixes: parsePrefixes(r.AllowedSourcePrefixes),
		Holder: r.Holder, HolderGeneration: r.HolderGeneration, LeaseSeconds: r.LeaseSeconds,
		Standby: r.Standby, WaitSeconds: r.WaitSeconds,
		Namespace: r.Namespace, AttachmentName: r.AttachmentName, AttachmentUID: r.AttachmentUID,
		VNI: r.VNI, Announce: r.Announce, ChainIfName: r.ChainIfName,
	}
}

// Keep is a repeated ADD of an object-backed attachment that is in place
// already: when the record of (spec.ContainerID, spec.IfName) is the same
// attachment (UID, data-plane names, mode, addresses, allowed sources) and
// the kernel is as Setup makes it, it writes the spec's holder into the
// record and returns what is there, leaving the interface alone (same
// ifindex, no packet lost). ok is false when Setup must run.
func (h Host) Keep(spec Spec) (att *Attached, ok bool, err error) {
	unlock, err := h.lock()
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	rec, found, err := h.Store().Get(spec.ContainerID, spec.IfName)
	if err != nil || !found || spec.AttachmentUID == "" {
		return nil, false, err
	}
	was := RecordSpec(rec)
	if was.AttachmentUID != spec.AttachmentUID || was.VPC != spec.VPC || was.Attachment != spec.Attachment ||
		was.Mode != spec.Mode || was.Routing != spec.Routing || was.Netns != spec.Netns || was.Standby != spec.Standby ||
		!slices.Equal(rec.Addresses, prefixStrings(spec.Addresses)) ||
		!slices.Equal(rec.AllowedSourcePrefixes, prefixStrings(spec.AllowedSourcePrefixes)) ||
		was.secondary() != spec.secondary() {
		return nil, false, nil
	}
	if h.Check(spec) != nil {
		return nil, false, nil
	}
	l, err := linkByName(rec.HostInterface)
	if err != nil || l == nil {
		return nil, false, err
	}
	d, err := routing.Find(spec.VPC)
	if err != nil || d == nil {
		return nil, false, err
	}
	rec.Holder, rec.HolderGeneration, rec.LeaseSeconds, rec.WaitSeconds = spec.Holder, spec.HolderGeneration, spec.LeaseSeconds, spec.WaitSeconds
	rec.VNI, rec.Announce = spec.VNI, spec.Announce
	if err := h.Store().Put(rec); err != nil {
		return nil, false, fmt.Errorf("writing the node record: %w", err)
	}
	att = &Attached{Record: rec, Host: Iface{Name: l.Attrs().Name, Index: l.Attrs().Index, MAC: l.Attrs().HardwareAddr.String()}, Domain: *d, AdoptedTap: spec.Mode == names.ModeTap}
	if spec.Mode == names.ModeVeth {
		att.Sandbox = &Iface{Name: spec.IfName, MAC: rec.SandboxMAC}
	}
	return att, true, nil
}

func parsePrefixes(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}
