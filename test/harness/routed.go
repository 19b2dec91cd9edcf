package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/router/config"
)

// The timers of the routers NewRouted starts, short so that a test
// outlasts them in seconds: a fixed wait in a test is for a window in
// which something must not happen, and that window is one of these.
const (
	// WithdrawHold is the routers' withdrawHoldSeconds. It still bridges
	// a reflector's return, where the nodes' sessions come back up to a
	// connect retry (2 s) apart and, on two loaded cores, their routes
	// seconds later still.
	WithdrawHold = 6 * time.Second
	// PastHold outlasts a hold that started when a test observed its
	// cause: the hold and a pass to act on it.
	PastHold = WithdrawHold + 500*time.Millisecond
	// RIBWait is the --rib-wait a test gives a router it starts again when
	// the test must outlast it (RIBWaitArgs): how long a started router
	// waits for its other peers' End-of-RIBs once one has sent it, or for
	// an established session's.
	RIBWait = time.Second
	// Resync is the routers' --resync.
	Resync = 2 * time.Second
)

// RouterArgs are the flags of the routers NewRouted starts.
func RouterArgs() []string { return []string{"--resync", Resync.String()} }

// RIBWaitArgs are the flags that give a router the test's RIBWait.
func RIBWaitArgs() []string { return []string{"--rib-wait", RIBWait.String()} }

// RouterConfig is the router.json of a test node at underlay: peering
// with the fabric's FRR (FabricRouterConfig) and the test timers above.
func (f *Fabric) RouterConfig(underlay netip.Addr) config.File {
	c := f.FabricRouterConfig(underlay)
	c.WithdrawHoldSeconds = new(int64(WithdrawHold / time.Second))
	return c
}

// ShippedHold gives a router the shipped withdrawal hold instead of the
// test one, for a test where the hold must bridge a withdrawal and the
// announcement that replaces it (a move's) under any load, and no wait
// outlasts it.
func ShippedHold(c *config.File) {
	c.WithdrawHoldSeconds = new(int64(config.DefaultWithdrawHoldSeconds))
}

// Routed is a node on the fabric with IP forwarding on (nodes forward
// between their workloads and the fabric) and, once Route has run,
// galactic-router.
type Routed struct {
	*Node
	Underlay netip.Addr
	Router   *Router
	fabric   *Fabric
}

// NewRouted makes node name on the fabric and starts its router with
// RouterConfig changed by each of mutate.
func (f *Fabric) NewRouted(t testing.TB, env *Env, name string, mutate ...func(*config.File)) *Routed {
	t.Helper()
	r := f.NewNode(t, env, name)
	r.Route(t, mutate...)
	return r
}

// NewNode makes node name on the fabric with forwarding on, without a
// router: for a test that must know the node's underlay address first.
func (f *Fabric) NewNode(t testing.TB, env *Env, name string) *Routed {
	t.Helper()
	n := env.NewNode(t, name)
	ul := f.Attach(t, n)
	n.EnableForwarding(t)
	return &Routed{Node: n, Underlay: ul, fabric: f}
}

// EnableForwarding turns IPv4 and IPv6 forwarding on in the node, a node
// prerequisite galactic does not change: traffic between two workloads,
// or between a workload and the fabric, needs it.
func (n *Node) EnableForwarding(t testing.TB) {
	t.Helper()
	if out, err := n.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		t.Fatalf("enabling forwarding on %s: %v %s", n.Name, err, out)
	}
}

// Route starts the node's router with RouterConfig changed by each of
// mutate; t's cleanup kills it.
func (r *Routed) Route(t testing.TB, mutate ...func(*config.File)) *Router {
	t.Helper()
	cfg := r.fabric.RouterConfig(r.Underlay)
	for _, m := range mutate {
		m(&cfg)
	}
	r.Router = r.StartRouter(t, cfg, RouterArgs()...)
	return r.Router
}

// AlsoPeer adds peers at addrs (in the fabric's AS) to a router config.
func AlsoPeer(addrs ...netip.Addr) func(*config.File) {
	return func(c *config.File) {
		for _, a := range addrs {
			c.Peers = append(c.Peers, Peer(a))
		}
	}
}

// WaitRouteVia waits until the node's route for p in the VPC's table goes
// via the underlay address via.
func (r *Routed) WaitRouteVia(t testing.TB, vpc string, p netip.Prefix, via netip.Addr) {
	t.Helper()
	Eventually(t, 30*time.Second, fmt.Sprintf("%s routes %s via %s", r.Name, p, via), func() error {
		rt, err := r.KernelRoute(vpc, p)
		if err != nil {
			return err
		}
		if rt == nil || rt.Gw == nil || !strings.HasSuffix(rt.Gw.String(), via.String()) {
			return fmt.Errorf("route %+v", rt)
		}
		return nil
	})
}

// WaitNoRoute waits until the node has no route for p in the VPC's table.
func (r *Routed) WaitNoRoute(t testing.TB, vpc string, p netip.Prefix) {
	t.Helper()
	Eventually(t, 30*time.Second, fmt.Sprintf("%s has no route for %s", r.Name, p), func() error {
		rt, err := r.KernelRoute(vpc, p)
		if err != nil {
			return err
		}
		if rt != nil {
			return fmt.Errorf("route %+v", rt)
		}
		return nil
	})
}

// Passes is how many reconcile passes the router has made.
func (r *Router) Passes() (float64, error) {
	body, err := r.Get("/metrics")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "galactic_router_passes_total{") {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				total += v
			}
		}
	}
	return total, nil
}

// WaitPasses waits until each router has made n more reconcile passes
// than when it is called: a router that would act on something it has
// seen has acted by then (with --resync, a pass comes at least every
// Resync). A test that must show that something did not happen waits for
// the passes in which it would have happened.
func WaitPasses(t testing.TB, n int, routers ...*Router) {
	t.Helper()
	from := make([]float64, len(routers))
	for i, r := range routers {
		v, err := r.Passes()
		if err != nil {
			t.Fatalf("the passes of the router on %s: %v", r.Node.Name, err)
		}
		from[i] = v
	}
	for i, r := range routers {
		Eventually(t, time.Duration(n+2)*Resync+10*time.Second, fmt.Sprintf("%d more passes of the router on %s", n, r.Node.Name), func() error {
			v, err := r.Passes()
			if err != nil {
				return err
			}
			if v < from[i]+float64(n) {
				return fmt.Errorf("%v passes, from %v", v, from[i])
			}
			return nil
		})
	}
}

// WaitEstablished waits until the router reports every one of its peers
// established (want sessions, or 0 to wait until none is).
func (r *Router) WaitEstablished(t testing.TB, want int) {
	t.Helper()
	Eventually(t, 30*time.Second, fmt.Sprintf("%d established sessions on %s", want, r.Node.Name), func() error {
		v, err := r.Metric(`galactic_router_peers{state="established"}`)
		if err != nil {
			return err
		}
		if int(v) != want {
			return fmt.Errorf("%v established", v)
		}
		return nil
	})
}

// Advertisement is node's advertisement of the attachment, nil when
// there is none.
func (e *Env) Advertisement(t testing.TB, a Attachment, node string) *v1alpha1.BGPAdvertisement {
	t.Helper()
	obj, err := e.API.BGPAdvertisements(Namespace).Get(context.Background(), names.Advertisement(a.VPC, a.Name, node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// WaitCondition waits until node's advertisement of the attachment has
// the condition typ with status and reason.
func (e *Env) WaitCondition(t testing.TB, a Attachment, node, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	Eventually(t, 20*time.Second, fmt.Sprintf("%s on %s: %s=%s (%s)", a.Name, node, typ, status, reason), func() error {
		obj := e.Advertisement(t, a, node)
		if obj == nil {
			return fmt.Errorf("no advertisement")
		}
		c := meta.FindStatusCondition(obj.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("conditions %+v", obj.Status.Conditions)
		}
		return nil
	})
}

// WaitPaths waits until FRR holds exactly n paths for each prefix.
func (f *Fabric) WaitPaths(t testing.TB, n int, prefixes ...netip.Prefix) {
	t.Helper()
	Eventually(t, 20*time.Second, fmt.Sprintf("FRR holds %d paths for %v", n, prefixes), func() error {
		routes, err := f.EVPNRoutes()
		if err != nil {
			return err
		}
		for _, p := range prefixes {
			if len(routes[p]) != n {
				return fmt.Errorf("%s: %d paths %+v", p, len(routes[p]), routes[p])
			}
		}
		return nil
	})
}

// Paths are FRR's paths for p; t fails when FRR cannot be read.
func (f *Fabric) Paths(t testing.TB, p netip.Prefix) []EVPNPath {
	t.Helper()
	routes, err := f.EVPNRoutes()
	if err != nil {
		t.Fatal(err)
	}
	return routes[p]
}

// Client is the client fixture: blue's client workload (10.20.0.7) that
// tests ping a VM from, on another node.
var Client = Attachment{VPC: "blue", Name: "client", VNI: 10100, Addresses: []string{"10.20.0.7/24"}}

// AddClient adds the Client attachment on the node and waits until it
// reaches addr.
func (r *Routed) AddClient(t testing.TB, addr netip.Addr) *Netns {
	t.Helper()
	wc := r.Add(t, Client)
	Eventually(t, 20*time.Second, fmt.Sprintf("the client on %s reaches %s", r.Name, addr), func() error { return wc.Ping(addr) })
	return wc
}

// Ping starts a Pinger from ns to addr every 10 ms, stopped when t ends
// unless the test stops it first.
func Ping(t testing.TB, ns *Netns, addr netip.Addr) *Pinger {
	t.Helper()
	p, err := ns.StartPinger(addr, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	return p
}

// WaitPing waits until ns reaches addr.
func (n *Netns) WaitPing(t testing.TB, addr netip.Addr) {
	t.Helper()
	Eventually(t, 30*time.Second, fmt.Sprintf("ping %s from %s", addr, n.Name), func() error { return n.Ping(addr) })
}

// CountAPIConnects counts the TCP connections processes in the node open
// to the API server (through its forwarder) from now on, with an
// nftables counter of its own in the node; t's cleanup removes it.
func (n *Node) CountAPIConnects(t testing.TB) (count func() int) {
	t.Helper()
	const table = "galactic-harness"
	for _, args := range [][]string{
		{"add", "table", "inet", table},
		{"add", "chain", "inet", table, "out", "{ type filter hook output priority 0; }"},
		{"add", "rule", "inet", table, "out", "tcp", "dport", fmt.Sprint(n.env.CP.Port), "tcp flags & (syn|ack) == syn", "counter"},
	} {
		if out, err := n.Run("nft", args...); err != nil {
			t.Fatalf("nft %s in %s: %v %s", strings.Join(args, " "), n.Name, err, out)
		}
	}
	t.Cleanup(func() { _, _ = n.Run("nft", "delete", "table", "inet", table) })
	return func() int {
		out, err := n.Run("nft", "-j", "list", "chain", "inet", table, "out")
		if err != nil {
			return 0
		}
		var list struct {
			Nftables []struct {
				Rule *struct {
					Expr []struct {
						Counter *struct {
							Packets int `json:"packets"`
						} `json:"counter"`
					} `json:"expr"`
				} `json:"rule"`
			} `json:"nftables"`
		}
		if json.Unmarshal([]byte(out), &list) != nil {
			return 0
		}
		for _, o := range list.Nftables {
			if o.Rule == nil {
				continue
			}
			for _, e := range o.Rule.Expr {
				if e.Counter != nil {
					return e.Counter.Packets
				}
			}
		}
		return 0
	}
}

// WaitRIB waits until the router's RIB holds want paths of other nodes,
// from a pass on: after its sessions' End-of-RIBs, a router whose RIB
// holds every path again holds no route withdrawn (every path the
// End-of-RIB swept is back), so none can go when a withdrawal hold ends.
func (r *Router) WaitRIB(t testing.TB, want int) {
	t.Helper()
	WaitPasses(t, 1, r)
	Eventually(t, 30*time.Second, fmt.Sprintf("%d paths in the RIB of the router on %s", want, r.Node.Name), func() error {
		v, err := r.Metric("galactic_router_rib_paths")
		if err != nil {
			return err
		}
		if int(v) != want {
			return fmt.Errorf("%v paths", v)
		}
		return nil
	})
}
