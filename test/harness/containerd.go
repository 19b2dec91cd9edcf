package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Containerd is a containerd serving CRI inside a node's network namespace,
// with its own root, state, socket and config: the CNI plugins it runs are
// the freshly built ones, its CNI config dir is the node's net.d, and its
// sandbox image is the local pause image, so it never pulls.
type Containerd struct {
	Node *Node
	Bin  CRIBinaries
	// Dir holds config.toml, root/, state/, the sockets and containerd.log.
	Dir    string
	Socket string
	// LogPath is containerd's log, kept across restarts.
	LogPath string

	opts containerdOptions
	mu   sync.Mutex
	proc *Process
}

// containerdOptions are what a cluster node changes: containerd joins the
// node's mount namespace and uses the host paths a DaemonSet installs
// into (/opt/cni/bin, /etc/cni/net.d, netns under /var/run/netns).
type containerdOptions struct {
	// mountNS is a mount namespace path (/proc/<pid>/ns/mnt); empty: the
	// test's own.
	mountNS string
	// hostPaths uses the default CNI dirs and netns dir.
	hostPaths bool
}

var (
	imageOnce sync.Once
	imagePath string
	imageErr  error
)

// StartContainerd starts containerd for node; t's cleanup removes every
// pod it runs, stops it and its shims and removes its files and mounts.
// The node's conflist should be written first: containerd loads net.d at
// start (and again when it changes).
func (e *Env) StartContainerd(t testing.TB, node *Node) *Containerd {
	t.Helper()
	c, err := e.NewContainerd(node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("stopping containerd: %v", err)
		}
	})
	return c
}

// NewContainerd is StartContainerd for programs outside tests; Close
// undoes it.
func (e *Env) NewContainerd(node *Node) (*Containerd, error) {
	return newContainerd(node, e.BinDir, containerdOptions{})
}

// newContainerd starts containerd for node with the plugins of binDir
// (unless o.hostPaths) and the pause image built there.
func newContainerd(node *Node, binDir string, o containerdOptions) (*Containerd, error) {
	bin, err := EnsureCRIBinaries(os.Stderr)
	if err != nil {
		return nil, err
	}
	imageOnce.Do(func() { imagePath, imageErr = BuildSandboxImage(binDir) })
	if imageErr != nil {
		return nil, imageErr
	}
	// Short: unix socket paths have a 108-byte limit.
	dir, err := MkdirTemp("gctd-")
	if err != nil {
		return nil, err
	}
	c := &Containerd{Node: node, Bin: bin, Dir: dir, Socket: filepath.Join(dir, "c.sock"), LogPath: filepath.Join(dir, "containerd.log"), opts: o}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(c.config(binDir)), 0o644); err != nil {
		RemoveDir(dir)
		return nil, err
	}
	// Its pods and shims are not its children: only Close removes them.
	track("containerd "+dir, "containerd's pods and shims under "+dir, func() { _ = c.Close() })
	if err := c.Start(); err != nil {
		c.Close()
		return nil, err
	}
	if out, err := c.ctr("images", "import", "--snapshotter", "native", imagePath); err != nil {
		c.Close()
		return nil, fmt.Errorf("importing the sandbox image: %v: %s", err, out)
	}
	return c, nil
}

// config is containerd's config: version 3, CRI with cgroupfs (this host
// has cgroup v1 and the tests no systemd), the native snapshotter (no
// overlay mounts to leak) and everything else under Dir.
func (c *Containerd) config(pluginDir string) string {
	q := strconv.Quote
	d := func(name string) string { return q(filepath.Join(c.Dir, name)) }
	confDir, underState := filepath.Join(c.Node.Dir, "net.d"), "true"
	if c.opts.hostPaths {
		pluginDir, confDir, underState = "/opt/cni/bin", "/etc/cni/net.d", "false"
	}
	return `version = 3
root = ` + d("root") + `
state = ` + d("state") + `
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = ` + q(c.Socket) + `

[ttrpc]
  address = ` + q(c.Socket+".ttrpc") + `

[plugins."io.containerd.internal.v1.opt"]
  path = ` + d("opt") + `

# ctr's import unpacks through the transfer service, for these only.
[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/` + runtime.GOARCH + `"
    snapshotter = "native"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = ` + q(SandboxImage) + `

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  netns_mounts_under_state_dir = ` + underState + `
  # Where lowering oom_score_adj is refused (unprivileged hosts), keep
  # sandboxes at containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [` + q(pluginDir) + `]
    conf_dir = ` + q(confDir) + `
    max_conf_num = 1
    use_internal_loopback = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = ` + q(c.Bin.Runc) + `
        Root = ` + d("runc") + `
        SystemdCgroup = false
`
}

// Start runs containerd in the node's network namespace (nsenter keeps
// the host's mount namespace, so the test sees the netns mounts containerd
// makes) with the node's settings in its environment, which containerd
// passes on to the CNI plugins. It returns once CRI answers.
func (c *Containerd) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		return fmt.Errorf("containerd is already running")
	}
	cmd := exec.Command("nsenter", append(c.opts.nsenter(c.Node), c.Bin.Containerd, "--config", filepath.Join(c.Dir, "config.toml"), "--log-level", "info")...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "PATH=") }),
		"PATH="+c.Bin.Dir+":"+os.Getenv("PATH"))
	cmd.Env = append(cmd.Env, c.Node.Environ()...)
	// The shims it starts make process groups of their own: they outlive
	// it as they do under systemd, and Close removes them.
	p, err := StartProcess("containerd on "+c.Node.Name, cmd, c.LogPath)
	if err != nil {
		return err
	}
	c.proc = p
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := c.crictl(10*time.Second, "version"); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not serve CRI within a minute: %v\n%s", err, c.LogTail(40))
		}
		select {
		case <-p.Done():
			return fmt.Errorf("containerd exited at start:\n%s", c.LogTail(40))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nsenter is nsenter's arguments up to the program: the node's netns and
// the mount namespace, if any.
func (o containerdOptions) nsenter(n *Node) []string {
	args := []string{"--net=" + n.Path}
	if o.mountNS != "" {
		args = append(args, "--mount="+o.mountNS)
	}
	return append(args, "--")
}

// Stop stops containerd (SIGTERM, then SIGKILL after 30 s) and leaves its
// shims and pods running, as a daemon restart does.
func (c *Containerd) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return
	}
	c.proc.Stop(syscall.SIGTERM, 30*time.Second)
	c.proc = nil
}

// Restart stops and starts containerd.
func (c *Containerd) Restart() error {
	c.Stop()
	return c.Start()
}

// Close removes every pod (stop, remove), stops containerd, kills shims
// that are left and removes Dir with whatever is still mounted under it.
func (c *Containerd) Close() error {
	untrack("containerd " + c.Dir)
	var errs []string
	c.mu.Lock()
	running := c.proc != nil
	c.mu.Unlock()
	if running {
		if out, err := c.Crictl("rmp", "--all", "--force"); err != nil {
			errs = append(errs, fmt.Sprintf("removing the pods: %v: %s", err, out))
		}
	}
	c.Stop()
	for _, pid := range c.shims() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Pods' cgroups are gone with their shims; their parent is ours.
	for _, d := range c.cgroupDirs() {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Sprintf("removing cgroup %s: %v", d, err))
		}
	}
	// The shims keep their sockets in /run/containerd/s whatever the
	// config; the directories go when nothing else uses them.
	_ = os.Remove("/run/containerd/s")
	_ = os.Remove("/run/containerd")
	for _, m := range mountsUnder(c.Dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Sprintf("unmounting %s: %v", m, err))
		}
	}
	if err := RemoveDir(c.Dir); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// cgroupParent is the cgroup (cgroupfs driver) the pods of this containerd
// go under, one per instance so that cleanup removes exactly its own.
func (c *Containerd) cgroupParent() string { return "/" + filepath.Base(c.Dir) }

// cgroupDirs are the cgroup directories under cgroupParent in every
// hierarchy, deepest first (the kubelet makes a tree there).
func (c *Containerd) cgroupDirs() []string {
	var dirs []string
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, c.cgroupParent()), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
	return dirs
}

// cgroupHierarchies are the cgroup v1 hierarchies (and the unified one).
func cgroupHierarchies() []string {
	var out []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if e.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// shims are the pids of the runc shims serving this containerd: they name
// its socket in their command line.
func (c *Containerd) shims() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "containerd-shim-runc-v2" && slices.Contains(args, c.Socket) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// LogTail is the last n lines of containerd's log.
func (c *Containerd) LogTail(n int) string { return fileTail(c.LogPath, n) }

// Crictl runs the real crictl against this containerd and returns its
// combined output. Requests may take two minutes (an ADD waiting for a
// handoff lease does).
func (c *Containerd) Crictl(args ...string) (string, error) {
	return c.crictl(2*time.Minute, args...)
}

func (c *Containerd) crictl(timeout time.Duration, args ...string) (string, error) {
	cfg := filepath.Join(c.Dir, "crictl.yaml")
	if _, err := os.Stat(cfg); err != nil {
		ep := "unix://" + c.Socket
		if err := os.WriteFile(cfg, []byte("runtime-endpoint: "+ep+"\nimage-endpoint: "+ep+"\n"), 0o644); err != nil {
			return "", err
		}
	}
	cmd := exec.Command(c.Bin.Crictl, append([]string{"--config", cfg, "--timeout", timeout.String()}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return strings.TrimSpace(stdout.String()), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

func (c *Containerd) ctr(args ...string) (string, error) {
	out, err := exec.Command(c.Bin.Ctr, append([]string{"--address", c.Socket, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

// PodSpec is what a test says about a pod sandbox.
type PodSpec struct {
	Name, Namespace, UID string
	Annotations          map[string]string
}

// RunPod runs `crictl runp` for the pod and returns the sandbox ID, or the
// error with crictl's output.
func (c *Containerd) RunPod(p PodSpec) (string, error) {
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	if p.UID == "" {
		p.UID = p.Namespace + "-" + p.Name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	cfg, _ := json.Marshal(map[string]any{
		"metadata":      map[string]any{"name": p.Name, "namespace": p.Namespace, "uid": p.UID, "attempt": 0},
		"annotations":   p.Annotations,
		"log_directory": filepath.Join(c.Dir, "pods", p.UID),
		"linux":         map[string]any{"cgroup_parent": c.cgroupParent()},
	})
	f, err := os.CreateTemp(c.Dir, "pod-*.json")
	if err != nil {
		return "", err
	}
	_, err = f.Write(cfg)
	f.Close()
	if err != nil {
		return "", err
	}
	out, err := c.Crictl("runp", f.Name())
	if err != nil {
		return "", fmt.Errorf("crictl runp %s: %v", p.Name, err)
	}
	return out, nil
}

// PodStatus is the part of `crictl inspectp` the tests read.
type PodStatus struct {
	ID    string
	State string
	// Netns is the path of the sandbox's network namespace.
	Netns string
	// Pid is the sandbox's pause process.
	Pid int
}

// InspectPod reads a sandbox's state and netns path.
func (c *Containerd) InspectPod(id string) (PodStatus, error) {
	out, err := c.Crictl("inspectp", id)
	if err != nil {
		return PodStatus{}, fmt.Errorf("crictl inspectp %s: %v: %s", id, err, out)
	}
	var v struct {
		Status struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"status"`
		Info struct {
			Pid         int `json:"pid"`
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct {
						Type string `json:"type"`
						Path string `json:"path"`
					} `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return PodStatus{}, fmt.Errorf("crictl inspectp %s: %v: %s", id, err, out)
	}
	s := PodStatus{ID: v.Status.ID, State: v.Status.State, Pid: v.Info.Pid}
	for _, ns := range v.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			s.Netns = ns.Path
		}
	}
	return s, nil
}

// Condition is one of the runtime's status conditions (`crictl info`).
type Condition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// NetworkReady is the NetworkReady condition `crictl info` reports.
func (c *Containerd) NetworkReady() (Condition, error) {
	out, err := c.Crictl("info")
	if err != nil {
		return Condition{}, fmt.Errorf("crictl info: %v: %s", err, out)
	}
	var v struct {
		Status struct {
			Conditions []Condition `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return Condition{}, fmt.Errorf("crictl info: %v: %s", err, out)
	}
	for _, cond := range v.Status.Conditions {
		if cond.Type == "NetworkReady" {
			return cond, nil
		}
	}
	return Condition{}, fmt.Errorf("crictl info reports no NetworkReady condition: %s", out)
}
