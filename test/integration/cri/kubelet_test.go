package cri

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/test/harness"
)

// staticPod is a static pod manifest naming its VPCAttachment in an
// annotation; its one container runs the pause program of the local
// sandbox image.
func staticPod(name, attachment string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  annotations:
    %s: %s
    %s: veth
spec:
  containers:
  - name: app
    image: %s
    imagePullPolicy: Never
    command: ["/pause"]
`, name, podNamespace, netconf.AnnotationAttachment, attachment, netconf.AnnotationMode, harness.SandboxImage)
}

func TestAStaticPodOfARealKubeletIsAttachedAndItsDeletionReleasesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kubelet")
	}
	n := newCRINode(t, "node-a", true)
	k := harness.StartKubelet(t, n.ctd)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log:\n%s", k.LogTail(80))
		}
	})
	const att = "static-0-net0"
	n.attachment(t, att, "10.20.0.8")
	if err := k.WriteStaticPod("static-0", staticPod("static-0", att)); err != nil {
		t.Fatal(err)
	}
	var id string
	harness.Eventually(t, time.Minute, "the kubelet's static pod sandbox ready", func() error {
		if !k.Running() {
			t.Fatalf("the kubelet exited:\n%s", k.LogTail(80))
		}
		out, err := n.ctd.Crictl("pods", "--name", "static-0", "--state", "ready", "-q")
		id = strings.TrimSpace(out)
		if err == nil && id != "" {
			return nil
		}
		return fmt.Errorf("crictl pods: %q %v", out, err)
	})
	harness.Eventually(t, time.Minute, "the static pod's container running", func() error {
		out, err := n.ctd.Crictl("ps", "--pod", id, "--state", "running", "-q")
		if err == nil && strings.TrimSpace(out) != "" {
			return nil
		}
		return fmt.Errorf("crictl ps: %q %v", out, err)
	})
	st, err := n.ctd.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	a := n.advertisement(t, att)
	if a == nil || len(a.Spec.Containers) != 1 || a.Spec.Containers[0].ContainerID != id || a.Spec.Containers[0].Netns != st.Netns {
		t.Fatalf("advertisement of the static pod: %+v (sandbox %s netns %s)", a, id, st.Netns)
	}
	if n.hostLink(t, att) == nil || n.lease(t, att).HolderIdentity != names.Holder("node-a", id) {
		t.Fatalf("static pod: host interface %v, lease %+v", n.hostLink(t, att) != nil, n.lease(t, att))
	}

	if err := k.RemoveStaticPod("static-0"); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "the static pod's attachment released after its deletion", func() error {
		a, l, h := n.advertisement(t, att), n.hostLink(t, att), n.lease(t, att).HolderIdentity
		if a == nil && l == nil && h == "" {
			return nil
		}
		return fmt.Errorf("advertisement %v, host interface %v, lease holder %q", a != nil, l != nil, h)
	})
	n.assertReleased(t, att)
}
