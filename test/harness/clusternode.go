package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/settings"
)

// KubernetesServiceIP is the kubernetes Service's ClusterIP, the first
// address of the API server's --service-cluster-ip-range. Pods dial it
// through KUBERNETES_SERVICE_HOST.
const KubernetesServiceIP = "10.96.0.1"

// nodeOverlays are the host trees a cluster node writes into (the
// DaemonSet's hostPaths, the kubelet's fixed paths). In the node's mount
// namespace each is an overlay of this machine's tree with an upper dir of
// the node's own, so what a node installs lands in ClusterNode.Root and
// never in this machine's /etc/cni/net.d.
var nodeOverlays = []string{"/etc", "/opt", "/var/lib", "/var/log"}

// ClusterNode is one node of a Cluster: a network namespace on the fabric
// and a mount namespace of its own, with containerd and a kubelet
// registered to the API server under the node's identity.
//
// No kube-proxy runs: the node's loopback holds KubernetesServiceIP and a
// relay there on port 443 reaches the API server, which is what kube-proxy
// would make of the kubernetes Service for a host-network pod.
type ClusterNode struct {
	*Node
	// Underlay is the node's fabric address and its InternalIP.
	Underlay netip.Addr
	// Root holds what the node wrote into its overlaid trees:
	// Root/etc/cni/net.d is its /etc/cni/net.d.
	Root    string
	Ctd     *Containerd
	Kubelet *Kubelet

	holder *Process
	svc    *Forwarder
	// unroute takes the node off the API server's egress proxy.
	unroute   func()
	closeOnce sync.Once
}

// HostPath is where the node's file p (an absolute path in the node) is
// on this machine, if the node wrote it.
func (n *ClusterNode) HostPath(p string) string { return filepath.Join(n.Root, p) }

// MountNS is the path of the node's mount namespace.
func (n *ClusterNode) MountNS() string { return fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Pid()) }

// Exec runs a command in the node's network and mount namespaces and
// returns its combined output.
func (n *ClusterNode) Exec(name string, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path, "--mount=" + n.MountNS(), "--", name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s on %s: %v: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// AddNode makes node name, attaches it to fabric, starts its containerd
// with the image archive imported (the image `make image` writes; no
// registry) and its kubelet, and returns once the Node object exists.
// The cluster's Close removes it, also when AddNode fails.
func (c *Cluster) AddNode(ctx context.Context, fabric *Fabric, imageArchive, name string) (n *ClusterNode, err error) {
	dir, err := MkdirTemp("gcn-")
	if err != nil {
		return nil, err
	}
	nn, err := CreateNetns("n")
	if err != nil {
		RemoveDir(dir)
		return nil, err
	}
	n = &ClusterNode{Node: &Node{Netns: nn, Name: name, Dir: dir, ConfigPath: settings.DefaultConfig, CNIPath: "/opt/cni/bin",
		Settings: settings.Node{NodeName: name, Kubeconfig: settings.DefaultKubeconfig, Namespace: Namespace,
			StateDir: settings.DefaultStateDir, LogFile: settings.DefaultLogFile}}, Root: filepath.Join(dir, "root")}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	if n.fwd, err = NewForwarder(nn.Path, c.Port); err != nil {
		return n, err
	}
	if out, err := nn.Run("ip", "addr", "add", KubernetesServiceIP+"/32", "dev", "lo"); err != nil {
		return n, fmt.Errorf("the kubernetes Service address on %s: %v %s", name, err, out)
	}
	// Forwarding is a node prerequisite (docs/install/installation.md).
	if out, err := nn.Run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return n, fmt.Errorf("enabling forwarding on %s: %v %s", name, err, out)
	}
	n.svc = &Forwarder{path: nn.Path, port: c.Port, listen: KubernetesServiceIP + ":443", conns: map[net.Conn]struct{}{}}
	if err = n.svc.Resume(); err != nil {
		return n, err
	}
	if n.Underlay, err = fabric.AttachNode(n.Node); err != nil {
		return n, err
	}
	if err = n.startMountNS(); err != nil {
		return n, err
	}
	if n.Ctd, err = newContainerd(n.Node, c.Dir, containerdOptions{mountNS: n.MountNS(), hostPaths: true}); err != nil {
		return n, err
	}
	if err = n.ImportImage(imageArchive); err != nil {
		return n, err
	}
	kc, err := c.identityKubeconfig("kubelet-"+name, "system:node:"+name, "system:nodes")
	if err != nil {
		return n, err
	}
	taint := VPCNodeTaint()
	c.egress.route(n.Underlay, nn.Path)
	n.unroute = func() { c.egress.unroute(n.Underlay) }
	if n.Kubelet, err = newKubelet(n.Ctd, kubeletServing{address: n.Underlay.String(), clientCA: c.CAFile}, []string{
		"--kubeconfig=" + kc, "--node-ip=" + n.Underlay.String(),
		"--node-labels=" + VPCNodeLabel + "=true",
		"--register-with-taints=" + taint.Key + "=" + taint.Value + ":" + string(taint.Effect),
	}); err != nil {
		return n, err
	}
	for {
		_, err := c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return n, nil
		}
		if !apierrors.IsNotFound(err) {
			return n, err
		}
		if !n.Kubelet.Running() {
			return n, fmt.Errorf("the kubelet of %s exited:\n%s", name, n.Kubelet.LogTail(40))
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("node %s did not register: %w\n%s", name, ctx.Err(), n.Kubelet.LogTail(40))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startMountNS starts the process that holds the node's mount namespace:
// the overlays, a tmpfs of its own at /run/netns (the pods' network
// namespaces) and shared propagation, as on a systemd host, so that
// mountPropagation: HostToContainer sees new pod namespaces.
func (n *ClusterNode) startMountNS() error {
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range nodeOverlays {
		upper, work := filepath.Join(n.Root, d), filepath.Join(n.Dir, "work", d)
		fmt.Fprintf(&script, "mkdir -p %s %s\nmount -t overlay galactic-node -o lowerdir=%s,upperdir=%s,workdir=%s %s\n", upper, work, d, upper, work, d)
	}
	script.WriteString("mount -t tmpfs -o mode=0755 galactic-node /run/netns\nmount --make-rshared /\necho ready\nexec sleep infinity\n")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script.String())
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = w, &stderr
	n.holder, err = StartProcess("the mount namespace of "+n.Name, cmd, "")
	w.Close()
	if err != nil {
		return err
	}
	line, _ := bufio.NewReader(r).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		n.holder.Kill()
		return fmt.Errorf("the mount namespace of %s: %s", n.Name, stderr.String())
	}
	return nil
}

// Close stops the kubelet and containerd (removing their pods), ends the
// mount namespace and removes the node's namespace and files.
func (n *ClusterNode) Close() {
	n.closeOnce.Do(func() {
		var errs []error
		if n.unroute != nil {
			n.unroute()
		}
		if n.Kubelet != nil {
			n.Kubelet.Close()
		}
		if n.Ctd != nil {
			errs = append(errs, n.Ctd.Close())
		}
		if n.holder != nil {
			n.holder.Kill()
		}
		if n.svc != nil {
			n.svc.Close()
		}
		if n.fwd != nil {
			n.fwd.Close()
		}
		n.Netns.Delete()
		errs = append(errs, RemoveDir(n.Dir))
		if err := errors.Join(errs...); err != nil {
			fmt.Fprintf(os.Stderr, "closing node %s: %v\n", n.Name, err)
		}
	})
}
