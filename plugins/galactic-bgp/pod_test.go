package main

import (
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/settings"
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

const podCNIArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=tenant-a;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=1234"

// podArgs are the CNI arguments of pod web-0's sandbox c1 in tenant-a.
func podArgs(conf []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c1", Args: podCNIArgs, StdinData: conf}
}

// objectRecord is galactic-cni's record of a VPCAttachment of pod web-0.
func objectRecord(ifName, name, uid, addr string) state.Record {
	r := state.Record{ContainerID: "c1", IfName: ifName, Netns: "/run/netns/c1",
		VPC: "blue-1a2b3c4d", Attachment: name + "-" + uid, Namespace: "tenant-a", AttachmentName: name, AttachmentUID: uid,
		VNI: 100, Announce: "always", Addresses: []string{addr}, Holder: "node-a/c1", HolderGeneration: 3}
	if ifName != "eth0" {
		r.ChainIfName = "eth0"
	}
	return r
}

const twoPrev = `{"cniVersion":"1.1.0","interfaces":[{"name":"gv1"},{"name":"eth0","sandbox":"/run/netns/c1"},{"name":"gv2"},{"name":"net1","sandbox":"/run/netns/c1"}],` +
	`"ips":[{"address":"10.20.0.5/16","interface":1},{"address":"10.30.0.7/16","interface":3}]}`

func TestAddOfVPCAttachmentsPublishesEachFromGalacticCNIsRecordsWithoutReadingThem(t *testing.T) {
	// Per attachment: the advertisement's create (the lease holder's is
	// new on the node: no read first), and the list of other nodes'
	// leftovers. Nothing reads a VPCAttachment.
	e := newTestEnv(t, "get", "create", "list")
	e.record(t, objectRecord("eth0", "web", "aaa", "10.20.0.5/16"))
	db := objectRecord("net1", "db", "bbb", "10.30.0.7/16")
	db.VNI, db.Announce = 200, "whenAvailable"
	e.record(t, db)
	if err := e.p.cmdAdd(podArgs(sharedStanza(`"network.galactic.dev/attachments":"web,db"`, `"prevResult":`+twoPrev))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, uid, ifName, prefix string
		vni                       int32
		announce                  v1alpha1.Announce
	}{
		{"blue-1a2b3c4d.web-aaa.node-a", "aaa", "eth0", "10.20.0.5/32", 100, "always"},
		{"blue-1a2b3c4d.db-bbb.node-a", "bbb", "net1", "10.30.0.7/32", 200, "whenAvailable"},
	} {
		obj := e.api.Object(tc.name)
		if obj == nil {
			t.Fatalf("no advertisement %s", tc.name)
		}
		if obj.Labels[v1alpha1.LabelAttachmentUID] != tc.uid || obj.Labels[v1alpha1.LabelNamespace] != "tenant-a" || obj.Spec.VNI != tc.vni || obj.Spec.Announce != tc.announce {
			t.Errorf("%s: labels %v, vni %d, announce %s", tc.name, obj.Labels, obj.Spec.VNI, obj.Spec.Announce)
		}
		if len(obj.Spec.Containers) != 1 {
			t.Fatalf("%s: entries %+v", tc.name, obj.Spec.Containers)
		}
		c := obj.Spec.Containers[0]
		if c.IfName != tc.ifName || c.AttachmentUID != tc.uid || c.HolderGeneration != 3 || len(c.Prefixes) != 1 || string(c.Prefixes[0]) != tc.prefix {
			t.Errorf("%s: entry %+v", tc.name, c)
		}
	}
	if calls := e.api.Calls(); len(calls) != 4 {
		t.Errorf("calls %q, want two per attachment", calls)
	}
}

func TestAddOfVPCAttachmentsRefusesWhatDoesNotMatchGalacticCNIsRecordsAndPublishesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		recs  []state.Record
		annot string
		prev  string
		env   map[string]string
		code  uint
		msg   string
	}{
		{name: "refused pod annotations", annot: `"network.galactic.dev/attachment":"web","network.galactic.dev/vni":"10100"`,
			code: types.ErrInvalidNetworkConfig, msg: "pod annotation network.galactic.dev/vni is refused"},
		{name: "a pod naming no attachment", annot: `"io.kubernetes.pod.name":"web-0"`,
			code: types.ErrInvalidNetworkConfig, msg: "annotate the pod with network.galactic.dev/attachment"},
		{name: "no record", annot: `"network.galactic.dev/attachment":"web"`,
			code: types.ErrInvalidNetworkConfig, msg: "galactic-cni recorded no attachment"},
		{name: "records of other attachments", annot: `"network.galactic.dev/attachment":"web"`, recs: []state.Record{objectRecord("eth0", "db", "bbb", "10.20.0.5/16")},
			code: types.ErrInvalidNetworkConfig, msg: "galactic-bgp names [VPCAttachment tenant-a/web] but galactic-cni attached [VPCAttachment tenant-a/db]"},
		{name: "a prevResult without the recorded address", annot: `"network.galactic.dev/attachment":"web"`, recs: []state.Record{objectRecord("eth0", "web", "aaa", "10.20.0.9/16")},
			code: types.ErrInvalidNetworkConfig, msg: "prevResult lacks 10.20.0.9/32, which galactic-cni configured for VPCAttachment tenant-a/web"},
		{name: "an inline stanza on a node that requires objects", env: map[string]string{settings.EnvRequireAttachmentObjects: "true"},
			code: types.ErrInvalidNetworkConfig, msg: "requireAttachmentObjects"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t) // any API call fails the test
			for k, v := range tc.env {
				e.env[k] = v
			}
			for _, r := range tc.recs {
				e.record(t, r)
			}
			conf := sharedStanza(tc.annot, `"prevResult":`+twoPrev)
			if tc.annot == "" {
				conf = stanza(`"prevResult":` + prevResult)
			}
			wantCode(t, e.p.cmdAdd(podArgs(conf)), tc.code, tc.msg)
		})
	}
}

func TestDelOfVPCAttachmentsReleasesEachEntryByTheRecordsEvenWithoutAValidConfig(t *testing.T) {
	e := newTestEnv(t, "get", "delete")
	web, db := objectRecord("eth0", "web", "aaa", "10.20.0.5/16"), objectRecord("net1", "db", "bbb", "10.30.0.7/16")
	for _, r := range []state.Record{web, db} {
		e.record(t, r)
		k := recordKey(r, "node-a")
		e.api.Seed(&v1alpha1.BGPAdvertisement{
			ObjectMeta: metaFor(k.VPC, k.Attachment, "node-a"),
			Spec: v1alpha1.BGPAdvertisementSpec{VPC: k.VPC, Attachment: k.Attachment, Node: "node-a",
				Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: r.IfName, Netns: "/run/netns/c1", AttachmentUID: r.AttachmentUID}}},
		})
	}
	// The pod's annotations as they are now, refused: DEL goes by the records.
	if err := e.p.cmdDel(podArgs(sharedStanza(`"network.galactic.dev/vpc":"blue"`, ""))); err != nil {
		t.Fatal(err)
	}
	for _, r := range []state.Record{web, db} {
		if obj := e.api.Object(recordKey(r, "node-a").Name()); obj != nil {
			t.Errorf("advertisement left: %+v", obj)
		}
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
