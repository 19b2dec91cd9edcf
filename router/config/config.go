// Package config reads and validates galactic-router's config file. Every
// problem is reported with the JSON key it concerns and what is allowed, so
// the daemon can exit with a message an operator can act on.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
)

// EnvConfig overrides the config path; DefaultPath is where the installer
// writes it.
const (
	EnvConfig   = "GALACTIC_ROUTER_CONFIG"
	DefaultPath = "/etc/galactic/router.json"
)

// Defaults of the optional keys.
const (
	DefaultListenPort          = 179
	DefaultRestartSeconds      = 120
	DefaultWithdrawHoldSeconds = 10
	// DefaultStaleRoutesSeconds keeps a lost fabric's routes for an hour:
	// long enough for a reflector's maintenance window or reboot, and a
	// kept route can only be wrong for a workload that moved meanwhile,
	// whose new place no node can learn without the fabric anyway.
	DefaultStaleRoutesSeconds = 3600
	MaxStaleRoutesSeconds     = 86400
	DefaultHoldSeconds        = 9
	DefaultKeepaliveSeconds   = 3
	DefaultMetricsAddress     = "127.0.0.1:9655"
	MinHoldSeconds            = 3
)

// File is the JSON shape of router.json; pointers tell "absent" from zero.
type File struct {
	ASN                 *int64           `json:"asn"`
	RouterID            string           `json:"routerID"`
	Underlay            string           `json:"underlay"`
	ListenPort          *int64           `json:"listenPort"`
	RouteTargetASN      *int64           `json:"routeTargetASN"`
	GracefulRestart     *GracefulRestart `json:"gracefulRestart"`
	WithdrawHoldSeconds *int64           `json:"withdrawHoldSeconds"`
	StaleRoutesSeconds  *int64           `json:"staleRoutesSeconds"`
	Peers               []PeerFile       `json:"peers"`
	MetricsAddress      *string          `json:"metricsAddress"`
	Role                *string          `json:"role"`
	ClusterID           string           `json:"clusterID"`
	ClientRanges        []string         `json:"clientRanges"`
}

// GracefulRestart is the gracefulRestart object.
type GracefulRestart struct {
	Enabled        *bool  `json:"enabled"`
	RestartSeconds *int64 `json:"restartSeconds"`
}

// PeerFile is one entry of peers.
type PeerFile struct {
	Address          string `json:"address"`
	ASN              *int64 `json:"asn"`
	Port             *int64 `json:"port"`
	HoldSeconds      *int64 `json:"holdSeconds"`
	KeepaliveSeconds *int64 `json:"keepaliveSeconds"`
	Password         string `json:"password"`
}

// Config is a validated router config with defaults applied.
type Config struct {
	ASN      uint32
	RouterID netip.Addr
	Underlay netip.Addr
	// ListenPort is the BGP port to accept sessions on; -1 accepts none.
	ListenPort      int32
	RouteTargetASN  uint16
	GracefulRestart bool
	RestartTime     time.Duration
	WithdrawHold    time.Duration
	// StaleRoutes bounds how long the routes of a lost session (or, at a
	// start, those found in the kernel) are kept until an End-of-RIB.
	StaleRoutes    time.Duration
	Peers          []Peer
	MetricsAddress string
	// Role is RoleNode or RoleReflector.
	Role string
	// ClusterID and ClientRanges are a reflector's (see reflector.go).
	ClusterID    netip.Addr
	ClientRanges []netip.Prefix
}

// Peer is a validated BGP neighbour.
type Peer struct {
	Address   netip.Addr
	ASN       uint32
	Port      uint16
	Hold      time.Duration
	Keepalive time.Duration
	Password  string
}

// Path returns the config path: the flag if given, else the environment
// variable, else the default.
func Path(flag string, getenv func(string) string) string {
	if flag != "" {
		return flag
	}
	if p := getenv(EnvConfig); p != "" {
		return p
	}
	return DefaultPath
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading router config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("router config %s: %w", path, err)
	}
	return c, nil
}

// keyError names the offending key.
func keyError(key, format string, args ...any) error {
	return fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...))
}

// Parse decodes and validates a config; unknown keys are errors.
func Parse(data []byte) (*Config, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ) && typ.Field == "":
			return nil, errors.New("the config must be a JSON object")
		case errors.As(err, &typ):
			return nil, keyError(typ.Field, "must be a JSON %s", jsonKind(typ.Type))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return nil, unknownKey(data, strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
		case errors.As(err, &syn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return nil, fmt.Errorf("not valid JSON: %w", err)
		}
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("not valid JSON: data after the config object")
	}
	return f.validate()
}

// Keys allowed in each object of the file.
var (
	topKeys  = []string{"asn", "routerID", "underlay", "listenPort", "routeTargetASN", "gracefulRestart", "withdrawHoldSeconds", "staleRoutesSeconds", "peers", "metricsAddress", "role", "clusterID", "clientRanges"}
	grKeys   = []string{"enabled", "restartSeconds"}
	peerKeys = []string{"address", "asn", "port", "holdSeconds", "keepaliveSeconds", "password"}
)

// unknownKey says which object holds key and what that object allows:
// encoding/json names an unknown key but not where it is.
func unknownKey(data []byte, key string) error {
	var top map[string]json.RawMessage
	var nested struct {
		GracefulRestart map[string]json.RawMessage   `json:"gracefulRestart"`
		Peers           []map[string]json.RawMessage `json:"peers"`
	}
	// Best effort: the strict decode has already reported the real error.
	_ = json.Unmarshal(data, &top)
	_ = json.Unmarshal(data, &nested)
	stray := func(obj map[string]json.RawMessage, allowed []string) bool {
		_, ok := obj[key]
		return ok && !slices.ContainsFunc(allowed, func(k string) bool { return strings.EqualFold(k, key) })
	}
	path, allowed := key, topKeys
	switch {
	case stray(top, topKeys):
	case stray(nested.GracefulRestart, grKeys):
		path, allowed = "gracefulRestart."+key, grKeys
	default:
		for i, p := range nested.Peers {
			if stray(p, peerKeys) {
				path, allowed = fmt.Sprintf("peers[%d].%s", i, key), peerKeys
				break
			}
		}
	}
	return keyError(path, "unknown key; allowed keys are %s", strings.Join(allowed, ", "))
}

// jsonKind names a Go field type as the JSON value it decodes from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Slice, reflect.Array:
		return "array"
	default:
		return "object"
	}
}

func asn(key string, v *int64) (uint32, error) {
	if v == nil {
		return 0, keyError(key, "is required (an AS number, 1-4294967295)")
	}
	if *v < 1 || *v > 4294967295 {
		return 0, keyError(key, "%d is out of range: an AS number is 1-4294967295", *v)
	}
	return uint32(*v), nil
}

func seconds(key string, v *int64, def, lo, hi int64) (time.Duration, error) {
	if v == nil {
		return time.Duration(def) * time.Second, nil
	}
	if *v < lo || *v > hi {
		return 0, keyError(key, "%d is out of range: allowed %d-%d seconds", *v, lo, hi)
	}
	return time.Duration(*v) * time.Second, nil
}

func (f File) validate() (*Config, error) {
	role, err := f.role()
	if err != nil {
		return nil, err
	}
	if role == RoleReflector {
		return f.validateReflector()
	}
	c := Config{Role: RoleNode}
	for _, step := range []func(*Config) error{f.validateIdentity, f.validateTimers, f.validatePeers} {
		if err := step(&c); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// validateIdentity sets what identifies the speaker: its AS, addresses,
// listen port and route-target AS.
func (f File) validateIdentity(c *Config) error {
	var err error
	if c.ASN, err = asn("asn", f.ASN); err != nil {
		return err
	}
	if f.Underlay == "" {
		return keyError("underlay", "is required: the node's fabric address (BGP next hop and VXLAN source)")
	}
	if c.Underlay, err = netip.ParseAddr(f.Underlay); err != nil || c.Underlay.Zone() != "" {
		return keyError("underlay", "%q is not an IP address", f.Underlay)
	}
	if !c.Underlay.Is4() {
		return keyError("underlay", "%s: only an IPv4 underlay is supported (VXLAN source and EVPN next hop)", c.Underlay)
	}
	switch {
	case f.RouterID != "":
		if c.RouterID, err = netip.ParseAddr(f.RouterID); err != nil || !c.RouterID.Is4() {
			return keyError("routerID", "%q is not an IPv4 address (a BGP router ID is written as one)", f.RouterID)
		}
	default:
		c.RouterID = c.Underlay
	}
	c.ListenPort = DefaultListenPort
	if f.ListenPort != nil {
		if *f.ListenPort != -1 && (*f.ListenPort < 1 || *f.ListenPort > 65535) {
			return keyError("listenPort", "%d is out of range: 1-65535, or -1 to accept no sessions", *f.ListenPort)
		}
		c.ListenPort = int32(*f.ListenPort)
	}
	switch {
	case f.RouteTargetASN != nil:
		if *f.RouteTargetASN < 1 || *f.RouteTargetASN > 65535 {
			return keyError("routeTargetASN", "%d is out of range: 1-65535 (a two-octet AS route target holds the 24-bit VNI)", *f.RouteTargetASN)
		}
		c.RouteTargetASN = uint16(*f.RouteTargetASN)
	case c.ASN <= 65535:
		c.RouteTargetASN = uint16(c.ASN)
	default:
		return keyError("routeTargetASN", "is required when asn (%d) does not fit two octets: 1-65535", c.ASN)
	}
	return nil
}

// validateTimers sets graceful restart, the withdrawal hold and the
// stale bound.
func (f File) validateTimers(c *Config) error {
	var err error
	c.GracefulRestart = true
	c.RestartTime = DefaultRestartSeconds * time.Second
	if gr := f.GracefulRestart; gr != nil {
		if gr.Enabled != nil {
			c.GracefulRestart = *gr.Enabled
		}
		// The restart time field of the capability has 12 bits.
		if c.RestartTime, err = seconds("gracefulRestart.restartSeconds", gr.RestartSeconds, DefaultRestartSeconds, 1, 4095); err != nil {
			return err
		}
	}
	if c.WithdrawHold, err = seconds("withdrawHoldSeconds", f.WithdrawHoldSeconds, DefaultWithdrawHoldSeconds, 0, 3600); err != nil {
		return err
	}
	c.StaleRoutes, err = seconds("staleRoutesSeconds", f.StaleRoutesSeconds, DefaultStaleRoutesSeconds, 0, MaxStaleRoutesSeconds)
	return err
}

// validatePeers sets the metrics address and the peers, each listed once.
func (f File) validatePeers(c *Config) error {
	c.MetricsAddress = DefaultMetricsAddress
	if f.MetricsAddress != nil {
		c.MetricsAddress = *f.MetricsAddress
		if c.MetricsAddress != "" {
			if _, err := netip.ParseAddrPort(c.MetricsAddress); err != nil {
				return keyError("metricsAddress", "%q is not <ip>:<port> (empty turns the endpoint off)", c.MetricsAddress)
			}
		}
	}
	if len(f.Peers) == 0 {
		return keyError("peers", "at least one peer is required")
	}
	seen := map[netip.Addr]bool{}
	for i, pf := range f.Peers {
		p, err := pf.validate(fmt.Sprintf("peers[%d]", i))
		if err != nil {
			return err
		}
		if seen[p.Address] {
			return keyError(fmt.Sprintf("peers[%d].address", i), "%s is listed twice", p.Address)
		}
		seen[p.Address] = true
		c.Peers = append(c.Peers, p)
	}
	return nil
}

func (pf PeerFile) validate(key string) (Peer, error) {
	var p Peer
	var err error
	if p.Address, err = netip.ParseAddr(pf.Address); err != nil || p.Address.Zone() != "" {
		return p, keyError(key+".address", "%q is not an IP address", pf.Address)
	}
	if p.ASN, err = asn(key+".asn", pf.ASN); err != nil {
		return p, err
	}
	p.Port = DefaultListenPort
	if pf.Port != nil {
		if *pf.Port < 1 || *pf.Port > 65535 {
			return p, keyError(key+".port", "%d is out of range: 1-65535", *pf.Port)
		}
		p.Port = uint16(*pf.Port)
	}
	// BGP allows hold time 0 (no keepalives); a node router must notice a
	// dead peer, so it is refused, as is anything below 3 s (RFC 4271).
	if p.Hold, err = seconds(key+".holdSeconds", pf.HoldSeconds, DefaultHoldSeconds, MinHoldSeconds, 65535); err != nil {
		return p, err
	}
	if p.Keepalive, err = seconds(key+".keepaliveSeconds", pf.KeepaliveSeconds, DefaultKeepaliveSeconds, 1, 65535); err != nil {
		return p, err
	}
	if p.Keepalive >= p.Hold {
		return p, keyError(key+".keepaliveSeconds", "%d must be below holdSeconds (%d)", int(p.Keepalive.Seconds()), int(p.Hold.Seconds()))
	}
	if len(pf.Password) > 80 {
		return p, keyError(key+".password", "is %d characters; TCP MD5 keys are at most 80", len(pf.Password))
	}
	p.Password = pf.Password
	return p, nil
}
