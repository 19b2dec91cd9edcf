package scale

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/scale"
)

func TestMain(m *testing.M) { scale.Main(m) }

// shape is a fabric: vpcs VPCs; every VPC is announced by two of the
// sims simulated nodes with prefixes prefixes each; real node k hosts
// hosted[k].
type shape struct {
	vpcs, sims, prefixes int
	hosted               [][]int
}

// maxSims is how many simulated nodes fit the fabric's /24 beside the
// reflectors and real nodes.
const maxSims = 200

// simUnderlay is simulated node i's address: 192.0.2.100 and up, or 50
// and up for more than 150 of them.
func (sh shape) simUnderlay(i int) netip.Addr {
	base := 100
	if sh.sims > 150 {
		base = 50
	}
	return netip.AddrFrom4([4]byte{192, 0, 2, byte(base + i)})
}

// small is the fabric of the CI tests: nodes 0 and 1 share five VPCs, so
// they route to each other too.
var small = shape{vpcs: 100, sims: 10, prefixes: 5, hosted: [][]int{span(0, 10), span(5, 15), span(20, 30)}}

func span(from, to int) []int {
	var out []int
	for v := from; v < to; v++ {
		out = append(out, v)
	}
	return out
}

func vpcName(v int) string { return fmt.Sprintf("vpc-%04d", v) }
func vni(v int) uint32     { return 20000 + uint32(v) }

// vpcAddr is address n of VPC v: 10.<v/256>.<v%256>.<n>.
func vpcAddr(v, n int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(v >> 8), byte(v), byte(n)})
}

// simSpec is the simulated nodes (simUnderlay), peering with rr.
func (sh shape) simSpec(rr netip.Addr) scale.Spec {
	s := scale.Spec{ASN: harness.FabricASN, RTASN: harness.FabricASN, Reflectors: []netip.Addr{rr}}
	for i := 0; i < sh.sims; i++ {
		s.Nodes = append(s.Nodes, scale.Node{Underlay: sh.simUnderlay(i)})
	}
	for v := 0; v < sh.vpcs; v++ {
		for j, i := range []int{v % sh.sims, (v + 3) % sh.sims} {
			vpc := scale.VPC{VNI: vni(v)}
			for k := 0; k < sh.prefixes; k++ {
				// .1 is the gateway of the real nodes' workloads.
				vpc.Prefixes = append(vpc.Prefixes, netip.PrefixFrom(vpcAddr(v, 2+j*sh.prefixes+k), 32))
			}
			s.Nodes[i].VPCs = append(s.Nodes[i].VPCs, vpc)
		}
	}
	return s
}

// realAddr is real node k's workload in VPC v.
func realAddr(k, v int) netip.Addr { return vpcAddr(v, 200+k) }

type node struct {
	*harness.Node
	k        int
	Underlay netip.Addr
	Router   *harness.Router
	cfg      config.File
	vpcs     []int
}

// topology is the fabric of a test: the simulated nodes and three real
// ones, all peering with one reflector.
type topology struct {
	// id keeps attachment names (and their handoff leases) apart
	// between the tests of one environment.
	id    int
	env   *harness.Env
	f     *harness.Fabric
	spec  scale.Spec
	sims  *scale.Sims
	nodes []*node
	// ribWait bounds waitRIBs (90 s when 0).
	ribWait time.Duration
	// routerArgs are the routers' flags when set (a 5 s resync when not);
	// memoryLimit their container's memory limit, none when 0.
	routerArgs  []string
	memoryLimit int64
}

var topologies int

func newTopology(t *testing.T, env *harness.Env, f *harness.Fabric, rr netip.Addr) *topology {
	t.Helper()
	return small.topology(t, env, f, rr)
}

func (sh shape) topology(t *testing.T, env *harness.Env, f *harness.Fabric, rr netip.Addr) *topology {
	t.Helper()
	topologies++
	top := &topology{id: topologies, env: env, f: f, spec: sh.simSpec(rr)}
	top.sims = scale.Start(t, f, top.spec)
	return sh.withTopology(t, top, rr)
}

// withTopology adds the real nodes to a fabric of simulated ones: each
// router starts, then its VPCs' workloads are attached one by one.
func (sh shape) withTopology(t *testing.T, top *topology, rr netip.Addr) *topology {
	t.Helper()
	for k := range sh.hosted {
		n := top.newNode(t, k, rr)
		n.Router = n.StartRouter(t, n.cfg, "--resync", "5s")
	}
	for _, n := range top.nodes {
		for _, v := range sh.hosted[n.k] {
			top.add(t, n, v)
		}
	}
	return top
}

// addParallel is how many ADDs withAddedNodes runs at once.
const addParallel = 4

// withAddedNodes adds the real nodes the other way round: every workload
// is attached (addParallel ADDs at a time) before the routers start, so
// a router's start finds its VPCs and advertisements there, as after a
// node's reboot or an upgrade. It returns when the routers were started.
func (sh shape) withAddedNodes(t *testing.T, top *topology, rr netip.Addr) time.Time {
	t.Helper()
	for k := range sh.hosted {
		top.newNode(t, k, rr)
	}
	for _, n := range top.nodes {
		work := make(chan int)
		errs := make(chan error, addParallel)
		for range addParallel {
			go func() {
				var first error
				for v := range work {
					if err := top.attach(t, n, v); err != nil && first == nil {
						first = err
					}
				}
				errs <- first
			}()
		}
		for _, v := range sh.hosted[n.k] {
			work <- v
		}
		close(work)
		for range addParallel {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		n.vpcs = append(n.vpcs, sh.hosted[n.k]...)
	}
	args := top.routerArgs
	if args == nil {
		args = []string{"--resync", "5s"}
	}
	started := time.Now()
	for _, n := range top.nodes {
		n.RouterMemoryLimit = top.memoryLimit
		n.Router = n.StartRouter(t, n.cfg, args...)
	}
	return started
}

// newNode makes real node k on the fabric, its router's config peering
// with rr (not started).
func (top *topology) newNode(t *testing.T, k int, rr netip.Addr) *node {
	t.Helper()
	r := top.f.NewNode(t, top.env, fmt.Sprintf("node-%d", k))
	// The shipped withdrawal hold: it bridges the reflector's return under
	// any load, and no wait here outlasts it.
	cfg := top.f.FabricRouterConfig(r.Underlay)
	cfg.Peers[0].Address = rr.String()
	nd := &node{Node: r.Node, k: k, Underlay: r.Underlay, cfg: cfg}
	top.nodes = append(top.nodes, nd)
	return nd
}

// add attaches a workload of VPC v to n.
func (top *topology) add(t *testing.T, n *node, v int) {
	t.Helper()
	if err := top.attach(t, n, v); err != nil {
		t.Fatal(err)
	}
	n.vpcs = append(n.vpcs, v)
}

// attach runs the ADD of add without recording it, so that several can
// run at once.
func (top *topology) attach(t *testing.T, n *node, v int) error {
	// The handoff as galactic-cni has it by default.
	a := harness.Attachment{VPC: vpcName(v), Name: fmt.Sprintf("w%d-%d", top.id, n.k), Addresses: []string{realAddr(n.k, v).String() + "/24"},
		VNI: int64(vni(v)), Handoff: &harness.Handoff{WaitSeconds: 30, LeaseSeconds: 60}}
	if err := n.WriteConflistFile(a.Conflist()); err != nil {
		return err
	}
	// Not NewContainer: attach may run off the test's goroutine.
	c, err := harness.CreateNetns("c")
	if err != nil {
		return err
	}
	t.Cleanup(func() { c.Delete() })
	if out, err := n.CNITool("add", a.Network(), c, a.Interface()); err != nil {
		return fmt.Errorf("ADD in %s on %s: %v %s", vpcName(v), n.Name, err, out)
	}
	return nil
}

// want is what n must install for VPC v: the simulated nodes' prefixes
// and the workloads of the other real nodes in v.
func (top *topology) want(n *node, v int) []netip.Prefix {
	out := top.spec.PrefixesOf(vni(v))
	for _, o := range top.nodes {
		if o != n && slices.Contains(o.vpcs, v) {
			out = append(out, netip.PrefixFrom(realAddr(o.k, v), 32))
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// wantRIB is how many paths n's RIB must hold: those of its VPCs.
func (top *topology) wantRIB(n *node) int {
	total := 0
	for _, v := range n.vpcs {
		total += len(top.want(n, v))
	}
	return total
}

// everyRoute is every route of the fabric but n's own.
func (top *topology) everyRoute(n *node) int {
	total := top.spec.Routes()
	for _, o := range top.nodes {
		if o != n {
			total += len(o.vpcs)
		}
	}
	return total
}

// remoteRoutes are the routes n's router installed in VPC v's table.
func remoteRoutes(n *node, v int) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := n.Do(func() error {
		d, err := routing.Find(vpcName(v))
		if err != nil || d == nil {
			return err
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: d.Table, Protocol: dataplane.Protocol},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Dst != nil {
				p, _ := netip.AddrFromSlice(r.Dst.IP.To4())
				bits, _ := r.Dst.Mask.Size()
				out = append(out, netip.PrefixFrom(p, bits))
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out, err
}

func metric(n *node, name string) float64 {
	v, err := n.Router.Metric(name)
	if err != nil {
		return -1
	}
	return v
}

// waitRIBs waits until every node's RIB holds exactly its VPCs' paths and
// its adj-RIB-in holds adjIn(n).
func (top *topology) waitRIBs(t *testing.T, adjIn func(*node) int) {
	t.Helper()
	for _, n := range top.nodes {
		harness.Eventually(t, cmp.Or(top.ribWait, 90*time.Second), n.Name+"'s RIB", func() error {
			rib, in := metric(n, "galactic_router_rib_paths"), metric(n, "galactic_router_adj_rib_in_paths")
			if int(rib) != top.wantRIB(n) || int(in) != adjIn(n) {
				return fmt.Errorf("RIB %v paths, adj-RIB-in %v; want %d and %d", rib, in, top.wantRIB(n), adjIn(n))
			}
			return nil
		})
	}
}

// checkKernels waits until every node's tables hold exactly its VPCs'
// remote routes.
func (top *topology) checkKernels(t *testing.T) {
	t.Helper()
	for _, n := range top.nodes {
		for _, v := range n.vpcs {
			harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s's routes of %s", n.Name, vpcName(v)), func() error {
				got, err := remoteRoutes(n, v)
				if err != nil {
					return err
				}
				if want := top.want(n, v); !slices.Equal(got, want) {
					return fmt.Errorf("installed %v, want %v", got, want)
				}
				return nil
			})
		}
	}
}

// routeMonitor records every kernel route change in a node.
type routeMonitor struct{ w *harness.RouteWatch }

func monitorRoutes(t *testing.T, n *node) *routeMonitor {
	t.Helper()
	w, err := n.WatchRoutes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return &routeMonitor{w}
}

// lines are the monitor's changes of galactic-router's routes, one line
// each.
func (m *routeMonitor) lines() []string {
	var out []string
	for _, c := range m.w.Changes() {
		if c.Protocol == dataplane.Protocol {
			out = append(out, c.String())
		}
	}
	return out
}

// restartRouter kills n's router and starts it again, and waits until it
// has taken over: its session up and its RIB synced.
func restartRouter(t *testing.T, n *node) {
	t.Helper()
	synced := strings.Count(n.Router.Log(), `"msg":"RIB synced"`)
	n.Router.Kill()
	if err := n.Router.Start(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, n.Name+"'s restarted router synced", func() error {
		if strings.Count(n.Router.Log(), `"msg":"RIB synced"`) <= synced {
			return fmt.Errorf("no End-of-RIB yet")
		}
		if v := metric(n, `galactic_router_peers{state="established"}`); v != 1 {
			return fmt.Errorf("%v sessions established", v)
		}
		return nil
	})
}

// frrSessionsLost counts the sessions FRR lost with addr since its log
// offset from.
func frrSessionsLost(t *testing.T, f *harness.Fabric, from int64, addr netip.Addr) int {
	t.Helper()
	data, err := os.ReadFile(f.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data[from:]), addr.String()+" went from Established to")
}
