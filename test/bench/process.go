package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// BinarySize is one binary's size on disk.
type BinarySize struct {
	Name  string
	Bytes int64
}

// ProcResult is one plugin invocation, run directly ProcessRuns times.
type ProcResult struct {
	Name string
	Runs []Exec
	// For a program that calls the API: from exec to the first accepted
	// connection, to the first request's headers, and to the last
	// response, as the proxy saw them; and requests per run.
	FirstConn, FirstRequest, LastResponse Sample
	// Logged is when the verb wrote its log line (millisecond precision),
	// its last act before printing the result and exiting.
	Logged   Sample
	Requests int
	// RSS is the largest peak RSS of separate runs under /usr/bin/time.
	RSS int64
}

// Wall is the runs' wall times.
func (p *ProcResult) Wall() Sample {
	var s Sample
	for _, r := range p.Runs {
		s = append(s, r.Wall)
	}
	return s
}

// CPU is the runs' user+system times.
func (p *ProcResult) CPU() Sample {
	var s Sample
	for _, r := range p.Runs {
		s = append(s, r.CPU)
	}
	return s
}

// MaxRSS is the largest peak RSS seen, in bytes.
func (p *ProcResult) MaxRSS() int64 { return p.RSS }

// processCost measures each binary on its own: size, the cost of merely
// starting (VERSION), and each verb's wall time, CPU, peak RSS and, for
// galactic-bgp and galactic-gc, how long until the first API request.
func (b *bench) processCost() error {
	for _, name := range []string{"galactic-cni", "galactic-bgp", "galactic-gc", "galactic-installer", "tap", "static", "loopback", "cnitool"} {
		b.res.Binaries = append(b.res.Binaries, BinarySize{Name: name, Bytes: binarySize(b.env.BinDir, name)})
	}
	n, err := b.newNode("proc")
	if err != nil {
		return err
	}
	if err := n.viaProxy(b, true); err != nil {
		return err
	}
	c, err := b.container()
	if err != nil {
		return err
	}
	// A resident attachment keeps the VPC's routing domain, as in the
	// latency loop.
	if err := n.WriteConflistFile(galacticConf("resident-proc", "proc", "resident", false, false)); err != nil {
		return err
	}
	rc, err := b.container()
	if err != nil {
		return err
	}
	if _, err := b.cnitool(n, "add", "resident-proc", rc, ifName); err != nil {
		return err
	}
	defer b.cnitool(n, "del", "resident-proc", rc, ifName)

	results := map[string]*ProcResult{}
	order := []string{}
	// record keeps a plain run's wall, CPU and API timings, or a
	// /usr/bin/time run's peak RSS.
	record := func(name string, e Exec, rss bool, agent string, mark int) {
		p := results[name]
		if p == nil {
			p = &ProcResult{Name: name}
			results[name] = p
			order = append(order, name)
		}
		if rss {
			p.RSS = max(p.RSS, e.MaxRSSKB*1024)
			return
		}
		p.Runs = append(p.Runs, e)
		if agent == "" {
			return
		}
		reqs := b.proxy.Since(mark, agent)
		p.Requests = len(reqs)
		if len(reqs) > 0 {
			p.FirstConn = append(p.FirstConn, reqs[0].Accepted.Sub(e.Start))
			p.FirstRequest = append(p.FirstRequest, reqs[0].At.Sub(e.Start))
			p.LastResponse = append(p.LastResponse, reqs[len(reqs)-1].Done.Sub(e.Start))
		}
	}
	version := []byte(`{"cniVersion":"1.1.0"}`)
	stanza := func(typ string, extra map[string]any) []byte {
		m := map[string]any{"cniVersion": "1.1.0", "name": "bench-proc", "type": typ}
		for k, v := range extra {
			m[k] = v
		}
		data, _ := json.Marshal(m)
		return data
	}
	cniStanza := stanza("galactic-cni", map[string]any{"vpc": "proc", "attachment": "proc-0", "mode": "tap", "routing": "table",
		"addresses": benchAddresses, "mtu": benchMTU, "handoff": map[string]any{"enabled": false}})
	refStanza := func() []byte {
		ref := referenceConf("bench-proc")["plugins"].([]any)[0].(map[string]any)
		return stanza("tap", map[string]any{"mtu": ref["mtu"], "ipam": ref["ipam"]})
	}()

	round := func(rss bool) error {
		for _, bin := range []string{"galactic-cni", "galactic-bgp", "tap", "static"} {
			e, err := b.plugin(n, rss, bin, "VERSION", c, ifName, version)
			if err != nil {
				return err
			}
			record(bin+" VERSION", e, rss, "", 0)
		}
		e, err := b.plugin(n, rss, "galactic-cni", "ADD", c, ifName, cniStanza)
		if err != nil {
			return err
		}
		record("galactic-cni ADD", e, rss, "", 0)
		var prev any
		if err := json.Unmarshal(e.Stdout, &prev); err != nil {
			return fmt.Errorf("galactic-cni ADD result: %w", err)
		}
		bgpStanza := stanza("galactic-bgp", map[string]any{"vpc": "proc", "attachment": "proc-0", "prevResult": prev})
		for _, verb := range []string{"ADD", "DEL"} {
			mark := b.proxy.Mark()
			e, err := b.plugin(n, rss, "galactic-bgp", verb, c, ifName, bgpStanza)
			if err != nil {
				return err
			}
			record("galactic-bgp "+verb, e, rss, AgentBGP, mark)
			if at, ok := lastLogTime(n.Settings.LogFile); ok && !rss {
				p := results["galactic-bgp "+verb]
				p.Logged = append(p.Logged, at.Sub(e.Start))
			}
		}
		if e, err = b.plugin(n, rss, "galactic-cni", "DEL", c, ifName, cniStanza); err != nil {
			return err
		}
		record("galactic-cni DEL", e, rss, "", 0)
		for _, verb := range []string{"ADD", "DEL"} {
			e, err := b.plugin(n, rss, "tap", verb, c, ifName, refStanza)
			if err != nil {
				return err
			}
			record("tap "+verb+" (runs static)", e, rss, "", 0)
		}
		mark := b.proxy.Mark()
		gcArgs := []string{"--once", "--config", n.ConfigPath}
		gcBin := filepath.Join(b.env.BinDir, "galactic-gc")
		if rss {
			e, err = b.runRSS(n, nil, nil, gcBin, gcArgs...)
		} else {
			e, err = b.run(n, nil, nil, gcBin, gcArgs...)
		}
		if err != nil {
			return err
		}
		record("galactic-gc --once (1 attachment)", e, rss, AgentGC, mark)
		return nil
	}
	for range b.opts.ProcessRuns {
		if err := round(false); err != nil {
			return err
		}
	}
	for range max(2, b.opts.ProcessRuns/5) {
		if err := round(true); err != nil {
			return err
		}
	}
	if err := b.kernelFloor(n); err != nil {
		return err
	}
	for _, bin := range []string{"galactic-cni", "galactic-bgp", "tap", "static"} {
		ic, err := b.initCost(n, c, bin, version)
		if err != nil {
			return err
		}
		b.res.Inits = append(b.res.Inits, ic)
	}
	for _, name := range order {
		p := results[name]
		b.res.Procs = append(b.res.Procs, p)
		line := fmt.Sprintf("%-36s wall p50 %s  cpu p50 %s  peak RSS %s", name, ms(p.Wall().P50()), ms(p.CPU().P50()), mib(p.MaxRSS()))
		if len(p.FirstRequest) > 0 {
			line += fmt.Sprintf("  first request at %s", ms(p.FirstRequest.P50()))
		}
		b.say("%s", line)
	}
	return nil
}

// lastLogTime is the time of the node log's last line.
func lastLogTime(path string) (time.Time, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	var l struct {
		Time time.Time `json:"time"`
	}
	if len(lines) == 0 || json.Unmarshal(lines[len(lines)-1], &l) != nil {
		return time.Time{}, false
	}
	return l.Time, true
}

// InitCost is the package initialisation a Go binary runs before main, from
// GODEBUG=inittrace=1.
type InitCost struct {
	Binary   string
	Packages int
	// Total is the summed init clock time per run.
	Total Sample
	// Top are the costliest packages by mean init time.
	Top []PackageInit
	// Means is every package the trace showed, by mean init time; it also
	// tells which packages the binary links.
	Means map[string]time.Duration
}

// PackageInit is one package's mean init time.
type PackageInit struct {
	Name string
	Mean time.Duration
}

func (b *bench) initCost(n *node, c *harness.Netns, bin string, stdin []byte) (InitCost, error) {
	ic := InitCost{Binary: bin, Means: map[string]time.Duration{}}
	sums := map[string]time.Duration{}
	runs := b.opts.ProcessRuns
	for range runs {
		env := append([]string{"GODEBUG=inittrace=1", "CNI_COMMAND=VERSION", "CNI_PATH=" + n.CNIPath}, n.Environ()...)
		e, err := b.run(n, stdin, env, filepath.Join(b.env.BinDir, bin))
		if err != nil {
			return ic, err
		}
		var total time.Duration
		ic.Packages = 0
		for _, line := range strings.Split(string(e.Stderr), "\n") {
			// init <package> @<t> ms, <d> ms clock, <b> bytes, <n> allocs
			f := strings.Fields(line)
			if len(f) < 7 || f[0] != "init" || f[6] != "clock," {
				continue
			}
			d, err := time.ParseDuration(f[4] + f[5])
			if err != nil {
				continue
			}
			sums[f[1]] += d
			total += d
			ic.Packages++
		}
		ic.Total = append(ic.Total, total)
	}
	for name, d := range sums {
		ic.Means[name] = d / time.Duration(runs)
		ic.Top = append(ic.Top, PackageInit{Name: name, Mean: ic.Means[name]})
	}
	sort.Slice(ic.Top, func(i, j int) bool { return ic.Top[i].Mean > ic.Top[j].Mean })
	ic.Top = ic.Top[:min(3, len(ic.Top))]
	return ic, nil
}

// KernelFloor is the kernel's own cost of a tap, by netlink from the
// bench itself: no process, no CNI.
type KernelFloor struct {
	// Create is add, set alias, set up; Delete is the delete.
	Create, Delete Sample
}

func (b *bench) kernelFloor(n *node) error {
	k := &KernelFloor{}
	b.res.Kernel = k
	name := names.HostInterface(names.ModeTap, "floor", "floor-0")
	return n.Do(func() error {
		for range 2 * b.opts.ProcessRuns {
			t := time.Now()
			tp := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI}
			if err := netlink.LinkAdd(tp); err != nil {
				return err
			}
			if err := netlink.LinkSetAlias(tp, names.Alias("floor", "floor-0")); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(tp); err != nil {
				return err
			}
			k.Create = append(k.Create, time.Since(t))
			t = time.Now()
			if err := netlink.LinkDel(tp); err != nil {
				return err
			}
			k.Delete = append(k.Delete, time.Since(t))
		}
		return nil
	})
}
