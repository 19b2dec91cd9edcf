package router

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/router/speaker"
)

// syncMembership makes the speaker import the route targets of the VPCs
// that have a routing domain here (the ones whose routes are installed):
// routes of other VPCs are dropped where they arrive, and a reflector
// that speaks rtc sends only these.
func (d *Daemon) syncMembership(ctx context.Context, vnis map[string]uint32, devices map[string]*dataplane.Device) {
	rts := make([]speaker.RouteTarget, 0, len(devices))
	for vpc := range devices {
		if vni, ok := vnis[vpc]; ok {
			rts = append(rts, speaker.RouteTarget{ASN: d.cfg.RouteTargetASN, Value: vni})
		}
	}
	if g, ok := d.spk.(*speaker.GoBGP); ok {
		d.scale.spk.Store(g)
	}
	if err := d.spk.SetMembership(ctx, rts); err != nil {
		d.log.Error("route-target membership", "error", err)
	}
	peers, err := d.spk.RTCPeers(ctx)
	if err != nil || slices.Equal(peers, d.scale.rtcPeers) {
		return
	}
	if err := saveRTCPeers(d.o.StateDir, peers); err != nil {
		d.log.Warn("saving the peers that negotiate rtc", "error", err)
		return
	}
	d.scale.rtcPeers = peers
}

// rtcPeersPath keeps, across restarts, which peers negotiated rtc (see
// speaker.Options.RTCPeers).
func rtcPeersPath(stateDir string) string { return filepath.Join(stateDir, "router", "rtc-peers.json") }

// loadRTCPeers is best effort: without the file a restart offers rtc to
// no peer, which costs only the filtering.
func loadRTCPeers(stateDir string) []netip.Addr {
	var peers []netip.Addr
	data, err := os.ReadFile(rtcPeersPath(stateDir))
	if err == nil {
		_ = json.Unmarshal(data, &peers)
	}
	return peers
}

func saveRTCPeers(stateDir string, peers []netip.Addr) error {
	path := rtcPeersPath(stateDir)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, _ := json.Marshal(peers)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// savedMembership is the route targets of the VPCs a previous run had
// devices for, so a restarted router asks its peers for them from its
// first session on, before the first pass.
func savedMembership(rtASN uint16, vnis map[string]uint32) []speaker.RouteTarget {
	rts := make([]speaker.RouteTarget, 0, len(vnis))
	for _, vni := range vnis {
		rts = append(rts, speaker.RouteTarget{ASN: rtASN, Value: vni})
	}
	return rts
}

var (
	adjInDesc = prometheus.NewDesc("galactic_router_adj_rib_in_paths",
		"l2vpn-evpn paths received from the peers (adj-RIB-in, before the import filter).", nil, nil)
	filteredDesc = prometheus.NewDesc("galactic_router_import_filtered_paths",
		"Received paths of route targets of no VPC on this node, dropped before the RIB.", nil, nil)
	ribDesc = prometheus.NewDesc("galactic_router_rib_paths",
		"Best paths of other nodes in the router's RIB.", nil, nil)
	membersDesc = prometheus.NewDesc("galactic_router_route_target_memberships",
		"Route targets this node imports (and advertises membership of to rtc peers).", nil, nil)
)

// scaleCollector reads the speaker's table sizes at scrape time; spk is
// set by the loop, read by scrapes.
type scaleCollector struct {
	d   *Daemon
	spk atomic.Pointer[speaker.GoBGP]
	// rtcPeers is what was saved last; only the loop touches it.
	rtcPeers []netip.Addr
	// in is the last count of the Adj-RIB-In, served until inNext:
	// counting walks GoBGP's tables, so scrapes close together share one.
	inMu   sync.Mutex
	in     int
	inNext time.Time
}

// adjInFor is how long a count of the Adj-RIB-In serves scrapes at least
// (see askAgain).
const adjInFor = time.Second

func (c *scaleCollector) adjIn(ctx context.Context, spk *speaker.GoBGP) (int, error) {
	c.inMu.Lock()
	defer c.inMu.Unlock()
	now := c.d.clock.Now()
	if now.Before(c.inNext) {
		return c.in, nil
	}
	in, err := spk.AdjIn(ctx)
	if err != nil {
		return 0, err
	}
	c.in, c.inNext = in, askAgain(c.d.clock, now, adjInFor)
	return in, nil
}

func (c *scaleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{adjInDesc, filteredDesc, ribDesc, membersDesc} {
		ch <- d
	}
}

func (c *scaleCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(ribDesc, prometheus.GaugeValue, float64(c.d.rib.size.Load()))
	spk := c.spk.Load()
	if spk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if in, err := c.adjIn(ctx, spk); err == nil {
		ch <- prometheus.MustNewConstMetric(adjInDesc, prometheus.GaugeValue, float64(in))
		// The RIB view holds every member path of the live sessions.
		filtered := max(0, in-int(c.d.rib.current.Load()))
		ch <- prometheus.MustNewConstMetric(filteredDesc, prometheus.GaugeValue, float64(filtered))
	}
	ch <- prometheus.MustNewConstMetric(membersDesc, prometheus.GaugeValue, float64(len(spk.Membership())))
}
