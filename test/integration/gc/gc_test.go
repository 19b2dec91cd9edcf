package gc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

const vpc = "gcvpc"

// chain writes the conflist "net-<attachment>": galactic-cni (tap, table
// routing, no handoff) then galactic-bgp.
func chain(t *testing.T, node *harness.Node, attachment string, addr string) string {
	t.Helper()
	name := "net-" + attachment
	node.WriteConflist(t, map[string]any{
		"cniVersion": "1.1.0", "name": name,
		"plugins": []any{
			map[string]any{"type": "galactic-cni", "vpc": vpc, "attachment": attachment, "mode": "tap", "routing": "table",
				"addresses": []string{addr}, "handoff": map[string]any{"enabled": false}},
			map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": attachment},
		},
	})
	return name
}

func add(t *testing.T, node *harness.Node, network string, c *harness.Netns) {
	t.Helper()
	if _, err := node.CNITool("add", network, c, "net0"); err != nil {
		t.Fatal(err)
	}
}

// tapIndex is the ifindex of the attachment's tap on node, 0 when absent.
func tapIndex(t *testing.T, node *harness.Node, attachment string) int {
	t.Helper()
	idx := 0
	err := node.Do(func() error {
		l, err := netlink.LinkByName(names.HostInterface(names.ModeTap, vpc, attachment))
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil
		}
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// moved sets up an attachment that ran on node A and moved to node B
// without A's DEL: A's container is gone, its tap detached, and only B
// advertises the attachment.
func moved(t *testing.T, env *harness.Env, attachment string) (a, b *harness.Node) {
	t.Helper()
	a, b = env.NewNode(t, "gc-a-"+attachment), env.NewNode(t, "gc-b-"+attachment)
	ca, cb := harness.NewContainer(t), harness.NewContainer(t)
	add(t, a, chain(t, a, attachment, "10.61.0.5/24"), ca)
	ca.Delete()
	add(t, b, chain(t, b, attachment, "10.61.0.5/24"), cb)
	advs := env.Advertisements(t, vpc, attachment)
	if _, onB := advs[b.Name]; len(advs) != 1 || !onB {
		t.Fatalf("after the move only node B should advertise: %v", advs)
	}
	return a, b
}

func TestAMovedAttachmentsDetachedTapIsKeptOnTheFirstPassAndReclaimedOnTheSecond(t *testing.T) {
	env := harness.Setup(t)
	a, _ := moved(t, env, "moved")
	if tapIndex(t, a, "moved") == 0 {
		t.Fatal("node A's tap should still exist before the GC")
	}
	out := a.MustGC(t)
	if tapIndex(t, a, "moved") == 0 {
		t.Fatalf("the first pass must keep the tap:\n%s", out)
	}
	if !strings.Contains(out, `"reason":"first-sighting"`) {
		t.Errorf("the first pass should say why it kept the tap:\n%s", out)
	}
	out = a.MustGC(t)
	if tapIndex(t, a, "moved") != 0 {
		t.Fatalf("the second pass must reclaim the tap:\n%s", out)
	}
	if !strings.Contains(out, "reclaimed detached tap") {
		t.Errorf("the reclaim should be logged:\n%s", out)
	}
}

func TestADetachedTapStillAdvertisedHereByALiveEntryIsKept(t *testing.T) {
	env := harness.Setup(t)
	a := env.NewNode(t, "gc-kept")
	c := harness.NewContainer(t)
	add(t, a, chain(t, a, "kept", "10.62.0.5/24"), c)
	// No VMM ever opens the tap: detached, but its container lives and
	// this node advertises it.
	for pass := range 4 {
		out := a.MustGC(t)
		if tapIndex(t, a, "kept") == 0 {
			t.Fatalf("pass %d reclaimed a tap still advertised here:\n%s", pass+1, out)
		}
	}
	if _, ok := env.Advertisements(t, vpc, "kept")[a.Name]; !ok {
		t.Fatal("the live advertisement must stay")
	}
}

func TestATapHeldByAProcessIsNeverReclaimedEvenWhenAdvertisedOnlyElsewhere(t *testing.T) {
	env := harness.Setup(t)
	a, _ := moved(t, env, "held")
	a.HoldTap(t, names.HostInterface(names.ModeTap, vpc, "held"))
	for pass := range 3 {
		out := a.MustGC(t)
		if tapIndex(t, a, "held") == 0 {
			t.Fatalf("pass %d reclaimed a held tap:\n%s", pass+1, out)
		}
	}
}

func TestATapRecreatedBetweenPassesIsNotReclaimedOnTheSecondPass(t *testing.T) {
	env := harness.Setup(t)
	a, _ := moved(t, env, "recreated")
	tap := names.HostInterface(names.ModeTap, vpc, "recreated")
	a.MustGC(t)
	before := tapIndex(t, a, "recreated")
	// Recreate the tap with the same name and alias: a new ifindex.
	for _, args := range [][]string{
		{"ip", "link", "del", tap},
		{"ip", "tuntap", "add", "dev", tap, "mode", "tap"},
		{"ip", "link", "set", tap, "alias", names.Alias(vpc, "recreated")},
	} {
		if out, err := a.Run(args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	after := tapIndex(t, a, "recreated")
	if after == before {
		t.Fatalf("the recreated tap should have a new ifindex (%d)", before)
	}
	out := a.MustGC(t)
	if tapIndex(t, a, "recreated") != after {
		t.Fatalf("a recreated tap counts as a first sighting:\n%s", out)
	}
	a.MustGC(t)
	if tapIndex(t, a, "recreated") != 0 {
		t.Fatal("two sightings of the new tap should reclaim it")
	}
}

// daemon starts galactic-gc as a long-running daemon inside the node and
// returns a reader of its log and a stop function.
func daemon(t *testing.T, env *harness.Env, node *harness.Node, args ...string) (*bufio.Scanner, func()) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", node.Netns.Name, filepath.Join(env.BinDir, "galactic-gc"), "--config", node.ConfigPath}, args...)...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p, err := harness.StartProcess("galactic-gc", cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	// Closing the pipe first ends the copy of its output nobody reads.
	stop := func() { pw.Close(); p.Kill() }
	t.Cleanup(stop)
	return bufio.NewScanner(pr), stop
}

// waitLine reads log lines until one contains want.
func waitLine(t *testing.T, s *bufio.Scanner, want string) string {
	t.Helper()
	for s.Scan() {
		if strings.Contains(s.Text(), want) {
			return s.Text()
		}
	}
	t.Fatalf("log ended before a line with %q", want)
	return ""
}

func TestADaemonRestartBetweenPassesKeepsTheFirstSighting(t *testing.T) {
	env := harness.Setup(t)
	a, _ := moved(t, env, "restart")
	logs, stop := daemon(t, env, a, "--interval", "1h", "--metrics-address", "")
	waitLine(t, logs, "gc pass finished")
	go func() {
		for logs.Scan() {
		}
	}()
	stop()
	if tapIndex(t, a, "restart") == 0 {
		t.Fatal("the first pass must keep the tap")
	}
	a.MustGC(t)
	if tapIndex(t, a, "restart") != 0 {
		t.Fatal("the pass after a restart must count the first sighting and reclaim")
	}
}

func TestDeadEntriesArePrunedEmptyAdvertisementsDeletedAndConcurrentADDsKept(t *testing.T) {
	env := harness.Setup(t)
	a := env.NewNode(t, "gc-prune")
	net := chain(t, a, "prune", "10.63.0.5/24")
	dead, live := harness.NewContainer(t), harness.NewContainer(t)
	add(t, a, net, dead)
	add(t, a, net, live)
	dead.Delete()
	a.MustGC(t)
	adv, ok := env.Advertisements(t, vpc, "prune")[a.Name]
	if !ok || len(adv.Spec.Containers) != 1 || adv.Spec.Containers[0].ContainerID != harness.ContainerID(live.Path) {
		t.Fatalf("want only the live entry left, got %+v", adv.Spec.Containers)
	}

	// Concurrent ADDs while passes prune: every live entry survives.
	var added []*harness.Netns
	for round := range 4 {
		c := harness.NewContainer(t)
		added = append(added, c)
		errs := make(chan error, 2)
		go func() { _, err := a.CNITool("add", net, c, "net0"); errs <- err }()
		go func() {
			out, err := a.GC()
			if err != nil {
				err = fmt.Errorf("round %d: %v\n%s", round, err, out)
			}
			errs <- err
		}()
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	adv = env.Advertisements(t, vpc, "prune")[a.Name]
	got := map[string]bool{}
	for _, e := range adv.Spec.Containers {
		got[e.ContainerID] = true
	}
	for _, c := range append(added, live) {
		if !got[harness.ContainerID(c.Path)] {
			t.Fatalf("entry of %s lost: %v", c.Name, got)
		}
	}

	// With every container gone, the pass deletes the advertisement.
	live.Delete()
	for _, c := range added {
		c.Delete()
	}
	a.MustGC(t)
	if _, ok := env.Advertisements(t, vpc, "prune")[a.Name]; ok {
		t.Fatal("an advertisement without live entries must be deleted")
	}
}

func TestWithTheAPIServerUnreachableNothingIsReclaimedAndTheNextPassCompletes(t *testing.T) {
	env := harness.Setup(t)
	a, _ := moved(t, env, "offline")
	if err := a.SetAPIReachable(false); err != nil {
		t.Fatal(err)
	}
	for pass := range 3 {
		out, err := a.GC()
		if err == nil {
			t.Fatalf("pass %d should report the API error:\n%s", pass+1, out)
		}
		if !strings.Contains(out, `"kind":"list-advertisements"`) {
			t.Errorf("the error should be logged with its kind:\n%s", out)
		}
		if tapIndex(t, a, "offline") == 0 {
			t.Fatalf("pass %d reclaimed a tap without reading advertisements:\n%s", pass+1, out)
		}
	}
	if err := a.SetAPIReachable(true); err != nil {
		t.Fatal(err)
	}
	// The sightings went on while offline, so the first pass after
	// recovery can reclaim.
	out := a.MustGC(t)
	if tapIndex(t, a, "offline") != 0 {
		t.Fatalf("the pass after recovery should complete the reclaim:\n%s", out)
	}
}

func TestMetricsAndHealthReportThePasses(t *testing.T) {
	env := harness.Setup(t)
	a, _ := moved(t, env, "metrics")
	port := freePort(t, a)
	logs, _ := daemon(t, env, a, "--interval", "1s", "--metrics-address", "127.0.0.1:"+strconv.Itoa(port))
	for range 2 {
		waitLine(t, logs, "gc pass finished")
	}
	go func() {
		for logs.Scan() {
		}
	}()
	get := func(path string) (int, string) {
		var code int
		var body string
		// Dial on this thread, inside the node; http.Client would dial on
		// another thread, outside it.
		err := a.Do(func() error {
			conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil)
			req.Close = true
			if err := req.Write(conn); err != nil {
				return err
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			code, body = resp.StatusCode, string(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Fatalf("healthz: %d %s", code, body)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		`galactic_gc_passes_total{result="success"}`,
		`galactic_gc_taps_reclaimed_total 1`,
		`galactic_gc_taps_kept_total{reason="first-sighting"} 1`,
		`galactic_gc_pass_duration_seconds_count`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}
}

// freePort finds a free port inside the node.
func freePort(t *testing.T, node *harness.Node) int {
	t.Helper()
	var port int
	if err := node.Do(func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port = l.Addr().(*net.TCPAddr).Port
		return l.Close()
	}); err != nil {
		t.Fatal(err)
	}
	return port
}
