package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Kubelet is a standalone kubelet (no API server of its own: it runs the
// static pods of its manifest dir) using a harness containerd as its
// runtime, inside the same node network namespace.
type Kubelet struct {
	Ctd *Containerd
	// Dir is its root dir; ManifestDir holds the static pods.
	Dir, ManifestDir string
	LogPath          string

	mu      sync.Mutex
	proc    *Process
	created []string
}

// kubeletFixedPaths are where the kubelet writes outside its root dir:
// the device plugin socket dir and the container log links.
var kubeletFixedPaths = []string{"/var/lib/kubelet", "/var/log/containers"}

// StartKubelet builds the kubelet (first run only) and starts it against
// ctd; t's cleanup stops it before ctd's cleanup runs.
func StartKubelet(t testing.TB, ctd *Containerd) *Kubelet {
	t.Helper()
	k, err := NewKubelet(ctd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// NewKubelet is StartKubelet outside tests; Close undoes it.
func NewKubelet(ctd *Containerd) (*Kubelet, error) { return newKubelet(ctd, kubeletServing{}, nil) }

// kubeletServing is how a kubelet serves its API (logs, exec,
// port-forward).
type kubeletServing struct {
	// address is where it listens: a registered node's address, which the
	// API server dials; 127.0.0.1 when empty (a standalone kubelet, which
	// nobody calls).
	address string
	// clientCA authenticates callers by their certificate, and the API
	// server authorizes them (webhook), as on kubeadm's nodes; empty lets
	// anyone in (a standalone kubelet has no API server to ask).
	clientCA string
}

// newKubelet starts a kubelet; extra flags (a kubeconfig to register
// with, node IP, labels, taints) follow the standalone ones.
func newKubelet(ctd *Containerd, serving kubeletServing, extra []string) (*Kubelet, error) {
	bin, err := EnsureKubelet(os.Stderr)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{Ctd: ctd, Dir: filepath.Join(ctd.Dir, "kubelet"), LogPath: filepath.Join(ctd.Dir, "kubelet.log")}
	k.ManifestDir = filepath.Join(k.Dir, "manifests")
	for _, d := range []string{k.ManifestDir, filepath.Join(k.Dir, "pods-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(k.Dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(k.config(port, serving)), 0o644); err != nil {
		return nil, err
	}
	// The kubelet wants its cgroup root to exist in every hierarchy.
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, ctd.cgroupParent()), 0o755); err != nil {
			return nil, err
		}
	}
	// Paths the kubelet uses whatever its root dir: what did not exist
	// before it is removed after it.
	for _, p := range kubeletFixedPaths {
		// In a mount namespace of its own they are the node's, not ours.
		if ctd.opts.mountNS != "" {
			break
		}
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			k.created = append(k.created, p)
		}
	}
	args := append(ctd.opts.nsenter(ctd.Node), bin,
		"--config", cfg, "--root-dir", filepath.Join(k.Dir, "root"), "--cert-dir", filepath.Join(k.Dir, "pki"),
		"--hostname-override", ctd.Node.Name, "--v", "2")
	cmd := exec.Command("nsenter", append(args, extra...)...)
	if k.proc, err = StartProcess("the kubelet of "+ctd.Node.Name, cmd, k.LogPath); err != nil {
		return nil, err
	}
	return k, nil
}

// config is the kubelet's configuration: standalone, cgroupfs on this
// cgroup v1 host (failCgroupV1 off) with its pod cgroups under the
// containerd's own cgroup parent, no node allocatable enforcement, no swap
// check, and evictions off so a busy test machine evicts nothing.
func (k *Kubelet) config(port int, serving kubeletServing) string {
	q := strconv.Quote
	address := serving.address
	if address == "" {
		address = "127.0.0.1"
	}
	auth := `authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
`
	if serving.clientCA != "" {
		auth = `authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ` + q(serving.clientCA) + `
authorization:
  mode: Webhook
`
	}
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: ` + q(k.ManifestDir) + `
fileCheckFrequency: 1s
syncFrequency: 5s
containerRuntimeEndpoint: ` + q("unix://"+k.Ctd.Socket) + `
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: ` + q(k.Ctd.cgroupParent()) + `
enforceNodeAllocatable: []
failSwapOn: false
address: ` + q(address) + `
port: ` + strconv.Itoa(port) + `
readOnlyPort: 0
healthzPort: 0
podLogsDir: ` + q(filepath.Join(k.Dir, "pods-logs")) + `
` + auth + `evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
`
}

// WriteStaticPod puts a static pod manifest (YAML or JSON) in place.
func (k *Kubelet) WriteStaticPod(name, manifest string) error {
	return os.WriteFile(filepath.Join(k.ManifestDir, name+".yaml"), []byte(manifest), 0o644)
}

// RemoveStaticPod deletes a static pod's manifest: the kubelet then stops
// and removes the pod.
func (k *Kubelet) RemoveStaticPod(name string) error {
	return os.Remove(filepath.Join(k.ManifestDir, name+".yaml"))
}

// Running reports whether the kubelet process is still running.
func (k *Kubelet) Running() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.proc != nil && k.proc.Running()
}

// LogTail is the last n lines of the kubelet's log.
func (k *Kubelet) LogTail(n int) string { return fileTail(k.LogPath, n) }

// Close stops the kubelet; the pods it started stay for containerd's
// cleanup, which removes them.
func (k *Kubelet) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc == nil {
		return
	}
	k.proc.Stop(syscall.SIGTERM, 20*time.Second)
	k.proc = nil
	for _, m := range mountsUnder(k.Dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	// Log links to this kubelet's pods, then what it created.
	links, _ := filepath.Glob("/var/log/containers/*.log")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, k.Dir+"/") {
			_ = os.Remove(l)
		}
	}
	for _, p := range k.created {
		_ = os.RemoveAll(p)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
