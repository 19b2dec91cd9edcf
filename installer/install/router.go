package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/router/config"
)

// RouterBinaryName is the node BGP speaker; uninstall runs its drain.
const RouterBinaryName = "galactic-router"

// drainTimeout bounds uninstall's wait for the router to drain.
const drainTimeout = time.Minute

// RouterSettings are the router.json keys given as flags; nil (or no
// peers) leaves the key to the source file or the router's default.
type RouterSettings struct {
	ASN, RouteTargetASN, ListenPort, WithdrawHoldSeconds, RestartSeconds, StaleRoutesSeconds *int64
	Underlay, RouterID, MetricsAddress                                                       *string
	// Peers, when given, replace the source file's peers.
	Peers []RouterPeer
}

// RouterPeer is one --router-peer.
type RouterPeer struct {
	Address string
	ASN     int64
	Port    *int64
}

// ParseRouterPeer reads ADDRESS:ASN[:PORT]; an IPv6 address is written in
// brackets, [fd00::1]:65000.
func ParseRouterPeer(s string) (RouterPeer, error) {
	bad := fmt.Errorf("--router-peer %q is not ADDRESS:ASN[:PORT] (IPv6 in brackets: [fd00::1]:65000:179)", s)
	var addr, rest string
	if strings.HasPrefix(s, "[") {
		i := strings.Index(s, "]:")
		if i < 0 {
			return RouterPeer{}, bad
		}
		addr, rest = s[1:i], s[i+2:]
	} else {
		var ok bool
		if addr, rest, ok = strings.Cut(s, ":"); !ok {
			return RouterPeer{}, bad
		}
	}
	if a, err := netip.ParseAddr(addr); err != nil || a.Zone() != "" {
		return RouterPeer{}, bad
	}
	fields := strings.Split(rest, ":")
	if len(fields) > 2 {
		return RouterPeer{}, bad
	}
	nums := make([]int64, len(fields))
	for i, f := range fields {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return RouterPeer{}, bad
		}
		nums[i] = n
	}
	p := RouterPeer{Address: addr, ASN: nums[0]}
	if len(nums) == 2 {
		p.Port = &nums[1]
	}
	return p, nil
}

func (r RouterSettings) empty() bool {
	return r.ASN == nil && r.RouteTargetASN == nil && r.ListenPort == nil && r.WithdrawHoldSeconds == nil &&
		r.StaleRoutesSeconds == nil && r.RestartSeconds == nil && r.Underlay == nil && r.RouterID == nil && r.MetricsAddress == nil && len(r.Peers) == 0
}

// flagOf names the flag that sets a router.json key, "" when none was given.
func (r RouterSettings) flagOf(key string) string {
	given := map[string]bool{
		"asn": r.ASN != nil, "routeTargetASN": r.RouteTargetASN != nil, "listenPort": r.ListenPort != nil,
		"withdrawHoldSeconds": r.WithdrawHoldSeconds != nil, "gracefulRestart.restartSeconds": r.RestartSeconds != nil,
		"staleRoutesSeconds": r.StaleRoutesSeconds != nil,
		"underlay":           r.Underlay != nil, "routerID": r.RouterID != nil, "metricsAddress": r.MetricsAddress != nil,
		"peers": len(r.Peers) > 0,
	}
	flags := map[string]string{
		"asn": "--router-asn", "routeTargetASN": "--router-route-target-asn", "listenPort": "--router-listen-port",
		"withdrawHoldSeconds": "--router-withdraw-hold-seconds", "gracefulRestart.restartSeconds": "--router-graceful-restart-seconds",
		"staleRoutesSeconds": "--router-stale-routes-seconds",
		"underlay":           "--router-underlay", "routerID": "--router-id", "metricsAddress": "--router-metrics-address",
		"peers": "--router-peer",
	}
	if strings.HasPrefix(key, "peers") {
		key = "peers"
	}
	if given[key] {
		return flags[key]
	}
	return ""
}

// apply sets the given keys in a decoded router.json.
func (r RouterSettings) apply(m map[string]any) {
	set := func(key string, v any, given bool) {
		if given {
			m[key] = v
		}
	}
	set("asn", deref(r.ASN), r.ASN != nil)
	set("routeTargetASN", deref(r.RouteTargetASN), r.RouteTargetASN != nil)
	set("listenPort", deref(r.ListenPort), r.ListenPort != nil)
	set("withdrawHoldSeconds", deref(r.WithdrawHoldSeconds), r.WithdrawHoldSeconds != nil)
	set("staleRoutesSeconds", deref(r.StaleRoutesSeconds), r.StaleRoutesSeconds != nil)
	set("underlay", deref(r.Underlay), r.Underlay != nil)
	set("routerID", deref(r.RouterID), r.RouterID != nil)
	set("metricsAddress", deref(r.MetricsAddress), r.MetricsAddress != nil)
	if r.RestartSeconds != nil {
		// Keep the file's other gracefulRestart keys; a non-object is left
		// for validation to name.
		gr, ok := m["gracefulRestart"].(map[string]any)
		if !ok {
			gr = map[string]any{}
		}
		gr["restartSeconds"] = *r.RestartSeconds
		m["gracefulRestart"] = gr
	}
	if len(r.Peers) > 0 {
		peers := make([]any, 0, len(r.Peers))
		for _, p := range r.Peers {
			e := map[string]any{"address": p.Address, "asn": p.ASN}
			if p.Port != nil {
				e["port"] = *p.Port
			}
			peers = append(peers, e)
		}
		m["peers"] = peers
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// routerFile builds router.json from the source file and the flags, checked
// with the router's own validation; ok is false when neither was given.
func (o Options) routerFile(p paths) (f file, ok bool, err error) {
	if o.RouterSource == "" && o.Router.empty() {
		return file{}, false, nil
	}
	from := "the --router-* flags"
	data := []byte("{}")
	if o.RouterSource != "" {
		from = "--router-config-file " + o.RouterSource
		if data, err = os.ReadFile(o.RouterSource); err != nil {
			return file{}, false, fmt.Errorf("cannot read --router-config-file %s: %w: mount the router ConfigMap there or pass another path", o.RouterSource, err)
		}
	}
	// A source file without overrides is copied byte for byte; overrides
	// re-encode it (keys sorted, numbers kept as written).
	if !o.Router.empty() {
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil || m == nil {
			return file{}, false, fmt.Errorf("%s is not a JSON object: %v", from, err)
		}
		o.Router.apply(m)
		if data, err = json.MarshalIndent(m, "", "  "); err != nil {
			return file{}, false, err
		}
		data = append(data, '\n')
	}
	if _, err := config.Parse(data); err != nil {
		key, _, _ := strings.Cut(err.Error(), ": ")
		if fl := o.Router.flagOf(key); fl != "" {
			from = fl
		}
		return file{}, false, fmt.Errorf("router config (from %s): %w", from, err)
	}
	// 0600: peers' TCP MD5 passwords may be in it.
	return file{path: p.routerConfig, data: data, mode: 0o600, flag: "--router-config"}, true, nil
}

// drainRouter runs `galactic-router drain` when a router config is on the
// node, so the fabric forgets this node's routes and the router's kernel
// state goes before the files do. It is best effort: uninstall goes on
// whatever the router says.
func (o Options) drainRouter(p paths) {
	out := o.out()
	if _, err := os.Stat(p.routerConfig); errors.Is(err, fs.ErrNotExist) {
		return
	}
	bin := o.RouterBinary
	if bin == "" {
		bin, _ = exec.LookPath(RouterBinaryName)
	}
	if bin == "" {
		fmt.Fprintf(out, "router drain skipped: %s is neither next to the installer nor on PATH; the router's routes stay until its peers' graceful-restart timer ends\n", RouterBinaryName)
		return
	}
	args := []string{"drain", "--config", p.routerConfig, "--node-config", p.nodeConfig}
	if o.DryRun {
		fmt.Fprintf(out, "would run: %s %s\n", bin, strings.Join(args, " "))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	res, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	msg := strings.TrimSpace(string(res))
	if err != nil {
		fmt.Fprintf(out, "router drain failed, uninstalling anyway (%v): %s\n", err, msg)
		return
	}
	fmt.Fprintf(out, "router drain: %s\n", msg)
}
