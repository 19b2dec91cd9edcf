package routing

import (
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// ifName is the containers' interface (harness.Attachment's default).
const ifName = "net0"

// withHandoff is the attachments' handoff when a test turns it on: an ADD
// waits up to 20 s for the holder, a silent holder's lease lasts 5 s.
var withHandoff = &harness.Handoff{WaitSeconds: 20, LeaseSeconds: 5}

// kernelRoute returns node's route for p in the VPC's table, nil if none.
func kernelRoute(t *testing.T, n *harness.Node, vpc string, p netip.Prefix) *netlink.Route {
	t.Helper()
	r, err := n.KernelRoute(vpc, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// show runs a command in the node for a failure message.
func show(n *harness.Node, args ...string) string {
	out, _ := n.Run(args[0], args[1:]...)
	return strings.TrimSpace(out)
}

// routeMonitor records every kernel route change in a node.
type routeMonitor struct{ w *harness.RouteWatch }

func monitorRoutes(t *testing.T, n *harness.Node) *routeMonitor {
	t.Helper()
	w, err := n.WatchRoutes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return &routeMonitor{w}
}

// changes are the monitor's changes of p, one line each.
func (m *routeMonitor) changes(p netip.Prefix) []string {
	var out []string
	for _, c := range m.w.ChangesOf(p) {
		out = append(out, c.String())
	}
	return out
}

var sentinels atomic.Int32

// settle adds a new attachment on each node and waits until FRR holds its
// paths. A router acts on advertisement changes in order and BGP carries
// one session's updates in order, so FRR has then received every update
// the nodes' routers sent for what changed before: a test that counts
// FRR's updates counts them all.
func settle(t *testing.T, f *harness.Fabric, nodes ...*harness.Routed) {
	t.Helper()
	for _, n := range nodes {
		i := sentinels.Add(1)
		s := harness.Attachment{VPC: "blue", Name: fmt.Sprintf("sentinel-%d", i), VNI: 10100,
			Addresses: []string{fmt.Sprintf("10.29.%d.%d/24", i/200, i%200+10)}}
		n.Add(t, s)
		f.WaitPaths(t, 1, s.Prefix())
	}
}

// waitsFor waits until an ADD of the attachment on n waits for the lease
// held by holder.
func waitsFor(t *testing.T, n *harness.Node, a harness.Attachment, holder string) {
	t.Helper()
	harness.Eventually(t, 20*time.Second, fmt.Sprintf("the ADD on %s waiting for %s", n.Name, holder), func() error {
		if got := n.WaitingFor(a.LeaseName()); got != holder {
			return fmt.Errorf("waiting for %q", got)
		}
		return nil
	})
}
