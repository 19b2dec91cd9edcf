package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// RepoRoot is the checkout this package was compiled from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CacheDir is where built control-plane binaries are kept between runs:
// $GALACTIC_CACHE_DIR, else $XDG_CACHE_HOME/galactic, else ~/.cache/galactic.
func CacheDir() string {
	if d := os.Getenv("GALACTIC_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "galactic")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "galactic-cache")
	}
	return filepath.Join(home, ".cache", "galactic")
}

// Binaries are the control-plane programs the harness runs.
type Binaries struct {
	Etcd      string
	APIServer string
}

// toolBuild describes one binary built from a tools module.
type toolBuild struct {
	name, pkg string
	estimate  time.Duration
	// tags are go build tags.
	tags string
	// kubeVersion stamps the binary with the module's k8s.io/kubernetes
	// version, as Kubernetes' own build does; unstamped, a Kubernetes
	// binary calls itself v0.0.0-master.
	kubeVersion bool
}

// Tools modules, relative to the repository root. Each pins its own
// programs and keys its own cache directory, so a container runtime bump
// does not rebuild the control plane.
const (
	controlPlaneModule = "test/tools"
	criModule          = "test/tools/cri"
	clusterModule      = "test/tools/cluster"
)

var controlPlaneTools = []toolBuild{
	{"etcd", "go.etcd.io/etcd/server/v3", time.Minute, "", false},
	{"kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", 9 * time.Minute, "", true},
}

// EnsureControlPlaneBinaries builds etcd and kube-apiserver from the Go
// module proxy the first time and reuses them afterwards. The cache key is
// the tools module's go.sum, so a version change rebuilds. progress gets one
// line per build with an estimate.
func EnsureControlPlaneBinaries(progress io.Writer) (Binaries, error) {
	paths, err := ensureTools(controlPlaneModule, controlPlaneTools, progress)
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{Etcd: paths[0], APIServer: paths[1]}, nil
}

// EnsureTool builds one program of the tools module (such as controller-gen)
// into the cache and returns its path.
func EnsureTool(name, pkg string, progress io.Writer) (string, error) {
	paths, err := ensureTools(controlPlaneModule, []toolBuild{{name, pkg, time.Minute, "", false}}, progress)
	if err != nil {
		return "", err
	}
	return paths[0], nil
}

// toolsCacheDir is the cache directory of a tools module:
// tools-<first 12 hex digits of sha256 of its go.sum>.
func toolsCacheDir(module string) (string, error) {
	sum, err := os.ReadFile(filepath.Join(RepoRoot(), module, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("reading the tools module %s: %w", module, err)
	}
	h := sha256.Sum256(sum)
	return filepath.Join(CacheDir(), "tools-"+hex.EncodeToString(h[:])[:12]), nil
}

// ensureTools builds the tools of module that are not in its cache
// directory yet and returns their paths, in order.
func ensureTools(module string, tools []toolBuild, progress io.Writer) ([]string, error) {
	dir, err := toolsCacheDir(module)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// One builder at a time: test packages run in parallel and must not
	// build the same nine-minute binary twice.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	var paths []string
	for _, t := range tools {
		out := filepath.Join(dir, t.name)
		paths = append(paths, out)
		ldflags := ""
		if t.kubeVersion {
			if ldflags, err = kubeVersionLDFlags(module); err != nil {
				return nil, err
			}
		}
		// The stamp file records the ldflags a binary was built with, so a
		// binary of an earlier recipe is built again.
		stamp := out + ".ldflags"
		if _, err := os.Stat(out); err == nil {
			if b, _ := os.ReadFile(stamp); string(b) == ldflags {
				continue
			}
		}
		if progress != nil {
			fmt.Fprintf(progress, "building %s from the Go module proxy (first run only, about %s on 2 cores)...\n", t.name, t.estimate)
		}
		start := time.Now()
		tmp := out + ".tmp"
		args := []string{"build", "-o", tmp}
		if t.tags != "" {
			args = append(args, "-tags", t.tags)
		}
		if ldflags != "" {
			args = append(args, "-ldflags", ldflags)
		}
		cmd := exec.Command("go", append(args, t.pkg)...)
		cmd.Dir = filepath.Join(RepoRoot(), module)
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %v\n%s", t.name, err, b)
		}
		if err := os.Rename(tmp, out); err != nil {
			return nil, err
		}
		if ldflags == "" {
			err = os.Remove(stamp)
			if os.IsNotExist(err) {
				err = nil
			}
		} else {
			err = os.WriteFile(stamp, []byte(ldflags), 0o644)
		}
		if err != nil {
			return nil, err
		}
		if progress != nil {
			fmt.Fprintf(progress, "built %s in %s\n", t.name, time.Since(start).Round(time.Second))
		}
	}
	return paths, nil
}

// CRIBinaries are the container runtime programs the CRI tests run.
type CRIBinaries struct {
	// Dir holds them all; containerd finds its shim on PATH.
	Dir                                 string
	Containerd, Shim, Ctr, Runc, Crictl string
}

var criTools = []toolBuild{
	{"containerd", "github.com/containerd/containerd/v2/cmd/containerd", 2 * time.Minute, "", false},
	{"containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", time.Minute, "", false},
	{"ctr", "github.com/containerd/containerd/v2/cmd/ctr", time.Minute, "", false},
	// runc's nsenter is C and its seccomp support links libseccomp, so
	// this needs gcc and libseccomp-dev; the kubelet gives every sandbox
	// the RuntimeDefault profile, which a runc without seccomp refuses.
	{"runc", "github.com/opencontainers/runc", time.Minute, "seccomp", false},
	{"crictl", "sigs.k8s.io/cri-tools/cmd/crictl", time.Minute, "", false},
}

// EnsureCRIBinaries builds containerd, its runc shim, ctr, runc and crictl
// from the Go module proxy (the test/tools/cri module pins them) the first
// time and reuses them afterwards, like EnsureControlPlaneBinaries.
func EnsureCRIBinaries(progress io.Writer) (CRIBinaries, error) {
	paths, err := ensureTools(criModule, criTools, progress)
	if err != nil {
		return CRIBinaries{}, err
	}
	return CRIBinaries{Dir: filepath.Dir(paths[0]), Containerd: paths[0], Shim: paths[1], Ctr: paths[2], Runc: paths[3], Crictl: paths[4]}, nil
}

// EnsureKubelet builds the kubelet of the test/tools/cri module (first run
// only; it is the largest build there, so only the kubelet test asks for
// it) and returns its path.
func EnsureKubelet(progress io.Writer) (string, error) {
	paths, err := ensureTools(criModule, []toolBuild{{"kubelet", "k8s.io/kubernetes/cmd/kubelet", 8 * time.Minute, "", true}}, progress)
	if err != nil {
		return "", err
	}
	return paths[0], nil
}

// ClusterBinaries are what a multi-node cluster runs beside the control
// plane and each node's kubelet.
type ClusterBinaries struct {
	ControllerManager, Scheduler, Kubectl string
}

var clusterTools = []toolBuild{
	{"kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager", 7 * time.Minute, "", true},
	{"kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler", 3 * time.Minute, "", true},
	{"kubectl", "k8s.io/kubernetes/cmd/kubectl", 3 * time.Minute, "", true},
}

// EnsureClusterBinaries builds kube-controller-manager, kube-scheduler and
// kubectl of the test/tools/cluster module (the release kube-apiserver and
// the kubelet are built from) the first time and reuses them afterwards.
func EnsureClusterBinaries(progress io.Writer) (ClusterBinaries, error) {
	paths, err := ensureTools(clusterModule, clusterTools, progress)
	if err != nil {
		return ClusterBinaries{}, err
	}
	return ClusterBinaries{ControllerManager: paths[0], Scheduler: paths[1], Kubectl: paths[2]}, nil
}

// kubeVersionLDFlags are the -X flags Kubernetes' build (hack/lib/version.sh)
// sets, from the k8s.io/kubernetes version module pins: its version, major
// and minor, and its commit time as the build date. The commit hash is not
// in the module proxy's answer, so gitCommit keeps its placeholder.
func kubeVersionLDFlags(module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}} {{.Time.UTC.Format \"2006-01-02T15:04:05Z\"}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(RepoRoot(), module)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("the k8s.io/kubernetes version of %s: %v", module, err)
	}
	var version, date string
	if _, err := fmt.Sscan(string(out), &version, &date); err != nil {
		return "", fmt.Errorf("the k8s.io/kubernetes version of %s: %q: %v", module, out, err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "v%d.%d.", &major, &minor); err != nil {
		return "", fmt.Errorf("the k8s.io/kubernetes version of %s: %q is not vMAJOR.MINOR.PATCH", module, version)
	}
	var flags []string
	for _, kv := range [][2]string{{"gitVersion", version}, {"gitMajor", fmt.Sprint(major)}, {"gitMinor", fmt.Sprint(minor)}, {"buildDate", date}} {
		for _, pkg := range []string{"k8s.io/client-go/pkg/version", "k8s.io/component-base/version"} {
			flags = append(flags, fmt.Sprintf("-X %s.%s=%s", pkg, kv[0], kv[1]))
		}
	}
	return strings.Join(flags, " "), nil
}
