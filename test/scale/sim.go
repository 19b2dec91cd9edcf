// Package scale runs simulated galactic nodes for scale tests: many GoBGP
// speakers in one process, each with its own router ID, underlay address
// and sessions to the fabric's reflectors, announcing EVPN type-5 routes
// with galactic-router's own speaker code (router/speaker), so what they
// send is what a node sends. They run inside the fabric namespace, next
// to real nodes running galactic-router.
package scale

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/speaker"
	"github.com/galactic-cni/galactic/test/harness"
)

// envSpec names the spec file of a process that is to run simulated
// nodes instead of tests.
const envSpec = "GALACTIC_SIMNODES_SPEC"

// Spec is the simulated part of a fabric.
type Spec struct {
	// ASN is every simulated node's AS, RTASN the route-target AS.
	ASN   uint32 `json:"asn"`
	RTASN uint16 `json:"rtASN"`
	// Reflectors are the addresses every node peers with (port 179).
	Reflectors []netip.Addr `json:"reflectors"`
	Nodes      []Node       `json:"nodes"`
	// ChurnPerSecond, when set, sends that many updates a second from
	// Sims.StartChurn on, moving the routes of the VPCs ChurnVNIs names
	// between their prefixes and Alternate ones (runChurn).
	ChurnPerSecond int      `json:"churnPerSecond,omitempty"`
	ChurnVNIs      []uint32 `json:"churnVNIs,omitempty"`
	// HoldSeconds is the simulated nodes' hold time (9 s, a node's
	// default, when 0), their keepalive a third of it.
	HoldSeconds int `json:"holdSeconds,omitempty"`
	// Imports, when set, are the only VPCs the simulated nodes import
	// (and advertise membership of); by default each imports all of its
	// own, as a real node does. GoBGP's reflector checks every path it
	// sends against every membership of the receiving peer, so a fabric
	// of many members costs it time per route in proportion (see
	// docs/concepts/routing.md, Scale).
	Imports []uint32 `json:"imports,omitempty"`
}

// Node is one simulated node.
type Node struct {
	Underlay netip.Addr `json:"underlay"`
	VPCs     []VPC      `json:"vpcs"`
}

// VPC is what a simulated node announces in one VPC.
type VPC struct {
	VNI      uint32         `json:"vni"`
	Prefixes []netip.Prefix `json:"prefixes"`
}

// Routes is every route the spec announces.
func (s Spec) Routes() int {
	n := 0
	for _, node := range s.Nodes {
		for _, v := range node.VPCs {
			n += len(v.Prefixes)
		}
	}
	return n
}

// RoutesOf counts the routes of one VNI.
func (s Spec) RoutesOf(vni uint32) int {
	n := 0
	for _, node := range s.Nodes {
		for _, v := range node.VPCs {
			if v.VNI == vni {
				n += len(v.Prefixes)
			}
		}
	}
	return n
}

// PrefixesOf are the prefixes announced for one VNI.
func (s Spec) PrefixesOf(vni uint32) []netip.Prefix {
	var out []netip.Prefix
	for _, node := range s.Nodes {
		for _, v := range node.VPCs {
			if v.VNI == vni {
				out = append(out, v.Prefixes...)
			}
		}
	}
	return out
}

// Main runs the package's tests, or, in a process Start made, the
// simulated nodes until it is told to stop.
func Main(m *testing.M) {
	if path := os.Getenv(envSpec); path != "" {
		if err := serve(path); err != nil {
			fmt.Fprintln(os.Stderr, "simulated nodes:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	harness.Main(m)
}

// routerMAC is a simulated node's router MAC in a VPC: locally
// administered, from its underlay and VNI.
func routerMAC(underlay netip.Addr, vni uint32) net.HardwareAddr {
	a := underlay.As4()
	return net.HardwareAddr{0x02, a[3], byte(vni >> 16), byte(vni >> 8), byte(vni), 0x01}
}

// nodeConfig is a simulated node's router config: the way the installer
// configures a real node, with timers short enough for tests.
func (s Spec) nodeConfig(n Node) *config.Config {
	c := &config.Config{Role: config.RoleNode, ASN: s.ASN, RouterID: n.Underlay, Underlay: n.Underlay, ListenPort: -1,
		RouteTargetASN: s.RTASN, GracefulRestart: true, RestartTime: 120 * time.Second}
	hold := time.Duration(cmp.Or(s.HoldSeconds, config.DefaultHoldSeconds)) * time.Second
	for _, rr := range s.Reflectors {
		c.Peers = append(c.Peers, config.Peer{Address: rr, ASN: s.ASN, Port: 179, Hold: hold, Keepalive: hold / 3})
	}
	return c
}

// serve starts every simulated node of the spec at path and announces
// its routes; it returns when the process is told to stop.
func serve(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var churn []churned
	// churning is set once the churn runs: from then on the simulated
	// nodes that import a churned VPC log when its routes arrive, which
	// times the reflector's propagation (Propagation).
	var churning atomic.Bool
	received := func(ev speaker.Event) {
		if ev.Kind != speaker.EventPaths || !churning.Load() {
			return
		}
		at := time.Now()
		for _, r := range ev.Paths {
			if !r.Withdrawn && slices.Contains(s.ChurnVNIs, r.VNI) {
				fmt.Printf("churn received %s %d\n", r.Prefix, at.UnixNano())
			}
		}
	}
	for _, n := range s.Nodes {
		// Like a real node, a simulated one imports only its VPCs.
		var rts []speaker.RouteTarget
		for _, v := range n.VPCs {
			if s.Imports == nil || slices.Contains(s.Imports, v.VNI) {
				rts = append(rts, speaker.RouteTarget{ASN: s.RTASN, Value: v.VNI})
			}
		}
		// Every route goes in before the sessions come up: a peer then
		// gets them in one burst, not one Announce (and its own pass
		// through GoBGP) at a time.
		var routes []speaker.Route
		for i, v := range n.VPCs {
			for _, p := range v.Prefixes {
				routes = append(routes, speaker.Route{RD: speaker.RD{Admin: n.Underlay, Assigned: uint16(i + 1)}, Prefix: p, VNI: v.VNI, RTASN: s.RTASN,
					NextHop: n.Underlay, RouterMAC: routerMAC(n.Underlay, v.VNI), Generation: 1})
			}
		}
		o := speaker.Options{Config: s.nodeConfig(n), Log: log.With("node", n.Underlay.String()), Membership: rts, Routes: routes}
		for _, rt := range rts {
			if slices.Contains(s.ChurnVNIs, rt.Value) {
				o.OnEvent = received
			}
		}
		g, err := speaker.Start(ctx, o)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Underlay, err)
		}
		for _, r := range routes {
			if slices.Contains(s.ChurnVNIs, r.VNI) {
				churn = append(churn, churned{g, r})
			}
		}
	}
	fmt.Println("simulated nodes started:", len(s.Nodes))
	if s.ChurnPerSecond > 0 && len(churn) > 0 {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
		go func() {
			g := &churnGate{paused: true}
			for {
				select {
				case v := <-sig:
					// The gate's lock is held for an update: once "paused" is
					// printed, no update is on its way.
					g.mu.Lock()
					g.paused = v == syscall.SIGUSR2
					g.mu.Unlock()
					if v == syscall.SIGUSR2 {
						fmt.Println("churn paused")
						continue
					}
					fmt.Println("churn started:", len(churn), "routes")
					if !churning.Swap(true) {
						go runChurn(ctx, churn, s.ChurnPerSecond, g, log)
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	<-ctx.Done()
	return nil
}

// churned is a route the churn moves.
type churned struct {
	g *speaker.GoBGP
	r speaker.Route
}

// Alternate is the prefix a churned route moves to and back from: the
// second octet's top bit flipped (10.0.0.5/32 and 10.128.0.5/32).
func Alternate(p netip.Prefix) netip.Prefix {
	a := p.Addr().As4()
	a[1] ^= 0x80
	return netip.PrefixFrom(netip.AddrFrom4(a), p.Bits())
}

// churnGate pauses the churn between updates; mu is held for an update.
type churnGate struct {
	mu     sync.Mutex
	paused bool
}

// runChurn sends perSecond updates a second while g is open: walking the
// routes, it announces each at its alternate prefix and withdraws it
// where it was, two updates, and logs when each announce went out, so a
// test can time it to the kernel of a node.
func runChurn(ctx context.Context, routes []churned, perSecond int, g *churnGate, log *slog.Logger) {
	tick := time.NewTicker(2 * time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for i := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		g.mu.Lock()
		if !g.paused {
			churnOne(ctx, &routes[i], log)
			i = (i + 1) % len(routes)
		}
		g.mu.Unlock()
	}
}

// churnOne moves one route to its alternate prefix.
func churnOne(ctx context.Context, c *churned, log *slog.Logger) {
	next := c.r
	next.Prefix = Alternate(c.r.Prefix)
	at := time.Now()
	if err := c.g.Announce(ctx, next); err != nil {
		log.Warn("churn", "route", next.Key().String(), "error", err)
		return
	}
	if err := c.g.Withdraw(ctx, c.r.Key()); err != nil {
		log.Warn("churn", "route", c.r.Key().String(), "error", err)
	}
	fmt.Printf("churn announce %s %d\n", next.Prefix, at.UnixNano())
	c.r = next
}

// Announce is one churn announce as the simulated nodes logged it.
type Announce struct {
	Prefix netip.Prefix
	At     time.Time
}

// Announces are the churn's announces so far.
func (s *Sims) Announces() []Announce {
	var out []Announce
	for _, l := range strings.Split(s.Log(), "\n") {
		var p string
		var ns int64
		if _, err := fmt.Sscanf(l, "churn announce %s %d", &p, &ns); err != nil {
			continue
		}
		if pfx, err := netip.ParsePrefix(p); err == nil {
			out = append(out, Announce{pfx, time.Unix(0, ns)})
		}
	}
	return out
}

// Propagation times each churn announce from the simulated node that
// sent it to the first simulated node that received it through the
// reflector (both in this process, so on one clock).
func (s *Sims) Propagation() []time.Duration {
	// The announce is logged after it went out, so a receipt may come
	// first in the log.
	sent, got := map[netip.Prefix]time.Time{}, map[netip.Prefix][]time.Time{}
	for _, l := range strings.Split(s.Log(), "\n") {
		var verb, p string
		var ns int64
		if _, err := fmt.Sscanf(l, "churn %s %s %d", &verb, &p, &ns); err != nil {
			continue
		}
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			continue
		}
		switch verb {
		case "announce":
			sent[pfx] = time.Unix(0, ns)
		case "received":
			got[pfx] = append(got[pfx], time.Unix(0, ns))
		}
	}
	var out []time.Duration
	for pfx, at := range sent {
		for _, r := range got[pfx] {
			if r.After(at) {
				out = append(out, r.Sub(at))
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// Sims is a running process of simulated nodes.
type Sims struct {
	Spec    Spec
	LogPath string
	proc    *harness.Process
}

// Start gives every simulated node its underlay address on the fabric's
// bridge and runs them all in one process in the fabric namespace; t's
// cleanup stops it.
func Start(t testing.TB, f *harness.Fabric, s Spec) *Sims {
	t.Helper()
	dir := t.TempDir()
	for _, n := range s.Nodes {
		if out, err := f.Run("ip", "addr", "add", n.Underlay.String()+"/32", "dev", "br0"); err != nil {
			t.Fatalf("underlay of %s: %v %s", n.Underlay, err, out)
		}
	}
	data, _ := json.Marshal(s)
	spec := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(spec, data, 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sims := &Sims{Spec: s, LogPath: filepath.Join(dir, "sims.log")}
	cmd := exec.Command("ip", "netns", "exec", f.Netns.Name, self)
	cmd.Env = append(os.Environ(), envSpec+"="+spec)
	if sims.proc, err = harness.StartProcess("the simulated nodes", cmd, sims.LogPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sims.Stop)
	// Starting takes about a second per hundred routes on a busy machine.
	harness.Eventually(t, 30*time.Second+time.Duration(s.Routes())*10*time.Millisecond, "the simulated nodes started", func() error {
		if !sims.proc.Running() {
			t.Fatalf("the simulated nodes exited: %s", sims.Log())
		}
		if !strings.Contains(sims.Log(), "simulated nodes started") {
			return errors.New("not yet")
		}
		return nil
	})
	return sims
}

// Pid is the process's ID (ip netns exec execs it in place).
func (s *Sims) Pid() int { return s.proc.Pid() }

// Log is the process's output so far.
func (s *Sims) Log() string {
	b, _ := os.ReadFile(s.LogPath)
	return string(b)
}

// StartChurn starts the spec's churn, or resumes it, and waits until it
// runs.
func (s *Sims) StartChurn(t testing.TB) { s.signalChurn(t, syscall.SIGUSR1, "churn started") }

// PauseChurn pauses the churn and waits until no update is on its way.
func (s *Sims) PauseChurn(t testing.TB) { s.signalChurn(t, syscall.SIGUSR2, "churn paused") }

// signalChurn sends sig and waits for one more line beginning with said.
func (s *Sims) signalChurn(t testing.TB, sig syscall.Signal, said string) {
	t.Helper()
	lines := func() int { return strings.Count(s.Log(), "\n"+said) }
	before := lines()
	if err := s.proc.Signal(sig); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("the simulated nodes saying %q", said), func() error {
		if lines() == before {
			return fmt.Errorf("not yet: %s", s.Log())
		}
		return nil
	})
}

// Stop ends the process (its sessions go with it).
func (s *Sims) Stop() {
	s.proc.Stop(syscall.SIGTERM, 10*time.Second)
}
