package harness

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Cluster is a control plane as a cluster runs it: the API server with
// Node and RBAC authorization and the NodeRestriction admission plugin,
// kube-controller-manager and kube-scheduler under their own identities,
// and kubectl against it.
type Cluster struct {
	*ControlPlane
	Bin ClusterBinaries
	// Kube is an admin clientset.
	Kube kubernetes.Interface

	mu    sync.Mutex
	nodes []*ClusterNode
}

// Nodes are the nodes AddNode made.
func (c *Cluster) Nodes() []*ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes)
}

// Close removes the cluster's nodes, then stops the control plane.
func (c *Cluster) Close() {
	c.mu.Lock()
	nodes := c.nodes
	c.nodes = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(n.Close)
	}
	wg.Wait()
	c.Stop()
}

// StartCluster builds (first run only) and starts the cluster's control
// plane and waits until the controller manager works (it publishes the
// kube-root-ca.crt ConfigMap, which the DaemonSet's pods mount).
func StartCluster(ctx context.Context, log io.Writer) (c *Cluster, err error) {
	bins, err := EnsureClusterBinaries(log)
	if err != nil {
		return nil, err
	}
	cp, err := startControlPlane(ctx, log, controlPlaneOptions{authorization: "Node,RBAC", admission: "NodeRestriction", allowPrivileged: true, kubelets: true})
	if err != nil {
		return nil, err
	}
	c = &Cluster{ControlPlane: cp, Bin: bins}
	defer func() {
		if err != nil {
			cp.dumpLogs(log)
			cp.Stop()
			c = nil
		}
	}()
	if c.Kube, err = kubernetes.NewForConfig(cp.Admin); err != nil {
		return c, err
	}
	cm, err := c.identityKubeconfig("kube-controller-manager", "system:kube-controller-manager")
	if err != nil {
		return c, err
	}
	// No serving port: nothing probes it, and it would need its own certs.
	if err = cp.start("kube-controller-manager", bins.ControllerManager,
		"--kubeconfig="+cm, "--secure-port=0", "--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+cp.saKey, "--root-ca-file="+cp.CAFile,
		"--v=0",
	); err != nil {
		return c, err
	}
	sched, err := c.identityKubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return c, err
	}
	if err = cp.start("kube-scheduler", bins.Scheduler,
		"--kubeconfig="+sched, "--secure-port=0", "--leader-elect=false", "--v=0",
	); err != nil {
		return c, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := c.Kube.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return c, fmt.Errorf("kube-controller-manager did not publish kube-root-ca.crt: %v", err)
		}
		for _, p := range cp.procs {
			if !p.Running() {
				return c, fmt.Errorf("%s exited", p.Name)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return c, nil
}

// identityKubeconfig writes a kubeconfig with a client certificate for
// user (the CA signs it) and returns its path.
func (c *Cluster) identityKubeconfig(name, user string, groups ...string) (string, error) {
	cert, key, err := c.pki.issue(name, pkix.Name{CommonName: user, Organization: groups}, false)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, name+".kubeconfig")
	return path, WriteKubeconfig(path, c.Server, c.CAFile, &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key})
}

// Kubectl runs the real kubectl as the admin and returns its combined
// output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Bin.Kubectl, append([]string{"--kubeconfig", c.AdminKubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %v: %w\n%s", args, err, out)
	}
	return out, nil
}
