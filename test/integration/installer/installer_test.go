package installer

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/installer/install"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/test/harness"
)

// node is one run of the real galactic-installer against a temporary root:
// the installer sits in its own image-like directory next to the plugins
// it copies, and reads a real service account token.
type node struct {
	env       *harness.Env
	installer string
	root      string
	tokenFile string
	environ   []string
}

func newNode(t *testing.T, env *harness.Env) *node {
	t.Helper()
	// The service account and its Role come from the manifests.
	applyManifests(t, env)
	dir := t.TempDir()
	image := filepath.Join(dir, "image")
	n := &node{
		env:       env,
		installer: filepath.Join(image, "galactic-installer"),
		root:      filepath.Join(dir, "root"),
		tokenFile: filepath.Join(dir, "serviceaccount", "token"),
	}
	for _, d := range []string{image, n.root, filepath.Dir(n.tokenFile)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, filepath.Join(env.BinDir, "galactic-installer"), n.installer, 0o755)
	// Stand-ins for the plugins: the installer copies bytes, whatever they are.
	for _, b := range []string{"galactic-cni", "galactic-bgp"} {
		writeFile(t, filepath.Join(image, b), "#!/bin/sh\necho "+b+"\n", 0o755)
	}
	writeFile(t, n.tokenFile, serviceAccountToken(t, env), 0o600)
	n.environ = []string{
		"PATH=" + os.Getenv("PATH"),
		"NODE_NAME=node-a",
		"KUBERNETES_SERVICE_HOST=127.0.0.1",
		"KUBERNETES_SERVICE_PORT=" + strconv.Itoa(env.CP.Port),
	}
	return n
}

// args are the flags a pod would not need: where the root and the token are.
func (n *node) args(verb string, extra ...string) []string {
	args := []string{verb, "--root", n.root}
	if verb != "uninstall" {
		args = append(args, "--token-file", n.tokenFile, "--ca-file", n.env.CP.CAFile)
	}
	return append(args, extra...)
}

func (n *node) command(args []string, environ []string) *exec.Cmd {
	cmd := exec.Command(n.installer, args...)
	cmd.Env = environ
	return cmd
}

// run runs the installer to completion.
func (n *node) run(t *testing.T, args []string, environ []string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := n.command(args, environ)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("running galactic-installer: %v", err)
	}
	return out.String(), errb.String(), code
}

func (n *node) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := n.run(t, args, n.environ)
	if code != 0 {
		t.Fatalf("galactic-installer %v: exit %d\n%s%s", args, code, out, errs)
	}
	return out
}

func (n *node) path(p string) string { return filepath.Join(n.root, p) }

// canListAdvertisements uses a kubeconfig the way the plugins do.
func canListAdvertisements(t *testing.T, kubeconfig string) {
	t.Helper()
	cfg, err := client.LoadConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	api, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.BGPAdvertisements(harness.Namespace).List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("listing advertisements with %s: %v", kubeconfig, err)
	}
}

func TestInstallIntoATemporaryRootThenAgainChangesNothingAndUninstallRestoresTheRoot(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	// A node that already has a CNI bin dir with another plugin in it.
	copyFile(t, filepath.Join(env.BinDir, "loopback"), n.path("/opt/cni/bin/loopback"), 0o755)
	pristine := harness.Tree(t, n.root, false)

	out := n.mustRun(t, n.args("install")...)
	for _, want := range []string{
		"install: " + n.path("/opt/cni/bin/galactic-cni"),
		"install: " + n.path("/opt/cni/bin/galactic-bgp"),
		"install: " + n.path("/etc/galactic/kubeconfig"),
		"install: " + n.path("/etc/galactic/node.json"),
		"create directory: " + n.path("/var/lib/galactic"),
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("install output lacks %q:\n%s", want, out)
		}
	}
	for p, mode := range map[string]fs.FileMode{
		"/opt/cni/bin/galactic-cni": 0o755, "/opt/cni/bin/galactic-bgp": 0o755,
		"/etc/galactic/kubeconfig": 0o600, "/etc/galactic/node.json": 0o644,
	} {
		if st, err := os.Stat(n.path(p)); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, want mode %s", p, err, mode)
		}
	}
	// The plugins find their settings, and the kubeconfig built from the
	// service account works against the real API server under the Role.
	s, err := settings.Load(func(k string) string {
		if k == settings.EnvConfig {
			return n.path("/etc/galactic/node.json")
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.NodeName != "node-a" || s.Namespace != harness.Namespace || s.Kubeconfig != n.path("/etc/galactic/kubeconfig") || s.StateDir != n.path("/var/lib/galactic") {
		t.Errorf("node settings %+v", s)
	}
	canListAdvertisements(t, s.Kubeconfig)

	installed := harness.Tree(t, n.root, true)
	out = n.mustRun(t, n.args("install")...)
	if again := harness.Tree(t, n.root, true); again != installed {
		t.Errorf("the second install touched files:\nbefore:\n%s\nafter:\n%s", installed, again)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines[:len(lines)-1] {
		if !strings.HasPrefix(l, "unchanged: ") && !strings.HasPrefix(l, "router: no --router-* flag") {
			t.Errorf("second install: %q is not an unchanged: line", l)
		}
	}
	if !strings.Contains(lines[len(lines)-1], "nothing changed") {
		t.Errorf("second install must say nothing changed:\n%s", out)
	}

	n.mustRun(t, n.args("uninstall")...)
	if after := harness.Tree(t, n.root, false); after != pristine {
		t.Errorf("uninstall did not restore the root:\nbefore install:\n%s\nafter uninstall:\n%s", pristine, after)
	}
}

func TestDryRunShowsThePlanAndWritesNothing(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	before := harness.Tree(t, n.root, true)
	out := n.mustRun(t, n.args("install", "--dry-run")...)
	if after := harness.Tree(t, n.root, true); after != before {
		t.Errorf("dry run wrote into the root:\n%s", after)
	}
	if !strings.Contains(out, "would install: "+n.path("/opt/cni/bin/galactic-cni")) || !strings.Contains(out, "dry run: nothing written") {
		t.Errorf("dry-run output:\n%s", out)
	}
}

func TestAGivenKubeconfigIsUsedInsteadOfTheServiceAccount(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	// No service account and no in-cluster environment: --kubeconfig is enough.
	os.Remove(n.tokenFile)
	environ := []string{"NODE_NAME=node-a"}
	out, errs, code := n.run(t, append(n.args("install"), "--kubeconfig", env.CP.AdminKubeconfig), environ)
	if code != 0 {
		t.Fatalf("install --kubeconfig: exit %d\n%s%s", code, out, errs)
	}
	canListAdvertisements(t, n.path("/etc/galactic/kubeconfig"))
}

func TestInstallErrorsSayWhatToFixAndChangeNothing(t *testing.T) {
	env := harness.Setup(t)
	for _, tc := range []struct {
		name string
		// prepare breaks one input and returns the install to run.
		prepare func(t *testing.T, n *node) *exec.Cmd
		want    []string
	}{
		{"no node name", func(t *testing.T, n *node) *exec.Cmd {
			return n.command(n.args("install"), without(n.environ, "NODE_NAME="))
		}, []string{"node name is not set", "--node-name", "NODE_NAME"}},
		{"a missing source binary", func(t *testing.T, n *node) *exec.Cmd {
			os.Remove(filepath.Join(filepath.Dir(n.installer), "galactic-bgp"))
			return n.command(n.args("install"), n.environ)
		}, []string{"galactic-bgp is missing", "pass --source-dir"}},
		{"a source dir without the plugins", func(t *testing.T, n *node) *exec.Cmd {
			return n.command(n.args("install", "--source-dir", t.TempDir()), n.environ)
		}, []string{"galactic-cni is missing", "pass --source-dir"}},
		{"a read-only CNI bin dir", func(t *testing.T, n *node) *exec.Cmd {
			bin := n.path("/opt/cni/bin")
			if err := os.MkdirAll(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			// A read-only bind mount in a private mount namespace: even root
			// cannot write there, and the host's mounts stay untouched.
			script := `mount --bind -o ro "$0" "$0" && exec "$@"`
			cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, bin, n.installer}, n.args("install")...)...)
			cmd.Env = n.environ
			return cmd
		}, []string{"is not writable", "read-only file system", "--cni-bin-dir"}},
		{"no service account token", func(t *testing.T, n *node) *exec.Cmd {
			os.Remove(n.tokenFile)
			return n.command(n.args("install"), n.environ)
		}, []string{"cannot read the service account token", "--token-file", "--kubeconfig"}},
		{"a token bound to no pod", func(t *testing.T, n *node) *exec.Cmd {
			token, err := env.UnboundToken(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, n.tokenFile, token, 0o600)
			return n.command(n.args("install"), n.environ)
		}, []string{"is bound to no pod", "the admission policy refuses its writes", "--token-file"}},
		{"a token bound to another node", func(t *testing.T, n *node) *exec.Cmd {
			token, err := env.NodeToken(context.Background(), "node-b")
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, n.tokenFile, token, 0o600)
			return n.command(n.args("install"), n.environ)
		}, []string{"is bound to node node-b, not to this node node-a", "--token-file"}},
		{"outside a pod without --api-server", func(t *testing.T, n *node) *exec.Cmd {
			return n.command(n.args("install"), without(n.environ, "KUBERNETES_SERVICE_HOST="))
		}, []string{"KUBERNETES_SERVICE_HOST", "--api-server"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, env)
			cmd := tc.prepare(t, n)
			before := harness.Tree(t, n.root, true)
			var out, errs bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errs
			var exit *exec.ExitError
			if err := cmd.Run(); err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errs.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errs.String(), w) {
					t.Errorf("error output lacks %q:\n%s", w, errs.String())
				}
			}
			if after := harness.Tree(t, n.root, true); after != before {
				t.Errorf("a failed install changed the root:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func TestRunReplacesAPodBoundTokenWithANodeBoundOneAndStopsOnSIGTERM(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	// What an earlier version left: the pod's own token in the kubeconfig.
	n.mustRun(t, n.args("install", "--node-token-seconds=0")...)
	kubeconfig := n.path("/etc/galactic/kubeconfig")
	if claims := kubeconfigTokenClaims(t, kubeconfig); claims.Kubernetes.Pod == nil {
		t.Fatalf("--node-token-seconds=0 must copy the pod's token: %+v", claims)
	}

	var out, errs bytes.Buffer
	cmd := n.command(n.args("run", "--interval", "50ms", "--grace", "1m"), n.environ)
	cmd.Stdout, cmd.Stderr = &out, &errs
	p, err := harness.StartProcess("galactic-installer run", cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	harness.Eventually(t, 30*time.Second, "the kubeconfig to carry a token bound to the Node", func() error {
		c := kubeconfigTokenClaims(t, kubeconfig)
		if c.Kubernetes != nil && c.Kubernetes.Pod == nil && c.Kubernetes.Node != nil && c.Kubernetes.Node.Name == "node-a" {
			return nil
		}
		return fmt.Errorf("claims %+v", c.Kubernetes)
	})
	if st, err := os.Stat(kubeconfig); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("rewritten kubeconfig: %v mode %v", err, st.Mode())
	}
	canListAdvertisements(t, kubeconfig)

	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if err := p.Err(); err != nil {
		t.Fatalf("run after SIGTERM: %v\n%s%s", err, out.String(), errs.String())
	}
	if !strings.Contains(out.String(), "update: "+kubeconfig) || !strings.Contains(out.String(), "run: stopping") {
		t.Errorf("run output:\n%s", out.String())
	}
}

// The host credential is the one that must survive a rollout: after
// install, the DaemonSet pod whose token bought it goes, and the plugins'
// kubeconfig still writes this node's advertisement under the admission
// policy.
func TestTheInstalledCredentialIsBoundToTheNodeAndOutlivesThePodThatInstalledIt(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	n.mustRun(t, n.args("install")...)
	kubeconfig := n.path("/etc/galactic/kubeconfig")
	c := kubeconfigTokenClaims(t, kubeconfig)
	if c.Kubernetes == nil || c.Kubernetes.Pod != nil || c.Kubernetes.Node == nil || c.Kubernetes.Node.Name != "node-a" {
		t.Fatalf("installed token claims %+v, want bound to Node node-a and no pod", c.Kubernetes)
	}
	if c.Expiry-c.IssuedAt != install.DefaultNodeTokenSeconds {
		t.Errorf("token lifetime %d s, want %d", c.Expiry-c.IssuedAt, install.DefaultNodeTokenSeconds)
	}
	ctx := context.Background()
	pod := "galactic-node-node-a"
	if err := env.Kube.CoreV1().Pods(harness.Namespace).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// The next test's newNode makes the pod again.
	t.Cleanup(func() { _, _ = env.NodeToken(ctx, "node-a") })
	harness.Eventually(t, 30*time.Second, "the pod to be gone", func() error {
		_, err := env.Kube.CoreV1().Pods(harness.Namespace).Get(ctx, pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	cfg, err := client.LoadConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	api, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	adv := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement("blue", "rollout-0", "node-a"), Labels: names.AdvertisementLabels("blue", "rollout-0", "node-a")},
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "rollout-0", Node: "node-a"},
	}
	t.Cleanup(func() { _ = env.API.BGPAdvertisements(harness.Namespace).Delete(ctx, adv.Name, metav1.DeleteOptions{}) })
	if _, err := api.BGPAdvertisements(harness.Namespace).Create(ctx, adv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the host kubeconfig writing its node's advertisement after the pod went: %v", err)
	}
}

type tokenClaims struct {
	IssuedAt   int64 `json:"iat"`
	Expiry     int64 `json:"exp"`
	Kubernetes *struct {
		Pod *struct {
			Name string `json:"name"`
		} `json:"pod"`
		Node *struct {
			Name string `json:"name"`
		} `json:"node"`
	} `json:"kubernetes.io"`
}

// kubeconfigTokenClaims are the (unverified) claims of the kubeconfig's token.
func kubeconfigTokenClaims(t *testing.T, kubeconfig string) tokenClaims {
	t.Helper()
	cfg, err := client.LoadConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(cfg.BearerToken, ".")
	if len(parts) != 3 {
		t.Fatalf("kubeconfig token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c tokenClaims
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRunExitsNonZeroWhenTheTokenStaysGonePastTheGracePeriod(t *testing.T) {
	env := harness.Setup(t)
	n := newNode(t, env)
	n.mustRun(t, n.args("install")...)
	if err := os.Remove(n.tokenFile); err != nil {
		t.Fatal(err)
	}
	out, errs, code := n.run(t, n.args("run", "--interval", "20ms", "--grace", "200ms"), n.environ)
	if code != 1 || !strings.Contains(errs, "cannot refresh") || !strings.Contains(errs, "service account token") {
		t.Fatalf("want exit 1 naming the token, got %d\n%s%s", code, out, errs)
	}
}

func without(environ []string, prefix string) []string {
	var out []string
	for _, e := range environ {
		if !strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}

func writeFile(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string, mode fs.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, string(data), mode)
}
