package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// GoBGPd is Debian's gobgpd in the fabric namespace: a second peer that,
// unlike FRR 8.4, helps graceful restart for l2vpn-evpn.
type GoBGPd struct {
	// ns is its own namespace on the fabric bridge: FRR holds port 179 in
	// the fabric's.
	ns      *Netns
	f       *Fabric
	Addr    netip.Addr
	apiPort int
	proc    *Process
}

// RequireGoBGPd skips t without Debian's gobgpd and gobgp.
func RequireGoBGPd(t testing.TB) {
	t.Helper()
	for _, b := range []string{"gobgpd", "gobgp"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skip("graceful-restart helper test: needs Debian's gobgpd (apt-get install gobgpd; .ci/run installs it)")
		}
	}
}

const gobgpdConf = `[global.config]
  as = %d
  router-id = "%s"
  port = 179
  local-address-list = ["%s"]
%s`

const gobgpdNeighbor = `[[neighbors]]
  [neighbors.config]
    neighbor-address = "%s"
    peer-as = %d
  [neighbors.timers.config]
    connect-retry = 1
    hold-time = 9
    keepalive-interval = 3
    idle-hold-time-after-reset = 1
  [neighbors.transport.config]
    passive-mode = true
%s  [neighbors.graceful-restart.config]
    enabled = true
    restart-time = 120
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "l2vpn-evpn"
    [neighbors.afi-safis.mp-graceful-restart.config]
      enabled = true
`

// gobgpdReflectorClient makes a neighbour a route-reflector client.
const gobgpdReflectorClient = `  [neighbors.route-reflector.config]
    route-reflector-client = true
    route-reflector-cluster-id = "192.0.2.2"
`

// StartGoBGPd runs gobgpd at 192.0.2.2 with the given nodes as passive
// neighbours; t's cleanup stops it.
func (f *Fabric) StartGoBGPd(t testing.TB, neighbors ...netip.Addr) *GoBGPd {
	t.Helper()
	return f.startGoBGPd(t, false, neighbors)
}

// StartGoBGPdReflector is StartGoBGPd with gobgpd reflecting l2vpn-evpn
// between the nodes: a second route reflector beside FRR.
func (f *Fabric) StartGoBGPdReflector(t testing.TB, neighbors ...netip.Addr) *GoBGPd {
	t.Helper()
	return f.startGoBGPd(t, true, neighbors)
}

func (f *Fabric) startGoBGPd(t testing.TB, reflector bool, neighbors []netip.Addr) *GoBGPd {
	t.Helper()
	RequireGoBGPd(t)
	g := &GoBGPd{ns: NewNetns(t, "g"), f: f, Addr: netip.MustParseAddr("192.0.2.2"), apiPort: 50151}
	if err := f.joinBridge(g.ns, fmt.Sprintf("fg%d", os.Getpid()%100000), g.Addr); err != nil {
		t.Fatal(err)
	}
	var ns string
	for _, n := range neighbors {
		rr := ""
		if reflector {
			rr = gobgpdReflectorClient
		}
		ns += fmt.Sprintf(gobgpdNeighbor, n, FabricASN, rr)
	}
	conf := filepath.Join(f.dir, "gobgpd.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(gobgpdConf, FabricASN, g.Addr, g.Addr, ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(f.dir, "gobgpd.log")
	cmd := exec.Command("ip", "netns", "exec", g.ns.Name, "gobgpd", "-f", conf, "--api-hosts", fmt.Sprintf("127.0.0.1:%d", g.apiPort))
	var err error
	if g.proc, err = StartProcess("gobgpd", cmd, logPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.proc.Kill)
	Eventually(t, 10*time.Second, "gobgpd answering gobgp", func() error {
		if _, err := g.CLI("global"); err != nil {
			return fmt.Errorf("%v\n%s", err, fileTail(logPath, 20))
		}
		return nil
	})
	return g
}

// CLI runs the gobgp command against this gobgpd.
func (g *GoBGPd) CLI(args ...string) (string, error) {
	out, err := g.ns.Run("gobgp", append([]string{"-p", fmt.Sprint(g.apiPort)}, args...)...)
	if err != nil {
		return out, fmt.Errorf("gobgp %v: %v: %s", args, err, out)
	}
	return out, nil
}

// GoBGPPath is one EVPN path in gobgpd's RIB.
type GoBGPPath struct {
	NLRI  string
	Stale bool
}

// EVPNPaths lists gobgpd's l2vpn-evpn paths.
func (g *GoBGPd) EVPNPaths() ([]GoBGPPath, error) {
	out, err := g.CLI("global", "rib", "-a", "evpn", "-j")
	if err != nil {
		return nil, err
	}
	var dests map[string][]struct {
		NLRI  json.RawMessage `json:"nlri"`
		Stale bool            `json:"stale"`
	}
	if err := json.Unmarshal([]byte(out), &dests); err != nil {
		return nil, fmt.Errorf("gobgp's JSON: %w: %s", err, out)
	}
	var paths []GoBGPPath
	for key, ps := range dests {
		for _, p := range ps {
			paths = append(paths, GoBGPPath{NLRI: key, Stale: p.Stale})
		}
	}
	return paths, nil
}

// RestartFlags are the graceful-restart flags the peer at addr sent in
// its last OPEN, as gobgpd saw them: the Restart State bit, and the
// forwarding-state bit of l2vpn-evpn.
func (g *GoBGPd) RestartFlags(addr netip.Addr) (restart, forward bool, err error) {
	out, err := g.CLI("neighbor", addr.String())
	if err != nil {
		return false, false, err
	}
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "graceful-restart:") {
			continue
		}
		remote := false
		for _, m := range lines[i+1:] {
			t := strings.TrimSpace(m)
			if t == "" {
				continue
			}
			switch {
			case strings.HasPrefix(t, "Remote:"):
				remote = true
				restart = strings.Contains(t, "restart flag set")
			case strings.HasPrefix(t, "Local:"):
				remote = false
			case strings.HasPrefix(m, "    ") && !strings.HasPrefix(m, "     ") && strings.HasSuffix(strings.Fields(t)[0], ":"):
				// The next capability.
				return restart, forward, nil
			case remote && strings.Contains(t, "l2vpn-evpn"):
				forward = strings.Contains(t, "forward flag set")
			}
		}
		return restart, forward, nil
	}
	return false, false, fmt.Errorf("gobgpd shows no graceful-restart capability of %s:\n%s", addr, out)
}
