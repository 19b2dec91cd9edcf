package main

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/netconf"
)

// conf builds a stanza from the valid base with fields changed (a nil value
// removes the field).
func conf(t *testing.T, change map[string]any) []byte {
	t.Helper()
	base := map[string]any{
		"cniVersion": "1.1.0", "name": "vpc-blue", "type": "galactic-cni",
		"vpc": "blue", "attachment": "web-0-net0",
	}
	for k, v := range change {
		if v == nil {
			delete(base, k)
		} else {
			base[k] = v
		}
	}
	data, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParseConfFillsInTheDocumentedDefaults(t *testing.T) {
	c, err := parseConf(conf(t, nil), required)
	if err != nil {
		t.Fatal(err)
	}
	want := Handoff{Enabled: true, Wait: 30 * time.Second, Lease: 60 * time.Second}
	if c.Mode != "tap" || c.Routing != "vrf" || c.MTU != 0 || len(c.Addresses) != 0 || c.Handoff != want {
		t.Fatalf("defaults: mode %q routing %q mtu %d addresses %v handoff %+v", c.Mode, c.Routing, c.MTU, c.Addresses, c.Handoff)
	}
}

func TestParseConfAcceptsEveryField(t *testing.T) {
	c, err := parseConf(conf(t, map[string]any{
		"mode": "veth", "routing": "table", "addresses": []string{"10.20.0.5/24", "fd20::5/64"}, "mtu": 1450,
		"handoff": map[string]any{"enabled": false, "waitSeconds": 0, "leaseSeconds": 15},
	}), required)
	if err != nil {
		t.Fatal(err)
	}
	if c.VPC != "blue" || c.Attachment.Attachment != "web-0-net0" || c.Mode != "veth" || c.Routing != "table" || c.MTU != 1450 {
		t.Fatalf("parsed %+v", c)
	}
	if len(c.Addresses) != 2 || c.Addresses[0] != netip.MustParsePrefix("10.20.0.5/24") || c.Addresses[1] != netip.MustParsePrefix("fd20::5/64") {
		t.Fatalf("addresses %v", c.Addresses)
	}
	if c.Handoff != (Handoff{Enabled: false, Wait: 0, Lease: 15 * time.Second}) {
		t.Fatalf("handoff %+v", c.Handoff)
	}
}

func TestParseConfRejectsEachInvalidFieldNamingIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change map[string]any
		raw    string
		code   uint
		msg    string
	}{
		{name: "missing vpc", change: map[string]any{"vpc": nil}, code: types.ErrInvalidNetworkConfig, msg: `attachment "web-0-net0" needs namespace (a VPCAttachment in that namespace) or vpc (an inline attachment)`},
		{name: "missing vpc beside addresses", change: map[string]any{"vpc": nil, "addresses": []string{}}, code: types.ErrInvalidNetworkConfig, msg: "vpc is required"},
		{name: "vpc not a label", change: map[string]any{"vpc": "Blue"}, code: types.ErrInvalidNetworkConfig, msg: `vpc "Blue" is not a DNS-1123 label`},
		{name: "missing attachment", change: map[string]any{"attachment": ""}, code: types.ErrInvalidNetworkConfig, msg: "attachment is required"},
		{name: "attachment too long", change: map[string]any{"attachment": strings.Repeat("a", 64)}, code: types.ErrInvalidNetworkConfig, msg: "attachment"},
		{name: "unknown mode", change: map[string]any{"mode": "macvtap"}, code: types.ErrInvalidNetworkConfig, msg: `mode "macvtap" is not supported: use "tap"`},
		{name: "unknown routing", change: map[string]any{"routing": "bgp"}, code: types.ErrInvalidNetworkConfig, msg: `routing "bgp" is not supported: use "vrf"`},
		{name: "address without prefix", change: map[string]any{"addresses": []string{"10.20.0.5"}}, code: types.ErrInvalidNetworkConfig, msg: `addresses[0] "10.20.0.5" is not a CIDR`},
		{name: "address out of range", change: map[string]any{"addresses": []string{"fd20::5/64", "10.20.0.300/24"}}, code: types.ErrInvalidNetworkConfig, msg: `addresses[1] "10.20.0.300/24"`},
		{name: "IPv4-mapped address", change: map[string]any{"addresses": []string{"::ffff:10.20.0.5/120"}}, code: types.ErrInvalidNetworkConfig, msg: "addresses[0]"},
		{name: "repeated address", change: map[string]any{"addresses": []string{"10.20.0.5/24", "10.20.0.5/32"}}, code: types.ErrInvalidNetworkConfig, msg: "addresses[1] \"10.20.0.5/32\" repeats the address of addresses[0]"},
		{name: "addresses not a list", change: map[string]any{"addresses": "10.20.0.5/24"}, code: types.ErrInvalidNetworkConfig, msg: "addresses must be a list of strings, not a JSON string"},
		{name: "mtu too small", change: map[string]any{"mtu": 67}, code: types.ErrInvalidNetworkConfig, msg: "mtu 67 is out of range: use 68..65535"},
		{name: "mtu too large", change: map[string]any{"mtu": 65536}, code: types.ErrInvalidNetworkConfig, msg: "mtu 65536 is out of range"},
		{name: "mtu below the IPv6 minimum", change: map[string]any{"mtu": 1000, "addresses": []string{"fd20::5/64"}}, code: types.ErrInvalidNetworkConfig, msg: "mtu 1000 is below 1280"},
		{name: "mtu not a number", change: map[string]any{"mtu": "1450"}, code: types.ErrInvalidNetworkConfig, msg: "mtu must be a whole number, not a JSON string"},
		{name: "negative waitSeconds", change: map[string]any{"handoff": map[string]any{"waitSeconds": -1}}, code: types.ErrInvalidNetworkConfig, msg: "handoff.waitSeconds -1 is out of range"},
		{name: "leaseSeconds too short", change: map[string]any{"handoff": map[string]any{"leaseSeconds": 1}}, code: types.ErrInvalidNetworkConfig, msg: "handoff.leaseSeconds 1 is out of range: use 5..3600"},
		{name: "enabled not a boolean", change: map[string]any{"handoff": map[string]any{"enabled": "yes"}}, code: types.ErrInvalidNetworkConfig, msg: "handoff.enabled must be true or false, not a JSON string"},
		{name: "not JSON", raw: "{", code: types.ErrDecodingFailure, msg: "not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.raw == "" {
				data = conf(t, tc.change)
			}
			c, err := parseConf(data, required)
			switch {
			case err == nil:
				t.Fatalf("want code %d with %q, got a config %+v", tc.code, tc.msg, c)
			case err.Code != tc.code || !strings.Contains(err.Msg, tc.msg):
				t.Fatalf("want code %d with %q, got %d %q", tc.code, tc.msg, err.Code, err.Msg)
			}
		})
	}
}

var required = netconf.ResolveOptions{Required: true}

// podConf is a stanza of a conflist shared by every pod, with the pod's
// annotations as a CRI runtime passes them.
func podConf(t *testing.T, stanza map[string]any, annotations map[string]string) []byte {
	t.Helper()
	change := map[string]any{"vpc": nil, "attachment": nil, "name": "galactic",
		"capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true}}
	for k, v := range stanza {
		change[k] = v
	}
	if annotations != nil {
		change["runtimeConfig"] = map[string]any{"io.kubernetes.cri.pod-annotations": annotations}
	}
	return conf(t, change)
}

// inPod are parseConf's options for an ADD of pod web-0 in tenant-a.
var inPod = netconf.ResolveOptions{Required: true, CNIArgs: "IgnoreUnknown=1;K8S_POD_NAMESPACE=tenant-a;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1"}

func TestParseConfTakesThePodsAttachmentsAndModeFromItsAnnotations(t *testing.T) {
	c, err := parseConf(podConf(t, nil, map[string]string{
		"network.galactic.dev/attachments": "{pod}-net0,db",
		"network.galactic.dev/mode":        "veth",
	}), inPod)
	if err != nil {
		t.Fatal(err)
	}
	if c.Names.Namespace != "tenant-a" || !slices.Equal(c.Names.Objects, []string{"web-0-net0", "db"}) || c.Mode != "veth" || c.VPC != "" || len(c.Addresses) != 0 {
		t.Fatalf("parsed %+v", c)
	}
}

func TestParseConfOfAVMMStanzaNamesItsVPCAttachment(t *testing.T) {
	c, err := parseConf(conf(t, map[string]any{"vpc": nil, "namespace": "tenant-a", "attachment": "vm-1"}), required)
	if err != nil {
		t.Fatal(err)
	}
	if c.Names.Namespace != "tenant-a" || !slices.Equal(c.Names.Objects, []string{"vm-1"}) || c.Names.Inline != nil {
		t.Fatalf("parsed %+v", c)
	}
}

func TestParseConfRefusesWhatOnlyAVPCAttachmentMayDecideNamingItsField(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stanza      map[string]any
		annotations map[string]string
		opts        netconf.ResolveOptions
		msg         string
	}{
		{"pod vpc", nil, map[string]string{"network.galactic.dev/vpc": "blue", "network.galactic.dev/attachment": "a"}, inPod, "pod annotation network.galactic.dev/vpc is refused"},
		{"pod addresses", nil, map[string]string{"network.galactic.dev/attachment": "a", "network.galactic.dev/addresses": "10.20.0.5/24"}, inPod, "whose spec.addresses"},
		{"pod vni", nil, map[string]string{"network.galactic.dev/attachment": "a", "network.galactic.dev/vni": "10100"}, inPod, "whose status.vni"},
		{"pod allowed sources", nil, map[string]string{"network.galactic.dev/attachment": "a", "network.galactic.dev/allowed-source-prefixes": "0.0.0.0/0"}, inPod, "whose spec.allowedSourcePrefixes"},
		{"stanza addresses beside a pod's attachment", map[string]any{"addresses": []string{"10.20.0.5/24"}}, map[string]string{"network.galactic.dev/attachment": "a"}, inPod, "addresses is set beside the pod annotation network.galactic.dev/attachment: the VPCAttachment's spec.addresses"},
		{"stanza addresses beside namespace", map[string]any{"namespace": "tenant-a", "attachment": "a", "addresses": []string{}}, nil, required, "addresses is set beside namespace"},
		{"stanza allowed sources beside namespace", map[string]any{"namespace": "tenant-a", "attachment": "a", "allowedSourcePrefixes": []string{"0.0.0.0/0"}}, nil, required, "allowedSourcePrefixes is set beside namespace: the VPCAttachment's spec.allowedSourcePrefixes"},
		{"no attachment named", nil, map[string]string{"io.kubernetes.pod.name": "web-0"}, inPod, "annotate the pod with network.galactic.dev/attachment"},
		{"an inline stanza on a node that requires objects", map[string]any{"vpc": "blue", "attachment": "a"}, nil, netconf.ResolveOptions{Required: true, RequireObjects: true}, "refused on this node, which sets requireAttachmentObjects"},
		{"bad mode", nil, map[string]string{"network.galactic.dev/attachment": "a", "network.galactic.dev/mode": "macvlan"}, inPod, `pod annotation network.galactic.dev/mode: mode "macvlan" is not supported`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConf(podConf(t, tc.stanza, tc.annotations), tc.opts)
			if err == nil || err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, tc.msg) {
				t.Fatalf("want code 7 with %q, got %v", tc.msg, err)
			}
		})
	}
}

func TestParseConfForStatusAndGCAcceptsASharedConflistWithoutAnnotations(t *testing.T) {
	c, err := parseConf(podConf(t, nil, nil), netconf.ResolveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Names.Empty() || c.Mode != "tap" || c.Routing != "vrf" {
		t.Fatalf("parsed %+v", c)
	}
	if _, err := parseConf(podConf(t, nil, nil), inPod); err == nil {
		t.Fatal("ADD of a pod naming no attachment was accepted")
	}
}
