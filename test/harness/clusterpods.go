package harness

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
)

// Env is a view of the cluster for the Env helpers that read galactic's
// objects (advertisements, leases); it has no binaries and no nodes.
func (c *Cluster) Env() (*Env, error) {
	api, err := client.New(c.Admin)
	if err != nil {
		return nil, err
	}
	return &Env{CP: c.ControlPlane, Kube: c.Kube, API: api}, nil
}

// PodNetns is the network namespace of the ready sandbox of pod
// namespace/name on the node, reached through its pause process (the
// sandbox's own netns file is in the node's mount namespace).
func (n *ClusterNode) PodNetns(namespace, name string) (*Netns, error) {
	out, err := n.Ctd.Crictl("pods", "--namespace", namespace, "--name", "^"+name+"$", "--state", "ready", "-q")
	if err != nil {
		return nil, err
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return nil, fmt.Errorf("%s has %d ready sandboxes of %s/%s", n.Name, len(ids), namespace, name)
	}
	st, err := n.Ctd.InspectPod(ids[0])
	if err != nil {
		return nil, err
	}
	if st.Pid == 0 {
		return nil, fmt.Errorf("sandbox %s of %s/%s reports no pid", ids[0], namespace, name)
	}
	return &Netns{Name: "pod-" + name, Path: fmt.Sprintf("/proc/%d/ns/net", st.Pid)}, nil
}

// VPCPod is a VPC workload for a cluster node: the VPCAttachment of its
// namespace it names in an annotation (veth), the dedicated nodes'
// selector and toleration, and one container running the pause program of
// the nodes' local image.
func VPCPod(name, attachment string) *corev1.Pod {
	taint := VPCNodeTaint()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Annotations: map[string]string{
			netconf.AnnotationAttachment: attachment, netconf.AnnotationMode: names.ModeVeth,
		}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{VPCNodeLabel: "true"},
			Tolerations:                   []corev1.Toleration{{Key: taint.Key, Operator: corev1.TolerationOpEqual, Value: taint.Value, Effect: taint.Effect}},
			TerminationGracePeriodSeconds: new(int64),
			Containers:                    []corev1.Container{{Name: "app", Image: SandboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"/pause"}}},
		},
	}
}
