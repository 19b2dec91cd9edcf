package main

import (
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/state"
)

// sharedStanza is the stanza of a conflist a CRI runtime uses for every
// pod: no attachment of its own, the capability declared, and the pod's
// annotations in runtimeConfig (none when annotations is "").
func sharedStanza(annotations, extra string) []byte {
	s := `{"cniVersion":"1.1.0","name":"galactic","type":"galactic-bgp","capabilities":{"io.kubernetes.cri.pod-annotations":true}`
	if annotations != "" {
		s += `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{` + annotations + `}}`
	}
	if extra != "" {
		s += "," + extra
	}
	return []byte(s + "}")
}

const blueWeb = `"network.galactic.dev/vpc":"blue","network.galactic.dev/attachment":"web-0-net0","network.galactic.dev/vni":"10100","io.kubernetes.pod.name":"web-0"`

func TestAddUnderACRIRuntimeTakesTheAttachmentAndVNIFromThePod(t *testing.T) {
	e := newTestEnv(t, "get", "create", "list")
	e.record(t, state.Record{ContainerID: "c1", IfName: "eth0", VPC: "blue", Attachment: "web-0-net0", Addresses: []string{"10.20.0.5/24"}})
	a := args("c1", sharedStanza(blueWeb, `"prevResult":`+prevResult))
	a.IfName = "eth0"
	a.Args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=1234"
	if err := e.p.cmdAdd(a); err != nil {
		t.Fatal(err)
	}
	obj := e.api.Object(advName)
	if obj == nil || obj.Spec.VNI != 10100 || obj.Spec.VPC != "blue" || obj.Spec.Containers[0].ContainerID != "c1" {
		t.Fatalf("advertisement = %+v", obj)
	}
}

func TestTheStanzasVNIWinsOverThePods(t *testing.T) {
	e := newTestEnv(t, "get", "create", "list")
	if err := e.p.cmdAdd(args("c1", sharedStanza(blueWeb, `"vni":7,"prevResult":`+prevResult))); err != nil {
		t.Fatal(err)
	}
	if obj := e.api.Object(advName); obj == nil || obj.Spec.VNI != 7 {
		t.Fatalf("advertisement = %+v", obj)
	}
}

func TestAPodWithoutAnnotationsGetsCode7NamingTheAnnotationAndNoAPICall(t *testing.T) {
	e := newTestEnv(t)
	err := e.p.cmdAdd(args("c1", sharedStanza(`"io.kubernetes.pod.name":"web-0"`, `"prevResult":`+prevResult)))
	wantCode(t, err, types.ErrInvalidNetworkConfig, "annotate the pod with network.galactic.dev/vpc")
	err = e.p.cmdAdd(args("c1", sharedStanza(`"network.galactic.dev/vpc":"blue","network.galactic.dev/attachment":"web-0-net0","network.galactic.dev/vni":"99999999"`, `"prevResult":`+prevResult)))
	wantCode(t, err, types.ErrInvalidNetworkConfig, "pod annotation network.galactic.dev/vni: vni 99999999 is out of range")
}

func TestDelUnderACRIRuntimeReleasesThePodsEntry(t *testing.T) {
	e := newTestEnv(t, "get", "delete")
	seedEntries(e, v1alpha1.ContainerEntry{ContainerID: "c1", IfName: "net0", Netns: "/run/netns/c1"})
	if err := e.p.cmdDel(args("c1", sharedStanza(blueWeb, ""))); err != nil {
		t.Fatal(err)
	}
	if obj := e.api.Object(advName); obj != nil {
		t.Fatalf("advertisement left: %+v", obj)
	}
}

func TestStatusAndGCOfASharedConflistNeedNoAttachment(t *testing.T) {
	e := newTestEnv(t, "list")
	if err := e.p.cmdStatus(&skel.CmdArgs{StdinData: sharedStanza("", "")}); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	e = newTestEnv(t) // GC has no annotations, so it must not touch the API
	if err := e.p.cmdGC(&skel.CmdArgs{StdinData: sharedStanza("", `"cni.dev/valid-attachments":[]`)}); err != nil {
		t.Fatalf("GC: %v", err)
	}
}
