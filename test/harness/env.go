// Package harness runs integration tests against real components: a real
// kube-apiserver and etcd built from the Go module proxy, network namespaces
// as nodes and containers, the project's binaries and the real cnitool.
//
// A test package calls Main from TestMain and Setup from each test. Setup
// skips (with the reason) when the process is not root.
package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/galactic-cni/galactic/pkg/client"
)

// Namespace is the namespace the harness creates for galactic objects.
const Namespace = "galactic-system"

// Env is one test binary's environment, shared by its tests.
type Env struct {
	CP *ControlPlane
	// BinDir holds the project's binaries, cnitool and the reference
	// plugins, built from this checkout.
	BinDir string
	Kube   kubernetes.Interface
	API    *client.Clients

	ctrlOnce sync.Once
	ctrl     *Controller
	ctrlErr  error
}

var (
	envOnce sync.Once
	env     *Env
	envErr  error
)

// Main runs the tests of a package, then each of after (the package's own
// shared fixtures' teardown), and stops the environment. Whatever the
// harness made that is still there then (a process, a network namespace,
// a directory) fails the package and is removed. The tests end early and
// clean up when they get SIGINT, SIGTERM or SIGHUP, or `go test` ends.
func Main(m *testing.M, after ...func()) {
	if err := DieWithParent(); err != nil {
		fmt.Fprintln(os.Stderr, "harness:", err)
		os.Exit(1)
	}
	stop := CleanUpOnSignal()
	code := m.Run()
	stop()
	for _, f := range after {
		f()
	}
	if env != nil {
		env.Close()
	}
	if left := RemoveLeftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "harness: the tests left these behind (removed now):\n  %s\n", strings.Join(left, "\n  "))
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Close stops the controller (if started), the control plane and removes
// the built binaries.
func (e *Env) Close() {
	e.stopController()
	e.CP.Stop()
	_ = RemoveDir(e.BinDir)
}

// RequireRoot skips t unless the process is root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("integration test: needs root for network namespaces, taps and policy routing (run `sudo make test`)")
	}
}

// Setup returns the package's environment, starting it on first use.
func Setup(t testing.TB) *Env {
	t.Helper()
	RequireRoot(t)
	envOnce.Do(func() { env, envErr = NewEnv(context.Background(), os.Stderr) })
	if envErr != nil {
		t.Fatalf("integration environment: %v", envErr)
	}
	return env
}

// NewEnv builds the binaries and starts a control plane; Close stops it.
// Tests use Setup instead; NewEnv is for programs such as the demo, which
// can end it half-way with ctx.
func NewEnv(ctx context.Context, progress io.Writer) (_ *Env, err error) {
	bin, err := BuildBinaries(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := StartControlPlane(ctx, progress)
	if err != nil {
		RemoveDir(bin)
		return nil, err
	}
	e, err := envOn(ctx, cp, bin)
	if err != nil {
		cp.Stop()
		RemoveDir(bin)
		return nil, err
	}
	return e, nil
}

// NewEnvOn is an environment on a control plane that already runs (a
// Cluster's): the binaries built, galactic's namespace and the node
// identity applied, so that nodes can be created on it. Its owner stops
// cp; Release removes what NewEnvOn added.
func NewEnvOn(ctx context.Context, cp *ControlPlane) (*Env, error) {
	bin, err := BuildBinaries(ctx)
	if err != nil {
		return nil, err
	}
	e, err := envOn(ctx, cp, bin)
	if err != nil {
		_ = RemoveDir(bin)
	}
	return e, err
}

// Release removes the binaries of an environment NewEnvOn made.
func (e *Env) Release() { _ = RemoveDir(e.BinDir) }

func envOn(ctx context.Context, cp *ControlPlane, bin string) (*Env, error) {
	var err error
	e := &Env{CP: cp, BinDir: bin}
	if e.Kube, err = kubernetes.NewForConfig(cp.Admin); err != nil {
		return nil, err
	}
	if e.API, err = client.New(cp.Admin); err != nil {
		return nil, err
	}
	_, err = e.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err := e.applyIdentity(ctx); err != nil {
		return nil, fmt.Errorf("node identity and admission: %w", err)
	}
	return e, nil
}

// BuildBinaries builds the project's binaries, the test helpers, cnitool
// and the reference plugins into a new temporary directory.
func BuildBinaries(ctx context.Context) (string, error) {
	dir, err := MkdirTemp("galactic-bin-")
	if err != nil {
		return "", err
	}
	root := RepoRoot()
	pkgs := []string{
		"github.com/containernetworking/cni/cnitool",
		"github.com/containernetworking/plugins/plugins/main/loopback",
		"github.com/containernetworking/plugins/plugins/main/tap",
		"github.com/containernetworking/plugins/plugins/ipam/static",
	}
	for _, d := range []string{"plugins", "gc", "router", "controller", "installer", "test/bin"} {
		if _, err := os.Stat(filepath.Join(root, d)); err == nil {
			pkgs = append(pkgs, "./"+d+"/...")
		}
	}
	// Static, as `make build` and the image build them.
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	// Interrupted, go removes its work directory before it exits.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		RemoveDir(dir)
		return "", fmt.Errorf("building binaries: %v\n%s", err, out)
	}
	return dir, nil
}
