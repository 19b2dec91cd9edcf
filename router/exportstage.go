package router

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"

	"k8s.io/utils/clock"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// exportStage is what this node announces: the paths the speaker holds,
// the state kept across restarts (RD numbers, VNIs, the paths) and the
// advertisements' conditions, queued for the status writer.
type exportStage struct {
	cfg     *config.Config
	log     *slog.Logger
	clock   clock.Clock
	metrics *Metrics
	store   Store
	spk     speaker.Speaker
	// exists says whether a netns exists; deviceMAC is the derived MAC of
	// a VPC's VXLAN device.
	exists    func(netns string) bool
	deviceMAC func(vpc string) net.HardwareAddr
	announced map[speaker.Key]speaker.Route
	// saved is the state last written and savedGen how many were,
	// rdsDirty whether an RD was given out since; bootID is this boot's.
	saved    Saved
	savedGen uint64
	rdsDirty bool
	bootID   string
	// exported fingerprints export's other inputs when it last ran, at
	// exportedAt.
	exported   uint64
	exportedAt time.Time
	// aliveAt is when each entry's netns was last seen to exist; see live.
	aliveAt map[string]time.Time
	status  statusQueue
}

// exportView is what a pass hands export.
type exportView struct {
	adverts []*v1alpha1.BGPAdvertisement
	vnis    map[string]uint32
	devices map[string]*dataplane.Device
	// deviceErrs are the VPCs whose device failed, dups the other VTEPs
	// with this router ID.
	deviceErrs map[string]error
	dups       []netip.Addr
	anyPeer    bool
	available  Availability
	// attachments finds the attachments of object-backed advertisements.
	attachments AttachmentLookup
}

// replay re-announces the saved paths, before anything else at a start,
// so a restart that cannot reach the API server still sends the same
// routes with the same RDs.
func (e *exportStage) replay(ctx context.Context) {
	for _, p := range e.saved.Paths {
		r, err := p.route()
		if err != nil {
			continue
		}
		if err := e.spk.Announce(ctx, r); err != nil {
			e.log.Warn("re-announcing a saved path", "error", err)
			continue
		}
		e.announced[r.Key()] = r
	}
}

// sync exports and saves the state when they may have changed. Both
// follow the API, the devices, the sessions and the entries' netns: a
// pass for remote routes alone changes none of them, so it skips both,
// but for the liveness of the entries, looked at again every liveEvery.
// Until the API has synced only the state is saved.
func (e *exportStage) sync(ctx context.Context, v exportView, apiSynced, apiMoved, full bool, now time.Time) {
	in := exportInputs(v)
	if apiSynced && (full || apiMoved || in != e.exported || now.Sub(e.exportedAt) >= liveEvery) {
		e.export(ctx, v)
		e.exported, e.exportedAt = in, now
		e.save(v.vnis, v.devices)
	} else if !apiSynced || e.rdsDirty {
		e.save(v.vnis, v.devices)
	}
}

// liveEvery is how often a pass that changes nothing else looks at the
// entries' netns again (a workload gone without a DEL).
const liveEvery = time.Second

// live is the liveness check of an export at now: a netns seen to exist
// less than liveEvery ago is not looked at again, so the exports that
// each ADD's API events start cost the new entries' checks, not every
// entry's on the node. One not seen to exist is looked at every time.
func (e *exportStage) live(now time.Time) func(string) bool {
	if e.aliveAt == nil {
		e.aliveAt = map[string]time.Time{}
	}
	for p, at := range e.aliveAt {
		if now.Sub(at) >= liveEvery {
			delete(e.aliveAt, p)
		}
	}
	return func(netns string) bool {
		if _, ok := e.aliveAt[netns]; ok {
			return true
		}
		if !e.exists(netns) {
			return false
		}
		e.aliveAt[netns] = now
		return true
	}
}

// exportInputs fingerprints what export reads besides the API: each
// device's VPC, index and MAC, the VPCs whose device failed, the other
// VTEPs with this router ID and whether a session is up.
func exportInputs(v exportView) uint64 {
	var sum uint64
	for vpc, dev := range v.devices {
		var h maphash.Hash
		h.SetSeed(exportSeed)
		h.WriteString(vpc)
		h.WriteString(strconv.Itoa(dev.Index))
		h.Write(dev.MAC)
		sum += h.Sum64()
	}
	for vpc := range v.deviceErrs {
		sum += maphash.String(exportSeed, "error "+vpc)
	}
	for _, d := range v.dups {
		sum += maphash.String(exportSeed, "duplicate "+d.String())
	}
	if v.anyPeer {
		sum++
	}
	return sum
}

var exportSeed = maphash.MakeSeed()

func (e *exportStage) rd(vpc string) speaker.RD {
	_, had := e.saved.RDs[vpc]
	n, err := AllocateRD(e.saved.RDs, vpc)
	e.rdsDirty = e.rdsDirty || !had
	if err != nil {
		e.log.Error("allocating an RD", "vpc", vpc, "error", err)
	}
	return speaker.RD{Admin: e.cfg.RouterID, Assigned: n}
}

// export announces what changed, withdraws what is no longer desired and
// queues the advertisements' conditions where they moved.
func (e *exportStage) export(ctx context.Context, v exportView) {
	want, verdicts := Desired(ExportInput{
		Adverts: v.adverts, Live: e.live(e.clock.Now()), Available: v.available, VNIs: v.vnis, RD: e.rd, Attachments: v.attachments,
		RouterMAC: func(vpc string) net.HardwareAddr {
			if dev := v.devices[vpc]; dev != nil {
				return dev.MAC
			}
			// A local error never withdraws: the device's MAC is derived,
			// so the paths stay what peers already have.
			if _, failed := v.deviceErrs[vpc]; failed {
				return e.deviceMAC(vpc)
			}
			return nil
		},
		Underlay: e.cfg.Underlay, RTASN: e.cfg.RouteTargetASN, Announced: e.announced,
	})
	// A VPC whose device failed keeps what peers have, and gets nothing
	// new until the device works: traffic to a new path would be dropped.
	if len(v.deviceErrs) > 0 {
		for k := range want {
			if _, had := e.announced[k]; had {
				continue
			}
			for vpc := range v.deviceErrs {
				if n, ok := e.saved.RDs[vpc]; ok && n == k.RD.Assigned {
					delete(want, k)
				}
			}
		}
	}
	e.announce(ctx, want)
	e.status.queue(v.adverts, e.localErrors(v, verdicts), v.anyPeer)
}

// announce makes the speaker hold want: it announces what changed and
// withdraws what is no longer wanted.
func (e *exportStage) announce(ctx context.Context, want map[speaker.Key]speaker.Route) {
	for k, r := range want {
		if cur, ok := e.announced[k]; ok && cur.Equal(r) {
			continue
		}
		if err := e.spk.Announce(ctx, r); err != nil {
			e.log.Error("announce", "route", k.String(), "error", err)
			continue
		}
		e.announced[k] = r
		e.metrics.updates.WithLabelValues("announce").Inc()
		e.log.Info("announced", "route", k.String(), "generation", r.Generation, "drained", r.Drained)
	}
	for k := range e.announced {
		if _, ok := want[k]; ok {
			continue
		}
		if err := e.spk.Withdraw(ctx, k); err != nil {
			e.log.Error("withdraw", "route", k.String(), "error", err)
			continue
		}
		delete(e.announced, k)
		e.metrics.updates.WithLabelValues("withdraw").Inc()
		e.log.Info("withdrew", "route", k.String())
	}
}

// Reasons of Programmed=False this package adds to the API's.
const (
	ReasonDeviceError       = "DeviceError"
	ReasonDuplicateRouterID = "DuplicateRouterID"
)

// localErrors turns the verdicts of announced advertisements into the
// node's own errors where it has one: a duplicate router ID, or the
// VPC's device failing. It changes and returns verdicts.
func (e *exportStage) localErrors(v exportView, verdicts map[string]Verdict) map[string]Verdict {
	for _, adv := range v.adverts {
		vd, ok := verdicts[adv.Name]
		if !ok || !vd.Announced {
			continue
		}
		switch err := v.deviceErrs[adv.Spec.VPC]; {
		case len(v.dups) > 0:
			vd.Announced, vd.Reason = false, ReasonDuplicateRouterID
			vd.Message = fmt.Sprintf("announced, but router ID %s is also used by the VTEP(s) %v: give every node its own routerID in router.json", e.cfg.RouterID, v.dups)
		case err != nil:
			vd.Announced, vd.Reason = false, ReasonDeviceError
			vd.Message = "the VPC's VXLAN device failed (retrying; what peers already have stays announced): " + err.Error()
		}
		verdicts[adv.Name] = vd
	}
	return verdicts
}

// save writes the RDs, the VNIs of the VPCs with a device (or as saved)
// and the announced paths when they changed.
func (e *exportStage) save(vnis map[string]uint32, devices map[string]*dataplane.Device) {
	next := Saved{RDs: e.saved.RDs, VNIs: map[string]uint32{}, BootID: e.bootID, Identity: Identity(e.cfg)}
	for vpc, v := range vnis {
		if _, ok := devices[vpc]; ok || e.saved.VNIs[vpc] == v {
			next.VNIs[vpc] = v
		}
	}
	for _, r := range e.announced {
		next.Paths = append(next.Paths, savedPath(r))
	}
	if !e.rdsDirty && equalSaved(next, e.saved) {
		return
	}
	if err := e.store.Save(next); err != nil {
		e.log.Error("saving the router state", "error", err)
		return
	}
	e.saved, e.rdsDirty = next, false
	e.savedGen++
}
