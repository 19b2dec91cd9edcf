package objects

import (
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAPodNamingAnotherNamespacesAttachmentOrChoosingItsNetworkIsRefusedAndTouchesNothing(t *testing.T) {
	env := setup(t)
	node := env.NewNode(t, "node-a")
	podNetwork(t, node, true)
	tenantA := env.NewTenant(t, "tenant-a", "blue", "10.20.0.0/16")
	env.NewTenant(t, "mallory", "blue", "10.20.0.0/16")
	web := tenantA.Attach(t, "web", v1alpha1.ReclaimDelete, "10.20.0.5")
	// An attachment the controller cannot make Ready: its VPC does not exist.
	tenantA.AttachUnready(t, "lost", "green", v1alpha1.ReasonVPCNotFound)

	owner := newPod(t, "tenant-a", "web-0", map[string]string{"network.galactic.dev/attachment": "web"})
	owner.mustAdd(t, node)
	lease, adv := leaseOf(t, env, web), advertisementOf(t, env, web, "node-a")
	if lease == nil || adv == nil {
		t.Fatalf("tenant-a's pod holds no lease (%v) or advertisement (%v)", lease, adv)
	}
	if err := node.Ping(addr(web)); err != nil {
		t.Fatalf("the node does not reach tenant-a's pod: %v", err)
	}
	kernel, recs := snapshot(t, node), records(t, node)

	for _, tc := range []struct {
		name        string
		ns          string
		annotations map[string]string
		code        uint
		say         []string
	}{
		{"mallory names tenant-a's attachment", "mallory", map[string]string{"network.galactic.dev/attachment": "web"},
			types.ErrInvalidNetworkConfig, []string{"VPCAttachment mallory/web", "does not exist in namespace mallory"}},
		{"a pod chooses the VPC", "tenant-a", map[string]string{"network.galactic.dev/attachment": "web", "network.galactic.dev/vpc": "blue"},
			types.ErrInvalidNetworkConfig, []string{"pod annotation network.galactic.dev/vpc is refused", "spec.vpc"}},
		{"a pod chooses its addresses", "mallory", map[string]string{"network.galactic.dev/vpc": "blue", "network.galactic.dev/attachment": "web", "network.galactic.dev/addresses": "10.20.0.5/16"},
			types.ErrInvalidNetworkConfig, []string{"is refused"}},
		{"a pod chooses the VNI", "tenant-a", map[string]string{"network.galactic.dev/attachment": "web", "network.galactic.dev/vni": "100"},
			types.ErrInvalidNetworkConfig, []string{"network.galactic.dev/vni is refused", "status.vni"}},
		{"a pod lifts its source check", "tenant-a", map[string]string{"network.galactic.dev/attachment": "web", "network.galactic.dev/allowed-source-prefixes": "0.0.0.0/0"},
			types.ErrInvalidNetworkConfig, []string{"network.galactic.dev/allowed-source-prefixes is refused", "spec.allowedSourcePrefixes"}},
		{"a pod names an attachment that is not Ready", "tenant-a", map[string]string{"network.galactic.dev/attachment": "lost"},
			types.ErrTryAgainLater, []string{"VPCAttachment tenant-a/lost is not Ready", "VPCNotFound"}},
		{"a pod names nothing", "tenant-a", map[string]string{},
			types.ErrInvalidNetworkConfig, []string{"annotate the pod with network.galactic.dev/attachment"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			intruder := newPod(t, tc.ns, "intruder", tc.annotations)
			_, err := intruder.add(node)
			e := cniError(t, err)
			if e.Code != tc.code {
				t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, tc.code)
			}
			for _, s := range tc.say {
				if !strings.Contains(e.Msg, s) {
					t.Errorf("the error does not say %q: %s", s, e.Msg)
				}
			}
			// The runtime deletes a sandbox whose ADD failed.
			intruder.del(t, node)
		})
	}

	if now := leaseOf(t, env, web); now.ResourceVersion != lease.ResourceVersion {
		t.Errorf("tenant-a's lease was written: %+v -> %+v", leaseRecord(lease), leaseRecord(now))
	}
	if now := advertisementOf(t, env, web, "node-a"); now.ResourceVersion != adv.ResourceVersion {
		t.Errorf("tenant-a's advertisement was written: %+v -> %+v", adv.Spec, now.Spec)
	}
	if now := snapshot(t, node); now != kernel {
		t.Errorf("the refused ADDs changed the node's links, rules or routes:\nbefore:\n%s\nafter:\n%s", kernel, now)
	}
	if now := records(t, node); !reflect.DeepEqual(now, recs) {
		t.Errorf("the refused ADDs changed the node records: %+v -> %+v", recs, now)
	}
	if err := node.Ping(addr(web)); err != nil {
		t.Errorf("after the refusals the node does not reach tenant-a's pod: %v", err)
	}
	owner.check(t, node)
	owner.del(t, node)
}

func TestAVMMsStanzaNamesAVPCAttachmentAndANodeThatRequiresObjectsRefusesInlineOnes(t *testing.T) {
	env := setup(t)
	node := env.NewNode(t, "node-a")
	tn := env.NewTenant(t, "tenant-a", "blue", "10.20.0.0/16", "fd20::/48")
	vm := tn.Attach(t, "vm-0", v1alpha1.ReclaimDelete, "10.20.0.5", "fd20::5")
	node.WriteConflist(t, map[string]any{"cniVersion": "1.1.0", "name": "vm-0", "plugins": []any{
		map[string]any{"type": "galactic-cni", "namespace": "tenant-a", "attachment": "vm-0", "mode": "tap", "routing": "table", "handoff": handoffConf},
		map[string]any{"type": "galactic-bgp", "namespace": "tenant-a", "attachment": "vm-0"},
	}})
	c := harness.NewContainer(t)
	cni := harness.LibCNI{Node: node, Network: "vm-0"}
	if _, err := cni.Add(ctx, harness.RuntimeConf(c, "net0")); err != nil {
		t.Fatal(err)
	}
	vpc, att := dataplane(vm)
	tap := names.HostInterface(names.ModeTap, vpc, att)
	out, err := node.Run("ip", "-d", "link", "show", tap)
	if err != nil || !strings.Contains(out, "alias galactic:"+vpc+"/"+att+"/"+string(vm.UID)) {
		t.Fatalf("tap %s should carry the alias with the attachment's UID: %v\n%s", tap, err, out)
	}
	l := leaseRecord(leaseOf(t, env, vm))
	if l.Identity.UID != string(vm.UID) || l.Identity.Namespace != "tenant-a" || l.HolderIdentity != names.Holder("node-a", harness.ContainerID(c.Path)) {
		t.Fatalf("lease %+v", l)
	}
	adv := advertisementOf(t, env, vm, "node-a")
	if adv == nil || adv.Spec.VNI != vm.Status.VNI || adv.Labels[v1alpha1.LabelAttachmentUID] != string(vm.UID) || len(adv.Spec.Containers) != 1 ||
		adv.Spec.Containers[0].AttachmentUID != string(vm.UID) || len(adv.Spec.Prefixes) != 2 {
		t.Fatalf("advertisement %+v", adv)
	}
	if err := cni.Check(ctx, harness.RuntimeConf(c, "net0")); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := cni.Del(ctx, harness.RuntimeConf(c, "net0")); err != nil {
		t.Fatal(err)
	}
	if len(records(t, node)) != 0 || advertisementOf(t, env, vm, "node-a") != nil || leaseRecord(leaseOf(t, env, vm)).HolderIdentity != "" {
		t.Fatal("DEL left a record, the advertisement or the hold")
	}

	// A node that requires objects refuses the inline stanza, naming the setting.
	other := env.NewNode(t, "node-b")
	other.Settings.RequireAttachmentObjects = true
	writeSettings(t, other)
	other.WriteConflist(t, map[string]any{"cniVersion": "1.1.0", "name": "inline", "plugins": []any{
		map[string]any{"type": "galactic-cni", "vpc": "blue", "attachment": "vm-9", "mode": "tap", "routing": "table", "addresses": []string{"10.20.0.9/24"}, "handoff": map[string]any{"enabled": false}},
	}})
	before := snapshot(t, other)
	_, err = harness.LibCNI{Node: other, Network: "inline"}.Add(ctx, harness.RuntimeConf(harness.NewContainer(t), "net0"))
	if e := cniError(t, err); e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "requireAttachmentObjects") {
		t.Fatalf("want code 7 naming requireAttachmentObjects, got %d %s", e.Code, e.Msg)
	}
	if after := snapshot(t, other); after != before || len(records(t, other)) != 0 {
		t.Fatalf("the refused inline ADD changed the node:\n%s\n%s", before, after)
	}
}
