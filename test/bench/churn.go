package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
)

// ChurnResult is many containers of one attachment coming and going at once.
type ChurnResult struct {
	Pairs, Parallelism int
	Wall               time.Duration
	Add, Del           Sample
	Failures           []string
	// Requests made by galactic-bgp; Conflicts are its writes the API
	// server refused with 409 (a stale resourceVersion, a failed
	// precondition or a create that lost the race), Raced its writes that
	// found the object deleted meanwhile (404 on update or delete). Each
	// is re-read and retried. LoggedConflicts is the plugin's own count.
	Requests, Conflicts, Raced, LoggedConflicts int
	// BGPAdd and BGPDel are galactic-bgp's own durations as it logged
	// them (ms precision); MaxConflicts the most one verb retried.
	BGPAdd, BGPDel Sample
	MaxConflicts   int
	// What was left afterwards; all must be zero.
	Adverts, Entries, Records, Taps int
	// LeftEntries are the container IDs of the entries left.
	LeftEntries []string
	// GaveUp are galactic-bgp verbs that succeeded without doing their API
	// work (DEL leaves the entry for the node GC), by container ID, with
	// the reason it logged.
	GaveUp map[string]string
	// AfterGC is what one galactic-gc pass left of the node's entries
	// once the containers' namespaces were gone; only run when entries
	// were left. GCSummary says what that pass did.
	AfterGC   *int
	GCSummary string
	// RulesRoutesChanged lists policy rules or routes that differ from
	// before the churn.
	RulesRoutesChanged []string
}

// churn runs Pairs ADD/DEL pairs of distinct containers of one attachment
// on one node, Parallelism at a time, and then proves nothing leaked.
func (b *bench) churn() error {
	r := &ChurnResult{Pairs: b.opts.ChurnPairs, Parallelism: b.opts.ChurnParallelism}
	b.res.Churn = r
	n, err := b.newNode("churn")
	if err != nil {
		return err
	}
	if err := n.viaProxy(b, true); err != nil {
		return err
	}
	const vpc, att, network = "churn", "churn-0", "bench-churn"
	if err := n.WriteConflistFile(galacticConf(network, vpc, att, false, true)); err != nil {
		return err
	}
	// The node's first ADD moves the kernel's local rule for good
	// (pkg/routing), a node setting and not the attachment's: one pair
	// before the baseline keeps it out of the comparison.
	warm, err := b.container()
	if err != nil {
		return err
	}
	if _, err := b.cnitool(n, "add", network, warm, ifName); err != nil {
		return err
	}
	if _, err := b.cnitool(n, "del", network, warm, ifName); err != nil {
		return err
	}
	before, err := rulesAndRoutes(n)
	if err != nil {
		return err
	}
	// Container namespaces are made up front: making them is the bench's
	// cost, not the plugins'.
	cs := make([]*harness.Netns, r.Pairs)
	for i := range cs {
		if cs[i], err = harness.CreateNetns("c"); err != nil {
			return err
		}
	}
	deleted := false
	defer func() {
		if !deleted {
			for _, c := range cs {
				c.Delete()
			}
		}
	}()
	b.say("churn: %d container namespaces ready", len(cs))

	mark := b.proxy.Mark()
	var logOffset int64
	if st, err := os.Stat(n.Settings.LogFile); err == nil {
		logOffset = st.Size()
	}
	work := make(chan int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range r.Parallelism {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				add, aerr := b.cnitool(n, "add", network, cs[i], ifName)
				del, derr := b.cnitool(n, "del", network, cs[i], ifName)
				mu.Lock()
				if aerr != nil {
					r.Failures = append(r.Failures, aerr.Error())
				} else {
					r.Add = append(r.Add, add.Wall)
				}
				if derr != nil {
					r.Failures = append(r.Failures, derr.Error())
				} else {
					r.Del = append(r.Del, del.Wall)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range cs {
		work <- i
	}
	close(work)
	wg.Wait()
	r.Wall = time.Since(start)

	for _, req := range b.proxy.Since(mark, AgentBGP) {
		r.Requests++
		write := req.Verb() != "get" && req.Verb() != "list"
		switch {
		case req.Status == http.StatusConflict:
			r.Conflicts++
		case req.Status == http.StatusNotFound && write:
			r.Raced++
		}
	}
	readBGPLog(n.Settings.LogFile, logOffset, r)

	// What is left: advertisements of the node, records, taps, rules and routes.
	list, err := b.env.API.BGPAdvertisements(harness.Namespace).List(b.ctx, metav1.ListOptions{LabelSelector: names.NodeSelector(n.Name)})
	if err != nil {
		return err
	}
	r.Adverts = len(list.Items)
	for _, a := range list.Items {
		r.Entries += len(a.Spec.Containers)
		for _, e := range a.Spec.Containers {
			r.LeftEntries = append(r.LeftEntries, e.ContainerID)
		}
	}
	recs, err := state.NewStore(n.Settings.StateDir).List()
	if err != nil {
		return err
	}
	r.Records = len(recs)
	err = n.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if names.IsHostInterface(names.ModeTap, l.Attrs().Name) {
				r.Taps++
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	after, err := rulesAndRoutes(n)
	if err != nil {
		return err
	}
	r.RulesRoutesChanged = diffLines(before, after)
	if r.Entries > 0 {
		// What DEL leaves behind is the node GC's to remove once the
		// container is gone: check that it does.
		for _, c := range cs {
			c.Delete()
		}
		deleted = true
		e, err := b.gcOnce(n)
		if err != nil {
			return err
		}
		if rep, err := parseGCLog(e.Stderr); err == nil {
			r.GCSummary = rep.Summary()
		}
		list, err := b.env.API.BGPAdvertisements(harness.Namespace).List(b.ctx, metav1.ListOptions{LabelSelector: names.NodeSelector(n.Name)})
		if err != nil {
			return err
		}
		left := 0
		for _, a := range list.Items {
			left += len(a.Spec.Containers)
		}
		r.AfterGC = &left
	}
	b.say("churn: %d pairs in %s (%.1f pairs/s), %d failures, %d conflicts (+%d raced), %d verbs gave up, left: %d advertisements, %d entries %v, %d records, %d taps, %d rule/route lines changed",
		r.Pairs, r.Wall.Round(time.Millisecond), float64(r.Pairs)/r.Wall.Seconds(), len(r.Failures), r.Conflicts, r.Raced, len(r.GaveUp),
		r.Adverts, r.Entries, r.LeftEntries, r.Records, r.Taps, len(r.RulesRoutesChanged))
	for k, why := range r.GaveUp {
		b.say("churn: galactic-bgp %s gave up: %s", k, why)
	}
	if r.AfterGC != nil {
		b.say("churn: after one GC pass (namespaces deleted): %d entries left; the pass: %s", *r.AfterGC, r.GCSummary)
	}
	// Failures and leftovers are results, reported in the document.
	return nil
}

// readBGPLog sums the conflicts galactic-bgp logged on the node from
// offset on and collects its per-verb durations.
func readBGPLog(logFile string, offset int64, r *ChurnResult) {
	f, err := os.Open(logFile)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Plugin      string `json:"plugin"`
			Msg         string `json:"msg"`
			Level       string `json:"level"`
			ContainerID string `json:"containerID"`
			Reason      string `json:"reason"`
			Conflicts   int    `json:"conflicts"`
			DurationMs  int64  `json:"durationMs"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Plugin != AgentBGP {
			continue
		}
		if l.Level == "WARN" {
			if r.GaveUp == nil {
				r.GaveUp = map[string]string{}
			}
			r.GaveUp[l.Msg+" "+l.ContainerID] = l.Reason
		}
		r.LoggedConflicts += l.Conflicts
		r.MaxConflicts = max(r.MaxConflicts, l.Conflicts)
		d := time.Duration(l.DurationMs) * time.Millisecond
		switch l.Msg {
		case "ADD":
			r.BGPAdd = append(r.BGPAdd, d)
		case "DEL":
			r.BGPDel = append(r.BGPDel, d)
		}
	}
}

// rulesAndRoutes is the node's policy rules and routes of every table.
func rulesAndRoutes(n *node) ([]string, error) {
	var lines []string
	for _, args := range [][]string{{"-4", "rule"}, {"-6", "rule"}, {"-4", "route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}} {
		out, err := n.Run("ip", args...)
		if err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			lines = append(lines, strings.Join(args, " ")+": "+l)
		}
	}
	return lines, nil
}

func diffLines(before, after []string) []string {
	seen := map[string]int{}
	for _, l := range before {
		seen[l]++
	}
	var diff []string
	for _, l := range after {
		if seen[l] > 0 {
			seen[l]--
			continue
		}
		diff = append(diff, "+ "+l)
	}
	for l, c := range seen {
		for range c {
			diff = append(diff, "- "+l)
		}
	}
	return diff
}
