package routing

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

// remoteRoutes are the prefixes node's router installed in the VPC's table.
func remoteRoutes(t *testing.T, n *harness.Node, vpc string) []netip.Prefix {
	t.Helper()
	var d *routing.Domain
	if err := n.Do(func() (err error) { d, err = routing.Find(vpc); return err }); err != nil {
		t.Fatal(err)
	}
	if d == nil {
		return nil
	}
	var out []netip.Prefix
	for _, fam := range []string{"-4", "-6"} {
		raw, err := n.Run("ip", "-j", fam, "route", "show", "table", fmt.Sprint(d.Table), "proto", "150")
		if err != nil {
			t.Fatalf("%v %s", err, raw)
		}
		var rs []struct {
			Dst string `json:"dst"`
		}
		if err := json.Unmarshal([]byte(raw), &rs); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		for _, r := range rs {
			p, err := netip.ParsePrefix(r.Dst)
			if err != nil {
				a := netip.MustParseAddr(r.Dst)
				p = netip.PrefixFrom(a, a.BitLen())
			}
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

func TestChurnOfManyAttachmentsLeavesEveryTableEqualToWhatFRRHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("churn test: long")
	}
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	hold := int64(1)
	short := func(c *config.File) { c.WithdrawHoldSeconds = &hold }
	nodes := []*harness.Routed{f.NewRouted(t, env, "node-a", short), f.NewRouted(t, env, "node-b", short), f.NewRouted(t, env, "node-c", short)}
	const total, batch = 200, 8
	added, deleted := 0, 0
	type placed struct {
		att  harness.Attachment
		node *harness.Routed
		c    *harness.Netns
	}
	var all []placed
	for i := 0; i < total; i++ {
		all = append(all, placed{
			att:  harness.Attachment{VPC: "blue", Name: fmt.Sprintf("w-%d", i), VNI: 10100, Addresses: []string{fmt.Sprintf("10.21.%d.%d/16", i/200, i%200+10)}},
			node: nodes[i%3],
			c:    harness.NewContainer(t),
		})
	}
	check := func(round string) {
		t.Helper()
		harness.Eventually(t, 30*time.Second, round+": every node's table matches FRR", func() error {
			routes, err := f.EVPNRoutes()
			if err != nil {
				return err
			}
			for _, n := range nodes {
				var want []netip.Prefix
				// Attachments in [deleted, added) are in place.
				local := false
				for i := deleted; i < added; i++ {
					if all[i].node == n {
						local = true
					}
				}
				for pfx, paths := range routes {
					for _, path := range paths {
						if path.NextHop != n.Underlay.String() {
							want = append(want, pfx)
							break
						}
					}
				}
				if !local {
					want = nil
				}
				slices.SortFunc(want, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
				if got := remoteRoutes(t, n.Node, "blue"); !slices.Equal(got, want) {
					return fmt.Errorf("%s: %d remote routes, FRR has %d from other nodes", n.Name, len(got), len(want))
				}
			}
			return nil
		})
	}
	run := func(verb string, from, to int) {
		var wg sync.WaitGroup
		errs := make(chan error, to-from)
		for i := from; i < to; i++ {
			wg.Add(1)
			go func(p placed) {
				defer wg.Done()
				if out, err := p.node.CNITool(verb, p.att.Network(), p.c, ifName); err != nil {
					errs <- fmt.Errorf("%s %s on %s: %v %s", verb, p.att.Name, p.node.Name, err, out)
				}
			}(all[i])
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	for _, p := range all {
		p.node.WriteConflist(t, p.att.Conflist())
	}
	for i := 0; i < total; i += batch {
		run("add", i, min(i+batch, total))
		added = min(i+batch, total)
		if (i/batch)%5 == 4 || i+batch >= total {
			check(fmt.Sprintf("after adding %d", added))
		}
	}
	for i := 0; i < total; i += batch {
		run("del", i, min(i+batch, total))
		deleted = min(i+batch, total)
		if (i/batch)%5 == 4 || i+batch >= total {
			check(fmt.Sprintf("after deleting %d", deleted))
		}
	}
	for _, n := range nodes {
		if out := show(n.Node, "ip", "-d", "link", "show", "type", "vxlan"); out != "" {
			t.Errorf("%s keeps a VXLAN device with no attachment left:\n%s", n.Name, out)
		}
	}
}
