package harness

import (
	"fmt"
	"strings"
)

// Leftovers lists what galactic left on the node: its devices (taps, veths,
// VXLAN devices), the policy rules and routes of its route protocols
// (149 galactic-cni, 150 galactic-router) but for the node-wide local rule
// galactic keeps for good, and permanent neighbours and FDB entries on
// VXLAN devices. A node with no attachment should have none.
func (n *Node) Leftovers() ([]string, error) {
	var out []string
	run := func(args ...string) (string, error) {
		s, err := n.Run(args[0], args[1:]...)
		if err != nil {
			return "", fmt.Errorf("%s on %s: %v %s", strings.Join(args, " "), n.Name, err, s)
		}
		return s, nil
	}
	links, err := run("ip", "-br", "link")
	if err != nil {
		return nil, err
	}
	for _, line := range splitLines(links) {
		if f := strings.Fields(line); len(f) > 0 && isGalacticDevice(f[0]) {
			out = append(out, "device "+strings.SplitN(f[0], "@", 2)[0])
		}
	}
	for _, family := range []string{"-4", "-6"} {
		rules, err := run("ip", family, "rule")
		if err != nil {
			return nil, err
		}
		for _, line := range splitLines(rules) {
			if strings.Contains(line, "proto") && !strings.Contains(line, "lookup local") {
				out = append(out, "rule "+strings.TrimSpace(line))
			}
		}
		for _, proto := range []string{"149", "150"} {
			routes, err := run("ip", family, "route", "show", "table", "all", "proto", proto)
			if err != nil {
				return nil, err
			}
			for _, line := range splitLines(routes) {
				if line = strings.TrimSpace(line); line != "" {
					out = append(out, "route "+line+" proto "+proto)
				}
			}
		}
		neigh, err := run("ip", family, "neigh", "show", "nud", "permanent")
		if err != nil {
			return nil, err
		}
		for _, line := range splitLines(neigh) {
			if f := strings.Fields(line); len(f) > 2 && f[1] == "dev" && isGalacticDevice(f[2]) {
				out = append(out, "neighbour "+strings.TrimSpace(line))
			}
		}
	}
	fdb, err := run("bridge", "fdb", "show")
	if err != nil {
		return nil, err
	}
	for _, line := range splitLines(fdb) {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "dev" && isGalacticDevice(f[2]) {
			out = append(out, "fdb "+strings.TrimSpace(line))
		}
	}
	// galactic's packet filter: its table stays until uninstall, but no
	// element may outlive what it was added for.
	if table, err := n.Run("nft", "list", "table", "inet", "galactic"); err == nil {
		for _, e := range nftElements(table) {
			out = append(out, "nft element "+e)
		}
	}
	return out, nil
}

// nftElements lists `set: element` for every element in the output of
// `nft list table`.
func nftElements(listing string) []string {
	var out []string
	set, open := "", false
	for _, line := range splitLines(listing) {
		t := strings.TrimSpace(line)
		if f := strings.Fields(t); len(f) > 1 && f[0] == "set" {
			set = f[1]
			continue
		}
		if i := strings.Index(t, "elements = {"); i >= 0 {
			t, open = t[i+len("elements = {"):], true
		}
		if !open {
			continue
		}
		if j := strings.Index(t, "}"); j >= 0 {
			t, open = t[:j], false
		}
		for _, e := range strings.Split(t, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, set+": "+e)
			}
		}
	}
	return out
}

func isGalacticDevice(name string) bool {
	return len(name) >= 15 && (strings.HasPrefix(name, "gt") || strings.HasPrefix(name, "gv") || strings.HasPrefix(name, "gx"))
}
