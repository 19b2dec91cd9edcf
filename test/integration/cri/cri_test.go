package cri

import (
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAnAnnotatedPodIsAttachedByContainerdAndStopAndRemoveReleaseIt(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	n.attachment(t, "web-0-net0", "10.20.0.5")
	id := n.runPod(t, "web-0", map[string]string{netconf.AnnotationAttachment: "{pod}-net0", netconf.AnnotationMode: "veth"})

	st, err := n.ctd.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "SANDBOX_READY" || st.Netns == "" {
		t.Fatalf("sandbox %s: state %q netns %q", id, st.State, st.Netns)
	}
	if l := n.hostLink(t, "web-0-net0"); l == nil {
		t.Fatal("containerd's ADD created no host interface")
	}
	a := n.advertisement(t, "web-0-net0")
	if a == nil {
		t.Fatal("containerd's ADD published no advertisement")
	}
	want := v1alpha1.ContainerEntry{ContainerID: id, IfName: "eth0", Netns: st.Netns, Prefixes: []v1alpha1.Prefix{"10.20.0.5/32"}}
	if len(a.Spec.Containers) != 1 {
		t.Fatalf("advertisement entries %+v, want one for sandbox %s", a.Spec.Containers, id)
	}
	got := a.Spec.Containers[0]
	if got.ContainerID != want.ContainerID || got.IfName != want.IfName || got.Netns != want.Netns || !slices.Equal(got.Prefixes, want.Prefixes) ||
		got.AttachmentUID != string(n.objects["web-0-net0"].UID) {
		t.Fatalf("advertisement entry %+v, want containerd's sandbox ID and netns path: %+v", got, want)
	}
	if a.Spec.VNI != n.objects["web-0-net0"].Status.VNI || !slices.Equal(a.Spec.Prefixes, want.Prefixes) {
		t.Fatalf("advertisement spec vni %d prefixes %v", a.Spec.VNI, a.Spec.Prefixes)
	}
	l := n.lease(t, "web-0-net0")
	if l.HolderIdentity != names.Holder("node-a", id) || got.HolderGeneration != int64(l.LeaseTransitions) {
		t.Fatalf("lease %+v, entry generation %d: want held by the sandbox with its token", l, got.HolderGeneration)
	}
	// The workload end is in the sandbox with its address.
	out, err := n.node.Run("nsenter", "--net="+st.Netns, "ip", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(out, "10.20.0.5/16") {
		t.Fatalf("eth0 in the sandbox: %v: %s", err, out)
	}

	n.crictl(t, "stopp", id)
	n.assertReleased(t, "web-0-net0")
	n.crictl(t, "rmp", id)
	n.assertReleased(t, "web-0-net0")
	if m := n.podNetnsMounts(t); len(m) != 0 {
		t.Fatalf("pod netns left: %v", m)
	}
}

func TestAPodWithoutAnnotationsFailsWithCode7NamingTheAnnotationAndLeavesNothing(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	_, err := n.ctd.RunPod(harnessPod("plain-0", map[string]string{"team": "web"}))
	if err == nil {
		t.Fatal("a pod naming no attachment started")
	}
	msg := err.Error()
	t.Logf("crictl runp failed as it should: %s", msg)
	for _, want := range []string{"no attachment is named", "annotate the pod with " + netconf.AnnotationAttachment} {
		if !strings.Contains(msg, want) {
			t.Fatalf("crictl's error does not carry galactic's message (%q): %s", want, msg)
		}
	}
	if code := n.addErrorCode(t); code != 7 {
		t.Fatalf("galactic-cni's ADD logged code %d, want 7 (invalid network config)", code)
	}
	if out := n.crictl(t, "pods", "-q"); out != "" {
		t.Fatalf("pods left: %s", out)
	}
	if l := n.galacticLinks(t); len(l) != 0 {
		t.Fatalf("host interfaces left: %v", l)
	}
	if r := n.records(t); len(r) != 0 {
		t.Fatalf("records left: %+v", r)
	}
	if m := n.podNetnsMounts(t); len(m) != 0 {
		t.Fatalf("pod netns left: %v", m)
	}
}

func TestStoppingAPodWhoseNetnsIsGoneStillReleasesItsAttachment(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	n.attachment(t, "web-0-net0", "10.20.0.5")
	id := n.runPod(t, "web-0", annotations("web-0-net0"))
	st, err := n.ctd.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	// The netns pin vanishes under containerd (an operator's cleanup, a
	// reboot of the state dir): its DEL then comes with an empty CNI_NETNS.
	if err := syscall.Unmount(st.Netns, syscall.MNT_DETACH); err != nil {
		t.Fatalf("unmounting the sandbox netns %s: %v", st.Netns, err)
	}
	n.crictl(t, "stopp", id)
	n.assertReleased(t, "web-0-net0")
	n.crictl(t, "rmp", id)
	n.assertReleased(t, "web-0-net0")
}

func TestAPodChoosingItsNetworkOrNamingAnotherNamespacesAttachmentNeverStartsAndTheOwnerIsUntouched(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	n.attachment(t, "web-0-net0", "10.20.0.5")
	owner := n.runPod(t, "web-0", annotations("web-0-net0"))
	before := n.attached(t, "web-0-net0")
	for _, tc := range []struct {
		name string
		pod  harness.PodSpec
		say  []string
	}{
		{"another namespace's attachment", harness.PodSpec{Name: "intruder", Namespace: "mallory", Annotations: annotations("web-0-net0")},
			[]string{"VPCAttachment mallory/web-0-net0", "does not exist in namespace mallory"}},
		{"a chosen VPC and address", harness.PodSpec{Name: "intruder", Annotations: map[string]string{
			netconf.AnnotationAttachment: "web-0-net0", netconf.AnnotationVPC: vpc, netconf.AnnotationAddresses: "10.20.0.5/16"}},
			[]string{"pod annotation network.galactic.dev/vpc is refused", "spec.vpc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.ctd.RunPod(tc.pod)
			if err == nil {
				t.Fatal("the pod started")
			}
			for _, want := range tc.say {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("crictl's error does not carry galactic's message (%q): %v", want, err)
				}
			}
			if code := n.addErrorCode(t); code != 7 {
				t.Errorf("galactic-cni's ADD logged code %d, want 7 (invalid network config)", code)
			}
		})
	}
	after := n.attached(t, "web-0-net0")
	if after.advertisementVersion != before.advertisementVersion || after.ifIndex != before.ifIndex || after.lease != before.lease {
		t.Fatalf("the owner's attachment changed:\nbefore %+v\nafter  %+v", before, after)
	}
	if err := n.node.Ping(netip.MustParseAddr("10.20.0.5")); err != nil {
		t.Errorf("the node does not reach the owner's pod: %v", err)
	}
	n.crictl(t, "stopp", owner)
	n.assertReleased(t, "web-0-net0")
}

func TestAPodWithTwoAttachmentsGetsEth0AndNet1UnderContainerdAndStopReleasesBoth(t *testing.T) {
	n := newCRINode(t, "node-a", true)
	n.attachment(t, "db-0-net0", "10.20.0.6")
	n.attachment(t, "db-0-net1", "10.20.1.6")
	id := n.runPod(t, "db-0", map[string]string{netconf.AnnotationAttachments: "{pod}-net0,{pod}-net1", netconf.AnnotationMode: "veth"})
	st, err := n.ctd.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ att, ifName, addr string }{{"db-0-net0", "eth0", "10.20.0.6/16"}, {"db-0-net1", "net1", "10.20.1.6/16"}} {
		out, err := n.node.Run("nsenter", "--net="+st.Netns, "ip", "-o", "addr", "show", "dev", c.ifName)
		if err != nil || !strings.Contains(out, c.addr) {
			t.Fatalf("%s in the sandbox: %v: %s", c.ifName, err, out)
		}
		a := n.advertisement(t, c.att)
		if a == nil || len(a.Spec.Containers) != 1 || a.Spec.Containers[0].IfName != c.ifName || a.Spec.Containers[0].ContainerID != id {
			t.Fatalf("%s's advertisement: %+v", c.att, a)
		}
		if l := n.lease(t, c.att); l.HolderIdentity != names.Holder("node-a", id) {
			t.Fatalf("%s's lease: %+v", c.att, l)
		}
	}
	n.crictl(t, "stopp", id)
	n.assertReleased(t, "db-0-net0")
	n.assertReleased(t, "db-0-net1")
	n.crictl(t, "rmp", id)
}
