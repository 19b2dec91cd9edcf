// Package cri runs the galactic chain under a real container runtime:
// containerd, driven through CRI by the real crictl, invokes the plugins
// for pod sandboxes on a node whose one conflist serves every pod.
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

const vpc = "blue"

var ctx = context.Background()

// conflist is the one network config of a node under containerd: both
// stanzas declare the pod-annotations capability and name no attachment.
func conflist(handoffEnabled bool) map[string]any {
	caps := map[string]bool{netconf.CapabilityPodAnnotations: true}
	return map[string]any{
		"cniVersion": "1.1.0",
		"name":       "galactic",
		"plugins": []any{
			map[string]any{"type": "galactic-cni", "routing": "table", "capabilities": caps,
				"handoff": map[string]any{"enabled": handoffEnabled, "waitSeconds": 90, "leaseSeconds": 60}},
			map[string]any{"type": "galactic-bgp", "capabilities": caps},
		},
	}
}

// podNamespace is where the tests' pods and their VPCAttachments are.
const podNamespace = "default"

// annotations attach a pod to its VPCAttachment attachment as a veth.
func annotations(attachment string) map[string]string {
	return map[string]string{netconf.AnnotationAttachment: attachment, netconf.AnnotationMode: names.ModeVeth}
}

// criNode is a node with containerd running on it.
type criNode struct {
	env  *harness.Env
	node *harness.Node
	ctd  *harness.Containerd
	// objects are the VPCAttachments of the test, by name, in tenant's VPC.
	objects map[string]*v1alpha1.VPCAttachment
	tenant  *harness.Tenant
}

// attachment makes VPCAttachment name in VPC blue of podNamespace
// requesting addrs, made Ready by galactic-controller; the test's end
// deletes it.
func (n *criNode) attachment(t *testing.T, name string, addrs ...string) {
	t.Helper()
	if n.tenant == nil {
		n.env.StartController(t)
		n.tenant = n.env.NewTenant(t, podNamespace, vpc, "10.20.0.0/16")
	}
	n.objects[name] = n.tenant.Attach(t, name, "", addrs...)
}

// dataplane are the node's names of attachment.
func (n *criNode) dataplane(t *testing.T, attachment string) (string, string) {
	t.Helper()
	a := n.objects[attachment]
	if a == nil {
		t.Fatalf("the test made no VPCAttachment %s", attachment)
	}
	return a.Status.Dataplane.VPC, a.Status.Dataplane.Attachment
}

func newCRINode(t *testing.T, name string, handoffEnabled bool) *criNode {
	t.Helper()
	env := harness.Setup(t)
	node := env.NewNode(t, name)
	node.WriteConflist(t, conflist(handoffEnabled))
	n := &criNode{env: env, node: node, objects: map[string]*v1alpha1.VPCAttachment{}}
	n.ctd = env.StartContainerd(t, node)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log:\n%s", n.ctd.LogTail(60))
			if data, err := os.ReadFile(node.Settings.LogFile); err == nil {
				t.Logf("galactic log:\n%s", data)
			}
		}
	})
	return n
}

func (n *criNode) runPod(t *testing.T, name string, ann map[string]string) string {
	t.Helper()
	id, err := n.ctd.RunPod(harness.PodSpec{Name: name, Annotations: ann})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (n *criNode) crictl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.ctd.Crictl(args...)
	if err != nil {
		t.Fatalf("crictl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// advertisement returns this node's advertisement of attachment, nil when
// there is none.
func (n *criNode) advertisement(t *testing.T, attachment string) *v1alpha1.BGPAdvertisement {
	t.Helper()
	dv, da := n.dataplane(t, attachment)
	a, err := n.env.API.BGPAdvertisements(harness.Namespace).Get(ctx, names.Advertisement(dv, da, n.node.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// lease returns the handoff record of attachment (zero when there is no
// lease).
func (n *criNode) lease(t *testing.T, attachment string) handoff.Record {
	t.Helper()
	l, err := n.env.API.Leases(harness.Namespace).Get(ctx, names.Lease(n.dataplane(t, attachment)), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return handoff.Record{}
	}
	if err != nil {
		t.Fatal(err)
	}
	return handoff.RecordFromSpec(l.Spec)
}

// hostLink is the node's host interface of attachment, nil when absent.
func (n *criNode) hostLink(t *testing.T, attachment string) netlink.Link {
	t.Helper()
	dv, da := n.dataplane(t, attachment)
	var link netlink.Link
	err := n.node.Do(func() error {
		l, err := netlink.LinkByName(names.HostInterface(names.ModeVeth, dv, da))
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil
		}
		link = l
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return link
}

// galacticLinks lists the galactic host interfaces on the node.
func (n *criNode) galacticLinks(t *testing.T) []string {
	t.Helper()
	var out []string
	err := n.node.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if name := l.Attrs().Name; names.IsHostInterface(names.ModeVeth, name) || names.IsHostInterface(names.ModeTap, name) {
				out = append(out, name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (n *criNode) records(t *testing.T) []state.Record {
	t.Helper()
	recs, err := state.NewStore(n.node.Settings.StateDir).List()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// assertReleased fails t unless attachment has no advertisement, host
// interface or record on the node and its lease has no holder.
func (n *criNode) assertReleased(t *testing.T, attachment string) {
	t.Helper()
	var left []string
	if a := n.advertisement(t, attachment); a != nil {
		left = append(left, fmt.Sprintf("advertisement %s with %d entries", a.Name, len(a.Spec.Containers)))
	}
	if l := n.hostLink(t, attachment); l != nil {
		left = append(left, "host interface "+l.Attrs().Name)
	}
	for _, r := range n.records(t) {
		if r.AttachmentName == attachment {
			left = append(left, "record of "+r.ContainerID)
		}
	}
	if h := n.lease(t, attachment).HolderIdentity; h != "" {
		left = append(left, "lease held by "+h)
	}
	if len(left) > 0 {
		t.Fatalf("attachment %s should be released, but has: %s", attachment, strings.Join(left, ", "))
	}
}

// podNetnsMounts lists the netns mounts containerd holds for pods.
func (n *criNode) podNetnsMounts(t *testing.T) []string {
	t.Helper()
	var out []string
	matches, _ := filepath.Glob(filepath.Join(n.ctd.Dir, "state", "*", "netns", "*"))
	out = append(out, matches...)
	return out
}

func harnessPod(name string, ann map[string]string) harness.PodSpec {
	return harness.PodSpec{Name: name, Annotations: ann}
}

// cniInvocations lists the galactic plugin processes running now, as
// "<plugin> <CNI_COMMAND> <CNI_CONTAINERID>".
func cniInvocations() []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || !strings.HasPrefix(filepath.Base(exe), "galactic-") {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		var cmd, id string
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "CNI_COMMAND="); ok {
				cmd = v
			}
			if v, ok := strings.CutPrefix(kv, "CNI_CONTAINERID="); ok {
				id = v
			}
		}
		if cmd != "" {
			out = append(out, filepath.Base(exe)+" "+cmd+" "+id)
		}
	}
	return out
}

// logVerbs counts the galactic log's lines per verb (ADD, DEL, ...).
func (n *criNode) logVerbs(t *testing.T) map[string]int {
	t.Helper()
	data, err := os.ReadFile(n.node.Settings.LogFile)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		var l struct {
			Msg  string `json:"msg"`
			Verb string `json:"verb"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == l.Verb && l.Verb != "" {
			counts[l.Verb]++
		}
	}
	return counts
}

// addErrorCode is the CNI error code of galactic-cni's last failed ADD in
// the node log (crictl shows the message, not the code); 0 if none failed.
func (n *criNode) addErrorCode(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile(n.node.Settings.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	code := 0
	for _, line := range strings.Split(string(data), "\n") {
		var l struct {
			Plugin, Verb, Outcome string
			Code                  int
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Plugin == "galactic-cni" && l.Verb == "ADD" && l.Outcome == "error" {
			code = l.Code
		}
	}
	return code
}
