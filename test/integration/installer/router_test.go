package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

var (
	routerOnce sync.Once
	routerBin  string
	routerErr  error
)

// routerBinary is the real galactic-router: the harness's build when it
// has one, else built here once.
func routerBinary(t *testing.T, env *harness.Env) string {
	t.Helper()
	if p := filepath.Join(env.BinDir, "galactic-router"); fileExists(p) {
		return p
	}
	routerOnce.Do(func() {
		dir, err := harness.SharedTempDir("galactic-router-bin-")
		if err != nil {
			routerErr = err
			return
		}
		routerBin = filepath.Join(dir, "galactic-router")
		cmd := exec.Command("go", "build", "-o", routerBin, "./router/cmd/galactic-router")
		cmd.Dir = harness.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			routerErr = errors.New("building galactic-router: " + err.Error() + "\n" + string(out))
		}
	})
	if routerErr != nil {
		t.Fatal(routerErr)
	}
	return routerBin
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// routerArgs are the router flags of a node on a documentation fabric; the
// router does not listen (as in the DaemonSet) and serves metrics and drain
// on the namespace's loopback.
var routerArgs = []string{
	"--router-asn", "65010", "--router-underlay", "192.0.2.11", "--router-peer", "192.0.2.1:65000",
	"--router-listen-port", "-1", "--router-metrics-address", "127.0.0.1:19655",
}

func TestInstallValidatesAndWritesTheRouterConfigAndABadValueChangesNothing(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	out := n.mustRun(t, n.args("install", routerArgs...)...)
	path := n.path("/etc/galactic/router.json")
	if !strings.Contains(out, "install: "+path+"\n") {
		t.Errorf("install output lacks router.json:\n%s", out)
	}
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.ASN != 65010 || c.Underlay.String() != "192.0.2.11" || c.ListenPort != -1 || len(c.Peers) != 1 {
		t.Errorf("router config %+v", c)
	}

	before := harness.Tree(t, n.root, true)
	for _, bad := range []struct {
		flag, value, want string
	}{
		{"--router-asn", "0", "asn: 0 is out of range"},
		{"--router-underlay", "fabric-a", `underlay: "fabric-a" is not an IP address`},
		{"--router-withdraw-hold-seconds", "7200", "withdrawHoldSeconds: 7200 is out of range"},
	} {
		stdout, stderr, code := n.run(t, n.args("install", append(slices.Clone(routerArgs), bad.flag, bad.value)...), n.environ)
		if code != 1 || !strings.Contains(stderr, bad.want) || !strings.Contains(stderr, bad.flag) {
			t.Errorf("%s %s: exit %d, want 1 naming the key and the flag\n%s%s", bad.flag, bad.value, code, stdout, stderr)
		}
	}
	if after := harness.Tree(t, n.root, true); after != before {
		t.Errorf("a failed install changed the root:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestUninstallDrainsTheRunningRouterBeforeRemovingItsConfig(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	copyFile(t, routerBinary(t, env), filepath.Join(filepath.Dir(n.installer), "galactic-router"), 0o755)
	// A node namespace that reaches the API server at 127.0.0.1, with the
	// underlay address on a veth.
	hn := env.NewNode(t, "node-a")
	for _, args := range [][]string{
		{"-n", hn.Netns.Name, "link", "add", "u0", "type", "veth", "peer", "name", "u1"},
		{"-n", hn.Netns.Name, "addr", "add", "192.0.2.11/24", "dev", "u0"},
		{"-n", hn.Netns.Name, "link", "set", "u0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	inNode := func(args ...string) *exec.Cmd {
		cmd := exec.Command("ip", append([]string{"netns", "exec", hn.Netns.Name}, args...)...)
		cmd.Env = n.environ
		return cmd
	}
	if out, err := inNode(append([]string{n.installer}, n.args("install", routerArgs...)...)...).CombinedOutput(); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}

	// The router runs with the credentials install wrote, under the
	// manifests' Role: its watch and status writes are the service account's.
	var rout, rerr bytes.Buffer
	router := inNode(filepath.Join(filepath.Dir(n.installer), "galactic-router"),
		"--config", n.path("/etc/galactic/router.json"), "--node-config", n.path("/etc/galactic/node.json"))
	router.Stdout, router.Stderr = &rout, &rerr
	proc, err := harness.StartProcess("galactic-router", router, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Kill()
		if t.Failed() {
			t.Logf("router output:\n%s%s", rout.String(), rerr.String())
		}
	})

	ctx := context.Background()
	adv := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement("blue", "drain-0", "node-a"), Labels: names.AdvertisementLabels("blue", "drain-0", "node-a")},
		Spec: v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "drain-0", Node: "node-a", Prefixes: []v1alpha1.Prefix{"10.20.0.9/32"},
			Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "net0", Netns: "/var/run/netns/absent", Prefixes: []v1alpha1.Prefix{"10.20.0.9/32"}}}},
	}
	if _, err := env.API.BGPAdvertisements(harness.Namespace).Create(ctx, adv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.API.BGPAdvertisements(harness.Namespace).Delete(ctx, adv.Name, metav1.DeleteOptions{}) })
	harness.Eventually(t, 30*time.Second, "the router to mark the advertisement without a vni NoVNI", func() error {
		got, err := env.API.BGPAdvertisements(harness.Namespace).Get(ctx, adv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgrammed); c == nil || c.Reason != v1alpha1.ReasonNoVNI {
			return fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		return nil
	})

	cmd := inNode(append([]string{n.installer}, n.args("uninstall")...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "router drain: drained") {
		t.Errorf("uninstall did not drain the router:\n%s\nrouter log:\n%s", out, rerr.String())
	}
	select {
	case <-proc.Done():
		if err := proc.Err(); err != nil {
			t.Errorf("the router exited with %v after the drain\n%s", err, rerr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the router still runs after the drain\n%s", rerr.String())
	}
	if !strings.Contains(rerr.String(), `"msg":"drained"`) {
		t.Errorf("the router log does not show the drain:\n%s", rerr.String())
	}
	for _, p := range []string{"/etc/galactic/router.json", "/var/lib/galactic/router/state.json", "/var/lib/galactic/installed.json"} {
		if fileExists(n.path(p)) {
			t.Errorf("%s is left after uninstall", p)
		}
	}
}

func TestUninstallWithNoRouterRunningRemovesWhatARouterLeft(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	copyFile(t, routerBinary(t, env), filepath.Join(filepath.Dir(n.installer), "galactic-router"), 0o755)
	pristine := harness.Tree(t, n.root, false)
	n.mustRun(t, n.args("install", routerArgs...)...)
	out := n.mustRun(t, n.args("uninstall")...)
	if !strings.Contains(out, "no router runs: removed its VXLAN devices, routes and saved paths") {
		t.Errorf("uninstall output:\n%s", out)
	}
	if after := harness.Tree(t, n.root, false); after != pristine {
		t.Errorf("uninstall did not restore the root:\nbefore:\n%s\nafter:\n%s", pristine, after)
	}
}

// The example ConfigMap, through the real installer with a node's
// underlay, as the init container runs it.
func TestTheExampleRouterConfigMapInstallsOnANode(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	ctx := context.Background()
	cm, err := env.Kube.CoreV1().ConfigMaps(harness.Namespace).Get(ctx, "galactic-router", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the manifests must create the galactic-router ConfigMap: %v", err)
	}
	src := filepath.Join(t.TempDir(), "router.json")
	writeFile(t, src, cm.Data["router.json"], 0o644)
	n.mustRun(t, n.args("install", "--router-config-file", src, "--router-underlay", "192.0.2.12")...)
	data, err := os.ReadFile(n.path("/etc/galactic/router.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil || m["underlay"] != "192.0.2.12" {
		t.Errorf("router.json %s: want the shared config with this node's underlay (%v)", data, err)
	}
}

// The shipped conflist ConfigMap, through the real installer as the init
// container runs it: the runtime's loader finds it, and uninstall takes it
// away with everything else install wrote.
func TestTheConflistConfigMapInstallsOnANodeAndUninstallRemovesIt(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	ctx := context.Background()
	cm, err := env.Kube.CoreV1().ConfigMaps(harness.Namespace).Get(ctx, "galactic-cni", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the manifests must create the galactic-cni ConfigMap: %v", err)
	}
	const key = "10-galactic.conflist"
	src := filepath.Join(t.TempDir(), key)
	writeFile(t, src, cm.Data[key], 0o644)
	pristine := harness.Tree(t, n.root, false)

	out := n.mustRun(t, n.args("install", "--conflist-file", src)...)
	dst := n.path("/etc/cni/net.d/" + key)
	if !strings.Contains(out, "install: "+dst+"\n") {
		t.Fatalf("install output lacks the conflist:\n%s", out)
	}
	if strings.Index(out, dst) < strings.Index(out, n.path("/etc/galactic/node.json")) {
		t.Errorf("the conflist was written before the node settings:\n%s", out)
	}
	list, err := libcni.LoadConfList(n.path("/etc/cni/net.d"), "galactic")
	if err != nil {
		t.Fatalf("libcni cannot load the installed conflist: %v", err)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	if !slices.Equal(types, []string{"galactic-cni", "galactic-bgp"}) {
		t.Errorf("installed chain %v, want galactic-cni then galactic-bgp", types)
	}

	out = n.mustRun(t, n.args("uninstall")...)
	if !strings.HasPrefix(strings.SplitN(out[strings.Index(out, "remove: "):], "\n", 2)[0], "remove: "+dst) {
		t.Errorf("uninstall must remove the conflist first:\n%s", out)
	}
	if after := harness.Tree(t, n.root, false); after != pristine {
		t.Errorf("uninstall did not restore the root:\nbefore:\n%s\nafter:\n%s", pristine, after)
	}
}
