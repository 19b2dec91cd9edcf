package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MakeImage runs `make image` with its output in dir (and make's
// variables vars, such as SOURCE_DATE_EPOCH=...) and returns the OCI
// archive and the image's reference by digest.
func MakeImage(dir string, vars ...string) (archive, ref string, err error) {
	cmd := exec.Command("make", append([]string{"image", "BIN=" + dir}, vars...)...)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make image: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "galactic-image.ref"))
	if err != nil {
		return "", "", err
	}
	return filepath.Join(dir, "galactic-image.tar"), strings.TrimSpace(string(b)), nil
}

// CreateClusterFabric is the fabric of a harness cluster: FRR as the
// nodes' iBGP reflector in the AS of the shipped router config, helping
// graceful restart for as long as that config's restartSeconds, as the
// DaemonSet expects of a node's peers (a router replaced by a rollout
// exits without withdrawing).
func CreateClusterFabric() (*Fabric, error) {
	return CreateFabric(FabricOptions{ASN: 65010, GracefulRestartSeconds: 120})
}

// ClusterWithdrawHoldSeconds is the cluster overlay's withdrawHoldSeconds.
const ClusterWithdrawHoldSeconds = 30

// WriteOverlay writes into dir a kustomize overlay of installer/manifests
// that sets the image (by digest) and the fabric's values: the router's
// AS and reflector, its withdrawal hold (ClusterWithdrawHoldSeconds), and
// table routing in the conflist (this kernel has no VRF). Nothing else of
// the shipped manifests changes.
func WriteOverlay(dir, imageRef string, f *Fabric) error {
	rel, err := filepath.Rel(dir, filepath.Join(RepoRoot(), "installer", "manifests"))
	if err != nil {
		return err
	}
	name, digest, ok := strings.Cut(imageRef, "@")
	if !ok {
		return fmt.Errorf("image reference %q is not by digest", imageRef)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: galactic.example/galactic
  newName: %s
  digest: %s
patches:
- path: fabric.yaml
- path: controller.yaml
`, rel, name, digest)
	asn := f.Options.ASN
	// FRR keeps no graceful-restart copy of EVPN routes, so only the
	// receivers' withdrawal hold bridges a galactic pod's replacement in
	// a rolling update; on this loaded 2-core machine that replacement
	// (pod teardown, init container, router start, RIB sync) can take
	// longer than the shipped 10 s.
	fabric := fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: galactic-router
  namespace: galactic-system
data:
  router.json: |
    {
      "asn": %d,
      "routeTargetASN": 65000,
      "listenPort": -1,
      "gracefulRestart": { "enabled": true, "restartSeconds": 120 },
      "withdrawHoldSeconds": %d,
      "peers": [ { "address": "%s", "asn": %d, "holdSeconds": 9, "keepaliveSeconds": 3 } ],
      "metricsAddress": "127.0.0.1:9655"
    }
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: galactic-cni
  namespace: galactic-system
data:
  10-galactic.conflist: |
    {
      "cniVersion": "1.1.0",
      "name": "galactic",
      "plugins": [
        { "type": "galactic-cni", "mode": "veth", "routing": "table", "mtu": 1450,
          "handoff": { "enabled": true, "waitSeconds": 30, "leaseSeconds": 60 },
          "capabilities": { "io.kubernetes.cri.pod-annotations": true } },
        { "type": "galactic-bgp",
          "capabilities": { "io.kubernetes.cri.pod-annotations": true } }
      ]
    }
`, asn, ClusterWithdrawHoldSeconds, f.RR, asn)
	for file, data := range map[string]string{"kustomization.yaml": k, "fabric.yaml": fabric, "controller.yaml": controllerOverlay} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// WaitDaemonSetReady waits until the galactic-node DaemonSet has an
// updated, ready pod on every node it wants, want of them, and its
// rollout is complete.
func (c *Cluster) WaitDaemonSetReady(ctx context.Context, want int) error {
	var last string
	for {
		ds, err := c.Kube.AppsV1().DaemonSets(Namespace).Get(ctx, "galactic-node", metav1.GetOptions{})
		if err == nil {
			s := ds.Status
			last = fmt.Sprintf("generation %d observed %d, desired %d, updated %d, ready %d, available %d",
				ds.Generation, s.ObservedGeneration, s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberReady, s.NumberAvailable)
			if s.ObservedGeneration >= ds.Generation && int(s.DesiredNumberScheduled) == want &&
				int(s.UpdatedNumberScheduled) == want && int(s.NumberReady) == want && int(s.NumberAvailable) == want {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			pods, _ := c.Kubectl(context.Background(), "-n", Namespace, "get", "pods", "-o", "wide")
			return fmt.Errorf("the galactic-node DaemonSet is not ready: %s\n%s", last, pods)
		case <-time.After(time.Second):
		}
	}
}

// ImportImage imports an image archive into the node's containerd.
func (n *ClusterNode) ImportImage(archive string) error {
	if out, err := n.Ctd.ctr("images", "import", "--snapshotter", "native", archive); err != nil {
		return fmt.Errorf("importing %s on %s: %v: %s", archive, n.Name, err, out)
	}
	return nil
}
