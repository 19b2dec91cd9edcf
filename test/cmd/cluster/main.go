// Command cluster runs the harness's three-node cluster for a person:
// `cluster up` starts it in the background (control plane, fabric with FRR
// as reflector, three nodes with containerd and a kubelet each, the
// shipped manifests applied through an overlay) and prints the kubeconfig
// and kubectl to use; `cluster down` removes it. `make cluster` and `make
// cluster-down` run these (docs/contributing/development.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

// stateDir holds the running cluster's pid, log, kubeconfig and image.
var stateDir = filepath.Join(os.TempDir(), "galactic-cluster")

var nodeNames = []string{"node-a", "node-b", "node-c"}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cluster up|down")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up()
	case "down":
		err = down()
	case "serve":
		err = serve()
	default:
		err = fmt.Errorf("unknown command %q: want up or down", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func path(name string) string { return filepath.Join(stateDir, name) }

// running is the pid of the serving process, 0 when none runs.
func running() int {
	b, err := os.ReadFile(path("pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// up starts serve in its own session, so the cluster outlives make, and
// waits until it is ready or has failed.
func up() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root for network and mount namespaces (sudo make cluster)")
	}
	if pid := running(); pid != 0 {
		fmt.Printf("a cluster is already running (pid %d)\n", pid)
		return printUsage()
	}
	_ = os.RemoveAll(stateDir)
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.Create(path("cluster.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, "serve")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Printf("starting the cluster (log: %s; the first run builds the control plane, containerd and the kubelet)...\n", path("cluster.log"))
	for {
		if _, err := os.Stat(path("ready")); err == nil {
			fmt.Printf("cluster ready in %s\n", time.Since(start).Round(time.Second))
			return printUsage()
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(path("cluster.log"))
			return fmt.Errorf("the cluster did not come up (%v):\n%s", err, b)
		case <-time.After(time.Second):
		}
	}
}

func printUsage() error {
	b, err := os.ReadFile(path("ready"))
	if err != nil {
		return err
	}
	fmt.Print(string(b))
	return nil
}

// serve brings the cluster up, writes the ready file and keeps it until
// SIGTERM, SIGINT or SIGHUP, which also end a bring-up half-way. Every
// process it started dies with it, however it ends; what a signal or a
// failure leaves is removed on the way out.
func serve() (err error) {
	if err := os.WriteFile(path("pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	stopped, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	defer harness.RemoveLeftovers()
	ctx, cancel := context.WithTimeout(stopped, 45*time.Minute)
	defer cancel()
	c, err := harness.StartCluster(ctx, os.Stdout)
	if err != nil {
		return err
	}
	defer c.Close()
	fabric, err := harness.CreateClusterFabric()
	if err != nil {
		return err
	}
	defer fabric.Close()
	imageDir := path("image")
	archive, ref, err := harness.MakeImage(imageDir)
	if err != nil {
		return err
	}
	fmt.Printf("image %s\n", ref)
	var shells []string
	for _, name := range nodeNames {
		n, err := c.AddNode(ctx, fabric, archive, name)
		if err != nil {
			return err
		}
		fmt.Printf("%s: underlay %s, its files under %s\n", name, n.Underlay, n.Root)
		shells = append(shells, fmt.Sprintf("  %s: nsenter --net=%s --mount=%s", name, n.Path, n.MountNS()))
	}
	overlay := path("overlay")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		return err
	}
	if err := harness.WriteOverlay(overlay, ref, fabric); err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, "apply", "--server-side", "-k", overlay); err != nil {
		return err
	} else {
		fmt.Print(string(out))
	}
	if err := c.WaitDaemonSetReady(ctx, len(nodeNames)); err != nil {
		return err
	}
	if err := c.WaitControllerReady(ctx, 2); err != nil {
		return err
	}
	kubeconfig := path("kubeconfig")
	b, err := os.ReadFile(c.AdminKubeconfig)
	if err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, b, 0o600); err != nil {
		return err
	}
	ready := fmt.Sprintf(`galactic on three nodes (%s); the DaemonSet and galactic-controller are ready.
  export KUBECONFIG=%s
  %s get pods -A -o wide
overlay applied: %s (image %s, built into %s)
a shell on a node (its network and mount namespaces, as root):
%s
FRR, the reflector, runs in network namespace %s; stop everything with: make cluster-down
`, strings.Join(nodeNames, ", "), kubeconfig, c.Bin.Kubectl, overlay, ref, imageDir, strings.Join(shells, "\n"), fabric.Name)
	if err := os.WriteFile(path("ready"), []byte(ready), 0o644); err != nil {
		return err
	}
	<-stopped.Done()
	fmt.Println("stopping the cluster")
	return nil
}

// down stops the serving process, which removes the cluster, and waits
// for it to finish.
func down() error {
	pid := running()
	if pid == 0 {
		fmt.Println("no cluster is running")
		_ = os.RemoveAll(stateDir)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster (pid %d) did not stop within 3 minutes; its log is %s", pid, path("cluster.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = os.RemoveAll(stateDir)
	fmt.Println("cluster removed")
	return nil
}
