package gc

import (
	"context"
	"errors"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/pkg/tap"
)

// NodeKernel is the Kernel of the network namespace the daemon runs in,
// undoing host-side state with galactic-cni's own code.
type NodeKernel struct {
	Host hostif.Host
}

// tapOf describes l if it is a galactic tap, given the tun holders found
// by one scan of /proc.
func tapOf(l netlink.Link, holders map[string][]int) (Tap, bool) {
	if _, isTap := l.(*netlink.Tuntap); !isTap || !names.IsHostInterface(names.ModeTap, l.Attrs().Name) {
		return Tap{}, false
	}
	vpc, att, uid, ok := names.ParseAliasUID(l.Attrs().Alias)
	if !ok {
		// Galactic's name without galactic's alias: not ours to judge.
		return Tap{}, false
	}
	st := tap.StatusOf(l, holders)
	return Tap{Name: st.Name, Index: st.Index, VPC: vpc, Attachment: att, UID: uid, Carrier: st.Carrier, Holders: st.Holders}, true
}

// Taps lists the galactic taps: name and ifalias must both say so.
func (k NodeKernel) Taps() ([]Tap, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, err
	}
	holders, err := tap.AllHolders("/proc")
	if err != nil {
		return nil, err
	}
	var taps []Tap
	for _, l := range links {
		if t, ok := tapOf(l, holders); ok {
			taps = append(taps, t)
		}
	}
	return taps, nil
}

// Tap re-reads one tap.
func (k NodeKernel) Tap(name string) (Tap, bool, error) {
	l, err := netlinksafe.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return Tap{}, false, nil
	}
	if err != nil {
		return Tap{}, false, err
	}
	holders, err := tap.Holders("/proc", name)
	if err != nil {
		return Tap{}, false, err
	}
	t, ok := tapOf(l, map[string][]int{name: holders})
	return t, ok, nil
}

// Link reports whether a device of that name exists, and the identity
// its ifalias names.
func (k NodeKernel) Link(name string) (Link, error) {
	l, err := netlinksafe.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return Link{}, nil
	}
	if err != nil {
		return Link{}, err
	}
	_, _, uid, ok := names.ParseAliasUID(l.Attrs().Alias)
	return Link{Found: true, Galactic: ok, UID: uid}, nil
}

// Release undoes a dead container's record as galactic-cni DEL would.
func (k NodeKernel) Release(rec state.Record) error { return k.Host.Teardown(rec) }

// RemoveTap removes a tap no record describes.
func (k NodeKernel) RemoveTap(t Tap) error { return k.Host.RemoveInterface(t.Name) }

// HandoffLeases renews and releases leases through pkg/handoff, with the
// grant a galactic-cni record keeps.
type HandoffLeases struct {
	// Leases is the Lease client of Namespace.
	Leases    handoff.LeaseClient
	Namespace string
}

func (h HandoffLeases) lock(rec state.Record) (*handoff.Lock, handoff.Grant, error) {
	d := time.Duration(rec.LeaseSeconds) * time.Second
	if d <= 0 {
		d = 60 * time.Second
	}
	// A lease of another UID is never renewed or released for this record.
	opts := handoff.Options{LeaseDuration: d}
	if rec.AttachmentUID != "" {
		opts.Identity = handoff.Identity{Namespace: rec.Namespace, UID: rec.AttachmentUID}
	}
	l, err := handoff.New(h.Leases, h.Namespace, names.Lease(rec.VPC, rec.Attachment), opts)
	return l, handoff.Grant{Holder: rec.Holder, Token: rec.HolderGeneration}, err
}

// Renew renews a live holder's lease; ErrLost means the holder was taken
// over and must stop using the attachment.
func (h HandoffLeases) Renew(ctx context.Context, rec state.Record) error {
	l, g, err := h.lock(rec)
	if err != nil {
		return err
	}
	return l.Renew(ctx, g)
}

// Release frees a dead holder's lease; ErrLost means it is no longer the
// holder's (released before, or taken over) and nothing was written.
func (h HandoffLeases) Release(ctx context.Context, rec state.Record) error {
	l, g, err := h.lock(rec)
	if err != nil {
		return err
	}
	return l.Release(ctx, g)
}
