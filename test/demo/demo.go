// Package demo is `make demo`: the whole story of an attachment on one
// machine, with a real control plane, two nodes as network namespaces, the
// real plugins run by cnitool and a VM on the tap: a qemu guest where qemu
// can run, else a process that only opens the tap (tapholder). Every step checks what it shows, and Run fails when an expected state is
// not observed.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/test/harness"
)

// The attachment the demo moves around.
const (
	vpc          = "blue"
	attachment   = "web-0-net0"
	network      = "vpc-blue"
	ifName       = "net0"
	leaseSeconds = 5
)

var addresses = []string{"10.20.0.5/24", "fd20::5/64"}

type demo struct {
	ctx   context.Context
	out   io.Writer
	start time.Time
	env   *harness.Env
	dir   string
	nodes map[string]*harness.Node
	gcds  map[string]*exec.Cmd
	// vmm starts the VM; vmms are the running ones by node.
	vmm  vmm
	vmms map[string]instance
	// vmmStarted is when each node's VMM last attached.
	vmmStarted map[string]time.Time
	// lastAdd is how long the last launch's ADD took.
	lastAdd time.Duration
	tap     string
	undo    []func()
	// current is where the instance runs now.
	current *workload
}

// Run runs the demo. With env nil it builds the binaries and starts its own
// control plane. Everything it creates is removed before it returns, also
// when ctx is cancelled or a step fails.
func Run(ctx context.Context, out io.Writer, env *harness.Env) (err error) {
	d := &demo{ctx: ctx, out: out, start: time.Now(), nodes: map[string]*harness.Node{},
		gcds: map[string]*exec.Cmd{}, vmms: map[string]instance{}, vmmStarted: map[string]time.Time{}, tap: names.HostInterface(names.ModeTap, vpc, attachment)}
	defer func() {
		d.say("== teardown: removing namespaces, processes and files")
		for i := len(d.undo) - 1; i >= 0; i-- {
			d.undo[i]()
		}
		if err == nil {
			d.say("done: every expected state was observed")
		}
	}()
	if env == nil {
		d.say("starting a real etcd and kube-apiserver (the first run builds them from the Go module proxy: about 6-9 minutes on 2 cores)")
		if env, err = harness.NewEnv(out); err != nil {
			return err
		}
		d.undo = append(d.undo, env.Close)
	}
	d.env = env
	if d.dir, err = os.MkdirTemp("", "galactic-demo-"); err != nil {
		return err
	}
	d.undo = append(d.undo, func() { os.RemoveAll(d.dir) })
	d.say("control plane at %s; CRDs installed", env.CP.Server)
	var why string
	d.vmm, why = chooseVMM(env.BinDir, d.dir, out)
	if _, fallback := d.vmm.(tapholder); fallback {
		d.say("the VM is %s, because %s", d.vmm.describe(), why)
	} else {
		d.say("the VM is %s: %s", d.vmm.describe(), why)
	}

	for _, step := range []func() error{d.setup, d.attach, d.upgrade, d.move, d.crash, d.comeBack, d.finish} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) show(text string) {
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintf(d.out, "           %s\n", line)
	}
}

func expect(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf("expected "+format, args...)
}

// setup creates node-a and node-b and installs galactic on each with
// galactic-installer into the node's own root.
func (d *demo) setup() error {
	d.say("== setup: two nodes as network namespaces, galactic installed on each")
	for _, name := range []string{"node-a", "node-b"} {
		dir := filepath.Join(d.dir, name)
		n, err := d.env.CreateNode(name, dir)
		if err != nil {
			return err
		}
		d.undo = append(d.undo, n.Close)
		d.nodes[name] = n
		root := filepath.Join(dir, "root")
		if err := os.MkdirAll(root, 0o755); err != nil {
			return err
		}
		out, err := exec.CommandContext(d.ctx, filepath.Join(d.env.BinDir, "galactic-installer"), "install",
			"--root", root, "--node-name", name, "--kubeconfig", d.env.CP.AdminKubeconfig, "--source-dir", d.env.BinDir).CombinedOutput()
		if err != nil {
			return fmt.Errorf("installing on %s: %v\n%s", name, err, out)
		}
		d.say("%s: netns %s; galactic-installer install --root %s", name, n.Netns.Name, root)
		d.show(string(out))
		n.ConfigPath = filepath.Join(root, strings.TrimPrefix(settings.DefaultConfig, "/"))
		n.CNIPath = filepath.Join(root, "opt/cni/bin")
		if n.Settings, err = settings.Load(func(k string) string {
			if k == settings.EnvConfig {
				return n.ConfigPath
			}
			return ""
		}); err != nil {
			return err
		}
		n.WriteConflistFile(conflist())
		if err := d.startGC(name); err != nil {
			return err
		}
	}
	d.say("conflist %q on both nodes (routing: table, since this kernel has no VRF; a %ds lease):", network, leaseSeconds)
	data, _ := json.MarshalIndent(conflist(), "", "  ")
	d.show(string(data))
	return nil
}

func conflist() map[string]any {
	return map[string]any{
		"cniVersion": "1.1.0", "name": network,
		"plugins": []any{
			map[string]any{"type": "galactic-cni", "vpc": vpc, "attachment": attachment, "mode": "tap",
				"addresses": addresses, "routing": "table",
				"handoff": map[string]any{"enabled": true, "waitSeconds": 30, "leaseSeconds": leaseSeconds}},
			map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": attachment},
		},
	}
}

// startGC runs galactic-gc on a node with a short interval, so it renews
// the leases of live holders well within the lease duration.
func (d *demo) startGC(node string) error {
	n := d.nodes[node]
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(d.env.BinDir, "galactic-gc"),
		"--config", n.ConfigPath, "--interval", "1s", "--metrics-address", "")
	logf, err := os.Create(filepath.Join(n.Dir, "galactic-gc.log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	d.gcds[node] = cmd
	d.undo = append(d.undo, func() { d.stopGC(node); logf.Close() })
	return nil
}

// waitGCPass waits until the node's GC daemon finished a pass that started
// after t.
func (d *demo) waitGCPass(node string, t time.Time) error {
	path := filepath.Join(d.nodes[node].Dir, "galactic-gc.log")
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(data), "\n") {
			var l struct {
				Time     time.Time `json:"time"`
				Msg      string    `json:"msg"`
				Duration string    `json:"duration"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || !strings.HasPrefix(l.Msg, "gc pass finished") {
				continue
			}
			took, _ := time.ParseDuration(l.Duration)
			if l.Time.Add(-took).After(t) {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("expected a galactic-gc pass on %s after %s", node, t.Format(time.RFC3339Nano))
}

func (d *demo) stopGC(node string) {
	if cmd := d.gcds[node]; cmd != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		delete(d.gcds, node)
	}
}

// container creates a workload sandbox netns.
func (d *demo) container() (*harness.Netns, error) {
	c, err := harness.CreateNetns("c")
	if err != nil {
		return nil, err
	}
	d.undo = append(d.undo, c.Delete)
	return c, nil
}

// cnitool runs a verb of the chain on a node and returns its output (the
// CNI result of an ADD).
func (d *demo) cnitool(node, verb string, c *harness.Netns) (string, error) {
	d.say("%s: cnitool %s %s %s", node, verb, network, c.Path)
	return d.nodes[node].CNITool(verb, network, c, ifName)
}

// launch starts the VM on a node: a sandbox netns, the chain's ADD, then
// the VMM opening the tap.
func (d *demo) launch(node string) (*harness.Netns, error) {
	c, err := d.container()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	out, err := d.cnitool(node, "add", c)
	if err != nil {
		return nil, err
	}
	d.lastAdd = time.Since(start)
	return c, d.startVMM(node, out)
}

// startVMM starts the VM on the tap the ADD result (out) names.
func (d *demo) startVMM(node, out string) error {
	res := &current.Result{}
	if err := json.Unmarshal([]byte(out), res); err != nil || len(res.Interfaces) == 0 {
		return fmt.Errorf("the ADD result on %s names no tap (%v): %s", node, err, out)
	}
	inst, err := d.vmm.start(d.ctx, d.nodes[node], res)
	if err != nil {
		return fmt.Errorf("starting the VM on %s: %w", node, err)
	}
	d.vmms[node] = inst
	d.undo = append(d.undo, inst.crash)
	d.vmmStarted[node] = time.Now()
	d.say("%s: VMM (pid %d) opened tap %s; the VM %s", node, inst.pid(), d.tap, inst.note())
	return nil
}

// stopVMM shuts the node's VM down in order (a guest powers off).
func (d *demo) stopVMM(node string) error {
	inst := d.vmms[node]
	if inst == nil {
		return nil
	}
	delete(d.vmms, node)
	if err := inst.stop(); err != nil {
		return fmt.Errorf("stopping the VM on %s: %w", node, err)
	}
	d.say("%s: VM shut down (pid %d exited and let go of the tap)", node, inst.pid())
	return nil
}

// crashVMM kills the node's VMM at once, as a node failure does.
func (d *demo) crashVMM(node string) {
	if inst := d.vmms[node]; inst != nil {
		delete(d.vmms, node)
		inst.crash()
		d.say("%s: VMM (pid %d) killed", node, inst.pid())
	}
}

// state is what the demo observes of the attachment.
type state struct {
	tapIndex map[string]int
	advs     map[string]v1alpha1.BGPAdvertisement
	lease    *coordinationv1.Lease
}

func (d *demo) observe(show bool) (state, error) {
	s := state{tapIndex: map[string]int{}, advs: map[string]v1alpha1.BGPAdvertisement{}}
	for _, node := range []string{"node-a", "node-b"} {
		n := d.nodes[node]
		out, err := n.Run("ip", "-d", "link", "show", "dev", d.tap)
		if err != nil {
			continue
		}
		var idx int
		fmt.Sscanf(out, "%d:", &idx)
		s.tapIndex[node] = idx
		if show {
			d.say("%s: tap", node)
			d.show(firstLines(out, 2) + "\n" + grepLine(out, "alias"))
			addrs, _ := n.Run("ip", "-br", "addr", "show", "dev", d.tap)
			d.show("addresses: " + strings.Join(strings.Fields(addrs)[2:], " "))
			rules, _ := n.Run("ip", "rule", "show", "iif", d.tap)
			d.show("rules: " + strings.TrimSpace(rules))
			if table := tableOf(rules); table != "" {
				r4, _ := n.Run("ip", "route", "show", "table", table)
				r6, _ := n.Run("ip", "-6", "route", "show", "table", table)
				d.show("table " + table + ":\n  " + strings.ReplaceAll(strings.TrimSpace(r4+r6), "\n", "\n  "))
			}
		}
	}
	l, err := d.env.API.BGPAdvertisements(harness.Namespace).List(d.ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpc, attachment)})
	if err != nil {
		return s, err
	}
	for _, a := range l.Items {
		s.advs[a.Spec.Node] = a
		if show {
			d.say("advertisement %s: node %s prefixes %v", a.Name, a.Spec.Node, a.Spec.Prefixes)
			for _, e := range a.Spec.Containers {
				d.show(fmt.Sprintf("entry %s/%s netns %s holderGeneration %d", short(e.ContainerID), e.IfName, e.Netns, e.HolderGeneration))
			}
		}
	}
	if show && len(l.Items) == 0 {
		d.say("advertisements of %s/%s: none", vpc, attachment)
	}
	lease, err := d.env.Kube.CoordinationV1().Leases(harness.Namespace).Get(d.ctx, names.Lease(vpc, attachment), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return s, err
	}
	if err == nil {
		s.lease = lease
		if show {
			d.say("lease %s: holder %q, token (leaseTransitions) %d", lease.Name, holder(lease), token(lease))
		}
	}
	return s, nil
}

func holder(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func token(l *coordinationv1.Lease) int32 {
	if l == nil || l.Spec.LeaseTransitions == nil {
		return 0
	}
	return *l.Spec.LeaseTransitions
}

func short(id string) string {
	if len(id) > 20 {
		return id[:20] + "…"
	}
	return id
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

func grepLine(s, word string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func tableOf(rules string) string {
	f := strings.Fields(rules)
	for i := range f {
		if f[i] == "lookup" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// 1. A VM attaches on node-a.
func (d *demo) attach() error {
	d.say("== 1. a VM attaches on node-a")
	c, err := d.launch("node-a")
	if err != nil {
		return err
	}
	s, err := d.observe(true)
	if err != nil {
		return err
	}
	d.current = &workload{node: "node-a", netns: c}
	return errors.Join(
		expect(s.tapIndex["node-a"] != 0, "a tap on node-a"),
		expect(len(s.advs) == 1 && s.advs["node-a"].Name != "", "exactly node-a's advertisement, got %v", keys(s.advs)),
		expect(holder(s.lease) == names.Holder("node-a", harness.ContainerID(c.Path)), "node-a's container to hold the lease, got %q", holder(s.lease)),
		expect(entryToken(s.advs["node-a"]) == int64(token(s.lease)), "the entry to carry the lease token %d", token(s.lease)),
	)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func entryToken(a v1alpha1.BGPAdvertisement) int64 {
	var t int64
	for _, e := range a.Spec.Containers {
		t = max(t, e.HolderGeneration)
	}
	return t
}

// workload is where the instance runs now.
type workload struct {
	node  string
	netns *harness.Netns
}
