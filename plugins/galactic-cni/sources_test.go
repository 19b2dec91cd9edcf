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

func TestAllowedSourcePrefixesComeFromTheStanzaOrThePod(t *testing.T) {
	c, err := parseConf(conf(t, map[string]any{"allowedSourcePrefixes": []string{"192.168.0.0/16", "fd00:1::/64"}}), true)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fd00:1::/64")}
	if !slices.Equal(c.AllowedSourcePrefixes, want) {
		t.Fatalf("allowedSourcePrefixes %v, want %v", c.AllowedSourcePrefixes, want)
	}
	c, err = parseConf(conf(t, map[string]any{"runtimeConfig": map[string]any{netconf.CapabilityPodAnnotations: map[string]string{
		netconf.AnnotationAllowedSourcePrefixes: " 0.0.0.0/0, ::/0 ",
	}}}), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.AllowedSourcePrefixes) != 2 || c.AllowedSourcePrefixes[0].Bits() != 0 {
		t.Fatalf("from the annotation: %v", c.AllowedSourcePrefixes)
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
		{map[string]any{"runtimeConfig": map[string]any{netconf.CapabilityPodAnnotations: map[string]string{
			netconf.AnnotationAllowedSourcePrefixes: "10.0.0.0/33"}}}, "pod annotation " + netconf.AnnotationAllowedSourcePrefixes},
	} {
		_, err := parseConf(conf(t, tc.change), true)
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
