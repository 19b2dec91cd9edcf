package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// FRRBgpd is where Debian's frr package puts bgpd.
const FRRBgpd = "/usr/lib/frr/bgpd"

// FabricASN is the AS of the test fabric: iBGP with FRR as route reflector.
const FabricASN = 65000

// Fabric is the test underlay: a network namespace with a bridge that every
// node joins by a veth, 192.0.2.0/24 inside the namespaces, and FRR's bgpd
// as the l2vpn-evpn route reflector at 192.0.2.1.
type Fabric struct {
	*Netns
	Options FabricOptions
	// RR is the route reflector's address, the bridge's.
	RR  netip.Addr
	dir string
	mu  sync.Mutex
	// next is the last octet of the next node's underlay address.
	next int
	bgpd *Process
}

// RequireFRR skips t when FRR's bgpd is not installed.
func RequireFRR(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(FRRBgpd); err != nil {
		t.Skip("routing test: needs FRR's bgpd (Debian: apt-get install frr; .ci/run installs it)")
	}
}

// FabricOptions change how FRR peers with the nodes.
type FabricOptions struct {
	// ASN is FRR's AS; nodes in another AS peer by eBGP. Default FabricASN.
	ASN int64
	// NodeASN is the nodes' AS (default ASN: iBGP with FRR reflecting).
	NodeASN int64
	// Port is where FRR listens (default 179); Password the TCP MD5 key.
	Port     int
	Password string
	// GracefulRestartSeconds turns FRR's graceful restart on with this
	// restart time; 0 leaves it off.
	GracefulRestartSeconds int
}

// NewFabric makes the fabric namespace, bridge and route reflector; t's
// cleanup removes them.
func NewFabric(t testing.TB) *Fabric { return NewFabricWith(t, FabricOptions{}) }

// NewFabricWith is NewFabric with FRR peering as o says.
func NewFabricWith(t testing.TB, o FabricOptions) *Fabric {
	t.Helper()
	RequireFRR(t)
	f, err := CreateFabric(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// CreateFabric is NewFabricWith outside a test; Close removes what it
// made.
func CreateFabric(o FabricOptions) (*Fabric, error) {
	if _, err := os.Stat(FRRBgpd); err != nil {
		return nil, fmt.Errorf("the fabric needs FRR's bgpd at %s (Debian: apt-get install frr)", FRRBgpd)
	}
	if o.ASN == 0 {
		o.ASN = FabricASN
	}
	if o.NodeASN == 0 {
		o.NodeASN = o.ASN
	}
	if o.Port == 0 {
		o.Port = 179
	}
	dir, err := MkdirTemp("galactic-fabric-")
	if err != nil {
		return nil, err
	}
	nn, err := CreateNetns("f")
	if err != nil {
		RemoveDir(dir)
		return nil, err
	}
	f := &Fabric{Netns: nn, Options: o, RR: netip.MustParseAddr("192.0.2.1"), dir: dir, next: 11}
	// bgpd drops privileges and must still reach its vty and log files.
	if err := os.Chmod(f.dir, 0o755); err != nil {
		f.Close()
		return nil, err
	}
	for _, args := range [][]string{
		{"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "link", "set", "br0", "up"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "br0"},
	} {
		if out, err := f.Run(args[0], args[1:]...); err != nil {
			f.Close()
			return nil, fmt.Errorf("%v: %v %s", args, err, out)
		}
	}
	if err := f.StartFRR(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Close stops bgpd and removes the namespace and bgpd's files.
func (f *Fabric) Close() {
	f.StopFRR()
	f.Netns.Delete()
	_ = RemoveDir(f.dir)
}

// Attach connects node to the fabric with a veth called ul0 and returns
// its underlay address.
func (f *Fabric) Attach(t testing.TB, n *Node) netip.Addr {
	t.Helper()
	addr, err := f.AttachNode(n)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// AttachNode is Attach outside a test; the veth goes with the node's
// namespace.
func (f *Fabric) AttachNode(n *Node) (netip.Addr, error) {
	f.mu.Lock()
	octet := f.next
	f.next++
	f.mu.Unlock()
	addr := netip.AddrFrom4([4]byte{192, 0, 2, byte(octet)})
	host := fmt.Sprintf("fb%d-%d", os.Getpid()%100000, octet)
	steps := [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", "ul0", "netns", n.Netns.Name},
		{"ip", "link", "set", host, "netns", f.Netns.Name},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return addr, fmt.Errorf("%v: %v %s", s, err, out)
		}
	}
	if out, err := f.Run("ip", "link", "set", host, "master", "br0", "up"); err != nil {
		return addr, fmt.Errorf("enslaving %s: %v %s", host, err, out)
	}
	for _, s := range [][]string{
		{"ip", "addr", "add", addr.String() + "/24", "dev", "ul0"},
		{"ip", "link", "set", "ul0", "up"},
	} {
		if out, err := n.Run(s[0], s[1:]...); err != nil {
			return addr, fmt.Errorf("%v: %v %s", s, err, out)
		}
	}
	return addr, nil
}

func (f *Fabric) vty() string { return filepath.Join(f.dir, "vty") }

// LogPath is bgpd's log, with updates received logged.
func (f *Fabric) LogPath() string { return filepath.Join(f.dir, "bgpd.log") }

const bgpdConf = `hostname fabric-rr
log file %s
log timestamp precision 6
debug bgp updates in
debug bgp neighbor-events
router bgp %d
 bgp router-id %s
 bgp cluster-id %s
 no bgp default ipv4-unicast
 neighbor nodes peer-group
 neighbor nodes remote-as %d
 neighbor nodes timers 3 9
 neighbor nodes timers connect 1
%s bgp listen range 192.0.2.0/24 peer-group nodes
 address-family l2vpn evpn
  neighbor nodes activate
%s exit-address-family
`

// StartFRR starts bgpd (again, after StopFRR).
func (f *Fabric) StartFRR() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bgpd != nil {
		return nil
	}
	if err := os.MkdirAll(f.vty(), 0o777); err != nil {
		return err
	}
	conf := filepath.Join(f.dir, "bgpd.conf")
	o := f.Options
	extra, af := "", "  neighbor nodes route-reflector-client\n"
	if o.Password != "" {
		extra += " neighbor nodes password " + o.Password + "\n"
	}
	if o.GracefulRestartSeconds > 0 {
		extra += fmt.Sprintf(" bgp graceful-restart\n bgp graceful-restart restart-time %d\n", o.GracefulRestartSeconds)
	}
	if o.NodeASN != o.ASN {
		// eBGP: FRR passes the routes on unchanged, as a fabric would.
		extra += " no bgp ebgp-requires-policy\n"
		af = "  neighbor nodes next-hop-unchanged\n"
	}
	data := fmt.Sprintf(bgpdConf, f.LogPath(), o.ASN, f.RR, f.RR, o.NodeASN, extra, af)
	if err := os.WriteFile(conf, []byte(data), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", f.Netns.Name, FRRBgpd, "-Z", "-S", "-n",
		"-f", conf, "-i", filepath.Join(f.dir, "bgpd.pid"), "--vty_socket", f.vty(), "-p", fmt.Sprint(o.Port))
	p, err := StartProcess("bgpd", cmd, filepath.Join(f.dir, "bgpd.out"))
	if err != nil {
		return err
	}
	f.bgpd = p
	err = Poll(context.Background(), 10*time.Second, "bgpd answering vtysh", func() error {
		if !p.Running() {
			return fmt.Errorf("bgpd exited: %s", fileTail(filepath.Join(f.dir, "bgpd.out"), 10))
		}
		_, err := f.Vtysh("show bgp summary json")
		return err
	})
	if err != nil {
		return fmt.Errorf("%w; its output is in %s", err, filepath.Join(f.dir, "bgpd.out"))
	}
	return nil
}

// StopFRR kills bgpd.
func (f *Fabric) StopFRR() {
	f.mu.Lock()
	p := f.bgpd
	f.bgpd = nil
	f.mu.Unlock()
	if p == nil {
		return
	}
	p.Kill()
	_ = os.Remove(filepath.Join(f.vty(), "bgpd.vty"))
}

// Vtysh runs one vtysh command against the fabric's bgpd.
func (f *Fabric) Vtysh(command string) (string, error) {
	out, err := exec.Command("vtysh", "--vty_socket", f.vty(), "-c", command).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vtysh -c %q: %v: %s", command, err, out)
	}
	return string(out), nil
}

// EVPNPath is one path FRR holds for a type-5 route.
type EVPNPath struct {
	RD        string
	Prefix    netip.Prefix
	NextHop   string
	Extended  string
	Large     string
	Community string
	PeerID    string
	Best      bool
}

// EVPNRoutes returns every type-5 path FRR holds, by prefix.
func (f *Fabric) EVPNRoutes() (map[netip.Prefix][]EVPNPath, error) {
	out, err := f.Vtysh("show bgp l2vpn evpn route detail type prefix json")
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		return nil, fmt.Errorf("FRR's JSON: %w: %s", err, out)
	}
	res := map[netip.Prefix][]EVPNPath{}
	for rd, raw := range top {
		var byPrefix map[string]json.RawMessage
		if json.Unmarshal(raw, &byPrefix) != nil {
			continue
		}
		for _, praw := range byPrefix {
			var dest struct {
				Paths [][]struct {
					Bestpath struct {
						Overall bool `json:"overall"`
					} `json:"bestpath"`
					Peer struct {
						PeerID string `json:"peerId"`
					} `json:"peer"`
					ExtendedCommunity struct {
						String string `json:"string"`
					} `json:"extendedCommunity"`
					LargeCommunity struct {
						String string `json:"string"`
					} `json:"largeCommunity"`
					Community struct {
						String string `json:"string"`
					} `json:"community"`
					Nexthops []struct {
						IP string `json:"ip"`
					} `json:"nexthops"`
				} `json:"paths"`
			}
			var head struct {
				IP    string `json:"ip"`
				IPLen int    `json:"ipLen"`
			}
			if json.Unmarshal(praw, &dest) != nil || json.Unmarshal(praw, &head) != nil {
				continue
			}
			for _, group := range dest.Paths {
				for _, p := range group {
					a, err := netip.ParseAddr(head.IP)
					if err != nil {
						continue
					}
					ep := EVPNPath{RD: rd, Prefix: netip.PrefixFrom(a, head.IPLen), PeerID: p.Peer.PeerID, Best: p.Bestpath.Overall,
						Extended: p.ExtendedCommunity.String, Large: p.LargeCommunity.String, Community: p.Community.String}
					if len(p.Nexthops) > 0 {
						ep.NextHop = p.Nexthops[0].IP
					}
					res[ep.Prefix] = append(res[ep.Prefix], ep)
				}
			}
		}
	}
	return res, nil
}

// Updates counts what FRR's log says it received for a prefix since the
// log offset from: announcements and withdrawals (each per peer), and
// notifications received from peer (any, when peer is empty).
type Updates struct {
	Announced, Withdrawn map[string]int
	Notifications        int
}

var (
	rcvdRE     = regexp.MustCompile(`BGP: \[[^\]]+\] (\S+?)(?:\([^)]*\))? rcvd RD (\S+) \[5\]:\[0\]:\[(\d+)\]:\[([^\]]+)\] label`)
	withdrawRE = regexp.MustCompile(`BGP: \[[^\]]+\] (\S+?)(?:\([^)]*\))? rcvd UPDATE about RD (\S+) \[5\]:\[0\]:\[(\d+)\]:\[([^\]]+)\] .*-- withdrawn`)
)

// LogOffset is the current size of FRR's log, to count from.
func (f *Fabric) LogOffset() int64 {
	st, err := os.Stat(f.LogPath())
	if err != nil {
		return 0
	}
	return st.Size()
}

// LogUpdate is one update line of FRR's log about a type-5 route.
type LogUpdate struct {
	// At is the line's timestamp (the log has microseconds).
	At        time.Time
	Peer      string
	RD        string
	Prefix    netip.Prefix
	Withdrawn bool
}

// ReadUpdates parses FRR's log from offset: the type-5 updates, the number
// of notifications received and the offset after the last whole line.
func (f *Fabric) ReadUpdates(from int64) (ups []LogUpdate, notifications int, next int64, err error) {
	fh, err := os.Open(f.LogPath())
	if err != nil {
		return nil, 0, from, err
	}
	defer fh.Close()
	if _, err := fh.Seek(from, 0); err != nil {
		return nil, 0, from, err
	}
	r := bufio.NewReaderSize(fh, 1<<20)
	next = from
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			// A line without its newline is still being written.
			break
		}
		next += int64(len(line))
		if u, ok := parseUpdate(line); ok {
			ups = append(ups, u)
		} else if strings.Contains(line, "NOTIFICATION: received from neighbor") {
			notifications++
		}
	}
	return ups, notifications, next, nil
}

func parseUpdate(line string) (LogUpdate, bool) {
	m, withdrawn := withdrawRE.FindStringSubmatch(line), true
	if m == nil {
		m, withdrawn = rcvdRE.FindStringSubmatch(line), false
	}
	if m == nil {
		return LogUpdate{}, false
	}
	a, err := netip.ParseAddr(m[4])
	if err != nil {
		return LogUpdate{}, false
	}
	var bits int
	fmt.Sscan(m[3], &bits)
	u := LogUpdate{Peer: m[1], RD: m[2], Prefix: netip.PrefixFrom(a, bits), Withdrawn: withdrawn}
	if len(line) >= 26 {
		u.At, _ = time.ParseInLocation("2006/01/02 15:04:05.000000", line[:26], time.Local)
	}
	return u, true
}

// CountUpdates reads FRR's log from offset and counts prefix's updates.
func (f *Fabric) CountUpdates(from int64, prefix netip.Prefix) (Updates, error) {
	u := Updates{Announced: map[string]int{}, Withdrawn: map[string]int{}}
	ups, notes, _, err := f.ReadUpdates(from)
	if err != nil {
		return u, err
	}
	u.Notifications = notes
	for _, x := range ups {
		switch {
		case x.Prefix != prefix:
		case x.Withdrawn:
			u.Withdrawn[x.Peer]++
		default:
			u.Announced[x.Peer]++
		}
	}
	return u, nil
}

// PeerStates is FRR's session state per peer address
// (`show bgp l2vpn evpn summary json`).
func (f *Fabric) PeerStates() (map[string]string, error) {
	out, err := f.Vtysh("show bgp l2vpn evpn summary json")
	if err != nil {
		return nil, err
	}
	var sum struct {
		Peers map[string]struct {
			State string `json:"state"`
		} `json:"peers"`
	}
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		return nil, fmt.Errorf("FRR's summary: %w: %s", err, out)
	}
	states := map[string]string{}
	for addr, p := range sum.Peers {
		states[addr] = p.State
	}
	return states, nil
}
