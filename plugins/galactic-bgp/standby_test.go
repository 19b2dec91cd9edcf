package main

import (
	"testing"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/state"
)

func TestAStandbyAddPublishesAStandbyEntryAndLeavesTheSourcesAdvertisement(t *testing.T) {
	// No "list" or "delete": the source node's advertisement is not looked at.
	e := newTestEnv(t, "get", "create")
	source := e.api.Seed(&v1alpha1.BGPAdvertisement{
		ObjectMeta: metaFor("blue", "web-0-net0", "node-b"),
		Spec:       v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "web-0-net0", Node: "node-b"},
	})
	e.record(t, state.Record{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0",
		Addresses: []string{"10.20.0.5/24"}, Standby: true})
	if err := e.p.cmdAdd(args("c1", stanza(`"vni":10100,"announce":"whenAvailable","prevResult":`+prevResult))); err != nil {
		t.Fatal(err)
	}
	obj := e.api.Object(advName)
	if obj == nil || len(obj.Spec.Containers) != 1 {
		t.Fatalf("advertisement = %+v", obj)
	}
	if c := obj.Spec.Containers[0]; !c.Standby || c.HolderGeneration != 0 {
		t.Errorf("entry = %+v, want standby without a generation", c)
	}
	if e.api.Object(source.Name) == nil {
		t.Error("a standby ADD deleted the source node's advertisement")
	}
}
