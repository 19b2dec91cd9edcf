package harness

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// controllerOverlay runs the controller Deployment on a harness cluster,
// whose every node is dedicated to VPC workloads: there a pod on the pod
// network would have to name an attachment, so the controller uses the
// node's network, tolerates the dedicated nodes' taint and stays off
// nodes without a kubelet.
const controllerOverlay = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: galactic-controller
  namespace: galactic-system
spec:
  template:
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      nodeSelector:
        ` + VPCNodeLabel + `: "true"
      tolerations:
      - key: ` + VPCNodeLabel + `
        operator: Exists
        effect: NoSchedule
`

// WaitControllerReady waits until the galactic-controller Deployment has
// want ready replicas of its current template and one of them leads.
func (c *Cluster) WaitControllerReady(ctx context.Context, want int) error {
	var last string
	for {
		d, err := c.Kube.AppsV1().Deployments(Namespace).Get(ctx, "galactic-controller", metav1.GetOptions{})
		if err == nil {
			s := d.Status
			last = fmt.Sprintf("generation %d observed %d, updated %d, ready %d, available %d", d.Generation, s.ObservedGeneration, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas)
			if s.ObservedGeneration >= d.Generation && int(s.UpdatedReplicas) == want && int(s.ReadyReplicas) == want && int(s.AvailableReplicas) == want {
				l, err := c.Kube.CoordinationV1().Leases(Namespace).Get(ctx, "galactic-controller", metav1.GetOptions{})
				if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
					return nil
				}
				last += "; no leader yet"
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			pods, _ := c.Kubectl(context.Background(), "-n", Namespace, "get", "pods", "-o", "wide", "-l", "app.kubernetes.io/name=galactic-controller")
			return fmt.Errorf("the galactic-controller Deployment is not ready: %s\n%s", last, pods)
		case <-time.After(time.Second):
		}
	}
}
