package bgp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

const (
	vpc    = "blue"
	ifName = "net0"
)

// cniStanza is galactic-cni with table routing (this kernel has no VRF) and
// handoff off, so several containers of one attachment may coexist.
func cniStanza(attachment string, addrs ...string) map[string]any {
	if addrs == nil {
		addrs = []string{}
	}
	return map[string]any{
		"type": "galactic-cni", "vpc": vpc, "attachment": attachment, "mode": "tap",
		"routing": "table", "addresses": addrs,
		"handoff": map[string]any{"enabled": false},
	}
}

func bgpStanza(attachment string) map[string]any {
	return map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": attachment}
}

// writeNetwork stores a conflist named after the attachment with the given
// plugins.
func writeNetwork(t *testing.T, node *harness.Node, attachment string, plugins ...map[string]any) {
	t.Helper()
	node.WriteConflist(t, map[string]any{"cniVersion": "1.1.0", "name": attachment, "plugins": plugins})
}

// writeChain stores the network of the attachment: galactic-cni then galactic-bgp.
func writeChain(t *testing.T, node *harness.Node, attachment string, addrs ...string) {
	t.Helper()
	writeNetwork(t, node, attachment, cniStanza(attachment, addrs...), bgpStanza(attachment))
}

func run(t *testing.T, node *harness.Node, verb, network string, c *harness.Netns) string {
	t.Helper()
	out, err := node.CNITool(verb, network, c, ifName)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func cid(c *harness.Netns) string { return harness.ContainerID(c.Path) }

// advertisement returns node's advertisement of the attachment, nil when
// there is none.
func advertisement(t *testing.T, env *harness.Env, attachment, node string) *v1alpha1.BGPAdvertisement {
	t.Helper()
	obj, err := env.API.BGPAdvertisements(harness.Namespace).Get(context.Background(), names.Advertisement(vpc, attachment, node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// advertisementsOf lists every node's advertisement of a VPC's attachment.
func advertisementsOf(t *testing.T, env *harness.Env, vpcName, attachment string) []v1alpha1.BGPAdvertisement {
	t.Helper()
	list, err := env.API.BGPAdvertisements(harness.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: names.AttachmentSelector(vpcName, attachment)})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// seed creates an advertisement as another node would have.
func seed(t *testing.T, env *harness.Env, vpcName, attachment, node string, prefixes ...v1alpha1.Prefix) *v1alpha1.BGPAdvertisement {
	t.Helper()
	obj := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement(vpcName, attachment, node), Labels: names.AdvertisementLabels(vpcName, attachment, node)},
		Spec: v1alpha1.BGPAdvertisementSpec{
			VPC: vpcName, Attachment: attachment, Node: node, Prefixes: prefixes,
			Containers: []v1alpha1.ContainerEntry{{ContainerID: "elsewhere", IfName: ifName, Netns: "/var/run/netns/elsewhere", Prefixes: prefixes}},
		},
	}
	created, err := env.API.BGPAdvertisements(harness.Namespace).Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.API.BGPAdvertisements(harness.Namespace).Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created
}

func entryIDs(obj *v1alpha1.BGPAdvertisement) []string {
	var ids []string
	for _, c := range obj.Spec.Containers {
		ids = append(ids, c.ContainerID)
	}
	slices.Sort(ids)
	return ids
}

func ids(cs ...*harness.Netns) []string {
	var out []string
	for _, c := range cs {
		out = append(out, cid(c))
	}
	slices.Sort(out)
	return out
}

// logLine is one galactic-bgp log line.
type logLine struct {
	Level       string `json:"level"`
	Verb        string `json:"verb"`
	ContainerID string `json:"containerID"`
	Outcome     string `json:"outcome"`
	Conflicts   int    `json:"conflicts"`
	APIRequests int    `json:"apiRequests"`
	Code        int    `json:"code"`
	Error       string `json:"error"`
	Reason      string `json:"reason"`
}

// bgpLog returns galactic-bgp's lines in the node log.
func bgpLog(t *testing.T, node *harness.Node) []logLine {
	t.Helper()
	f, err := os.Open(node.Settings.LogFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []logLine
	s := bufio.NewScanner(f)
	for s.Scan() {
		var probe struct {
			Plugin string `json:"plugin"`
		}
		if json.Unmarshal(s.Bytes(), &probe) != nil || probe.Plugin != "galactic-bgp" {
			continue
		}
		var l logLine
		if err := json.Unmarshal(s.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return lines
}

// lastLog is galactic-bgp's latest line for verb and container.
func lastLog(t *testing.T, node *harness.Node, verb string, c *harness.Netns) logLine {
	t.Helper()
	lines := bgpLog(t, node)
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i].Verb == verb && lines[i].ContainerID == cid(c) {
			return lines[i]
		}
	}
	t.Fatalf("no galactic-bgp %s line for %s in %s", verb, cid(c), node.Settings.LogFile)
	return logLine{}
}

// hostInterfaceExists reports whether the attachment's tap is on the node.
func hostInterfaceExists(node *harness.Node, attachment string) bool {
	_, err := node.Run("ip", "link", "show", names.HostInterface(names.ModeTap, vpc, attachment))
	return err == nil
}

// cniCode returns err's CNI error, failing t when it is not one.
func cniCode(t *testing.T, err error) *types.Error {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CNI error, got %v", err)
	}
	return e
}
