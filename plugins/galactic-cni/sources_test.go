package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/netconf"
)

func TestAllowedSourcePrefixesComeFromTheStanzaAndNeverFromThePod(t *testing.T) {
	c, err := parseConf(conf(t, map[string]any{"allowedSourcePrefixes": []string{"192.168.0.0/16", "fd00:1::/64"}}), required)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fd00:1::/64")}
	if !slices.Equal(c.AllowedSourcePrefixes, want) {
		t.Fatalf("allowedSourcePrefixes %v, want %v", c.AllowedSourcePrefixes, want)
	}
	_, err = parseConf(conf(t, map[string]any{"runtimeConfig": map[string]any{netconf.CapabilityPodAnnotations: map[string]string{
		netconf.AnnotationAllowedSourcePrefixes: " 0.0.0.0/0, ::/0 ",
	}}}), required)
	if err == nil || err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, "spec.allowedSourcePrefixes") {
		t.Fatalf("the pod annotation: want code 7 naming spec.allowedSourcePrefixes, got %v", err)
	}
}

func TestBadAllowedSourcePrefixesAreCode7NamingTheEntry(t *testing.T) {
	for _, tc := range []struct {
		change map[string]any
		want   string
	}{
		{map[string]any{"allowedSourcePrefixes": []string{"10.0.0.0/8", "nope"}}, `allowedSourcePrefixes[1] "nope" is not a CIDR`},
		{map[string]any{"allowedSourcePrefixes": []string{"10.1.2.3/8"}}, `has host bits set: use the network prefix "10.0.0.0/8"`},
		{map[string]any{"allowedSourcePrefixes": []string{"fe80::/10", "fe80::/10"}}, "repeats allowedSourcePrefixes[0]"},
		{map[string]any{"allowedSourcePrefixes": []string{"fe80::%eth0/10"}}, "is not a CIDR"},
		{map[string]any{"allowedSourcePrefixes": manyPrefixes(17)}, "more than 16 IPv4 source prefixes"},
	} {
		_, err := parseConf(conf(t, tc.change), required)
		if err == nil || err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Msg, tc.want) {
			t.Errorf("%v: want code 7 with %q, got %v", tc.change, tc.want, err)
		}
	}
}

// manyPrefixes are n disjoint IPv4 /24s.
func manyPrefixes(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("192.168.%d.0/24", i))
	}
	return out
}
