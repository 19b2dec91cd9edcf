package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/settings"
)

// fakeAttachments serves VPCAttachments by namespace/name and records
// every read, those that pass the API server's cache as "from etcd"; a
// read of anything else is NotFound. cached, when it has the object,
// is what the cache still holds of it.
type fakeAttachments struct {
	objects map[string]*v1alpha1.VPCAttachment
	cached  map[string]*v1alpha1.VPCAttachment
	reads   []string
}

func (f *fakeAttachments) get(_ context.Context, namespace, name string, cached bool) (*v1alpha1.VPCAttachment, error) {
	key := namespace + "/" + name
	if !cached {
		f.reads = append(f.reads, key+" from etcd")
	} else if f.reads = append(f.reads, key); f.cached[key] != nil {
		return f.cached[key].DeepCopy(), nil
	}
	if a, ok := f.objects[key]; ok {
		return a.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "network.galactic.dev", Resource: "vpcattachments"}, name)
}

// readyAttachment is a VPCAttachment as galactic-controller leaves it once
// it has allocated its address.
func readyAttachment(namespace, name, uid string, addresses ...v1alpha1.Prefix) *v1alpha1.VPCAttachment {
	return &v1alpha1.VPCAttachment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: k8stypes.UID("u-" + uid)},
		Spec:       v1alpha1.VPCAttachmentSpec{VPC: "blue", Announce: v1alpha1.AnnounceAlways},
		Status: v1alpha1.VPCAttachmentStatus{
			VNI: 100, Addresses: addresses,
			Dataplane:  &v1alpha1.Dataplane{VPC: "blue-1a2b3c4d", Attachment: name + "-" + uid},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllocated}},
		},
	}
}

// objectEnv is a node whose kubeconfig leads nowhere: any lease or
// advertisement call would fail with code 50, so a refusal with another
// code was decided before the lease.
type objectEnv struct {
	p        *plugin
	api      *fakeAttachments
	stateDir string
}

func newObjectEnv(t *testing.T, objects ...*v1alpha1.VPCAttachment) *objectEnv {
	dir := t.TempDir()
	e := &objectEnv{api: &fakeAttachments{objects: map[string]*v1alpha1.VPCAttachment{}}, stateDir: filepath.Join(dir, "state")}
	for _, o := range objects {
		e.api.objects[o.Namespace+"/"+o.Name] = o
	}
	vars := map[string]string{
		settings.EnvConfig:     filepath.Join(dir, "none.json"),
		settings.EnvNodeName:   "node-a",
		settings.EnvStateDir:   e.stateDir,
		settings.EnvLogFile:    filepath.Join(dir, "galactic.log"),
		settings.EnvKubeconfig: filepath.Join(dir, "no-kubeconfig"),
	}
	e.p = &plugin{getenv: func(k string) string { return vars[k] }, getAttachment: e.api.get, live: func(string) bool { return true }}
	return e
}

const podCNIArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=tenant-a;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1"

func podStanza(annotations string) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"galactic","type":"galactic-cni","mode":"veth","routing":"table",` +
		`"capabilities":{"io.kubernetes.cri.pod-annotations":true},` +
		`"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{` + annotations + `}}}`)
}

func TestAnADDOfVPCAttachmentsRefusesBeforeWritingTakingALeaseOrMakingAnInterface(t *testing.T) {
	notReady := readyAttachment("tenant-a", "pending", "p")
	notReady.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonAddressInUse, Message: "10.20.0.5 is held by web-1"}}
	unconditioned := readyAttachment("tenant-a", "fresh", "f")
	unconditioned.Status = v1alpha1.VPCAttachmentStatus{}
	deleting := readyAttachment("tenant-a", "going", "g", "10.20.0.7/16")
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	noNames := readyAttachment("tenant-a", "unnamed", "n", "10.20.0.8/16")
	noNames.Status.Dataplane = nil
	whenAvailable := readyAttachment("tenant-a", "drained", "d", "10.20.0.9/16")
	whenAvailable.Spec.Announce = v1alpha1.AnnounceWhenAvailable
	badAddress := readyAttachment("tenant-a", "odd", "o", "10.20.0.10")
	objects := []*v1alpha1.VPCAttachment{
		readyAttachment("tenant-a", "web-0-net0", "w", "10.20.0.5/16"),
		readyAttachment("tenant-b", "secret", "s", "10.20.0.6/16"),
		notReady, unconditioned, deleting, noNames, whenAvailable, badAddress,
	}
	for _, tc := range []struct {
		name        string
		annotations string
		stanza      []byte
		code        uint
		msg         []string
		reads       []string
	}{
		{name: "a missing attachment", annotations: `"network.galactic.dev/attachment":"absent"`, code: types.ErrInvalidNetworkConfig,
			msg: []string{"VPCAttachment tenant-a/absent", "does not exist in namespace tenant-a"}, reads: []string{"tenant-a/absent", "tenant-a/absent from etcd"}},
		{name: "another namespace's attachment is looked up in the pod's own", annotations: `"network.galactic.dev/attachment":"secret"`, code: types.ErrInvalidNetworkConfig,
			msg: []string{"VPCAttachment tenant-a/secret", "does not exist"}, reads: []string{"tenant-a/secret", "tenant-a/secret from etcd"}},
		{name: "the second of two is missing", annotations: `"network.galactic.dev/attachments":"web-0-net0,absent"`, code: types.ErrInvalidNetworkConfig,
			msg: []string{"tenant-a/absent"}, reads: []string{"tenant-a/web-0-net0", "tenant-a/absent", "tenant-a/absent from etcd"}},
		{name: "not Ready", annotations: `"network.galactic.dev/attachment":"pending"`, code: types.ErrTryAgainLater,
			msg: []string{"VPCAttachment tenant-a/pending is not Ready", "AddressInUse", "10.20.0.5 is held by web-1"}, reads: []string{"tenant-a/pending", "tenant-a/pending from etcd"}},
		{name: "no Ready condition yet", annotations: `"network.galactic.dev/attachment":"fresh"`, code: types.ErrTryAgainLater,
			msg: []string{"tenant-a/fresh is not Ready (it has no Ready condition yet)"}, reads: []string{"tenant-a/fresh", "tenant-a/fresh from etcd"}},
		{name: "being deleted", annotations: `"network.galactic.dev/attachment":"going"`, code: types.ErrTryAgainLater,
			msg: []string{"tenant-a/going is being deleted"}, reads: []string{"tenant-a/going", "tenant-a/going from etcd"}},
		{name: "no data-plane names", annotations: `"network.galactic.dev/attachment":"unnamed"`, code: types.ErrTryAgainLater,
			msg: []string{"tenant-a/unnamed", "status.dataplane"}, reads: []string{"tenant-a/unnamed", "tenant-a/unnamed from etcd"}},
		{name: "announce whenAvailable without handoff", stanza: []byte(`{"cniVersion":"1.1.0","name":"vm","type":"galactic-cni","routing":"table","namespace":"tenant-a","attachment":"drained","handoff":{"enabled":false}}`),
			code: types.ErrInvalidNetworkConfig, msg: []string{`VPCAttachment tenant-a/drained has spec.announce "whenAvailable", which needs the handoff lease`}, reads: []string{"tenant-a/drained"}},
		{name: "an address without its prefix length", annotations: `"network.galactic.dev/attachment":"odd"`, code: types.ErrInvalidNetworkConfig,
			msg: []string{`VPCAttachment tenant-a/odd status.addresses[0] "10.20.0.10" is not a CIDR`}, reads: []string{"tenant-a/odd"}},
		{name: "a refused pod annotation reads nothing", annotations: `"network.galactic.dev/attachment":"web-0-net0","network.galactic.dev/addresses":"10.20.0.99/16"`, code: types.ErrInvalidNetworkConfig,
			msg: []string{"network.galactic.dev/addresses is refused", "spec.addresses"}},
		{name: "a VMM stanza with vpc beside namespace reads nothing", stanza: []byte(`{"cniVersion":"1.1.0","name":"vm","type":"galactic-cni","routing":"table","namespace":"tenant-a","vpc":"blue","attachment":"web-0-net0"}`),
			code: types.ErrInvalidNetworkConfig, msg: []string{"vpc is set beside namespace", "spec.vpc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newObjectEnv(t, objects...)
			stanza := tc.stanza
			if stanza == nil {
				stanza = podStanza(tc.annotations)
			}
			err := e.p.cmdAdd(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/c1", Args: podCNIArgs, StdinData: stanza})
			var terr *types.Error
			if !errors.As(err, &terr) || terr.Code != tc.code {
				t.Fatalf("want code %d, got %v", tc.code, err)
			}
			for _, m := range tc.msg {
				if !strings.Contains(terr.Msg, m) {
					t.Errorf("message %q does not say %q", terr.Msg, m)
				}
			}
			if !slices.Equal(e.api.reads, tc.reads) {
				t.Errorf("reads %v, want %v", e.api.reads, tc.reads)
			}
			if _, err := os.Stat(filepath.Join(e.stateDir, "records")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the refused ADD wrote node records (%v)", err)
			}
		})
	}
}

func TestAnADDThatPassesTheChecksTakesTheLeaseNext(t *testing.T) {
	// With the checks passed, the next step is the lease: here the
	// kubeconfig leads nowhere, so the ADD stops there with code 50,
	// after exactly one read of the attachment.
	e := newObjectEnv(t, readyAttachment("tenant-a", "web-0-net0", "w", "10.20.0.5/16"))
	err := e.p.cmdAdd(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/c1", Args: podCNIArgs, StdinData: podStanza(`"network.galactic.dev/attachment":"{pod}-net0"`)})
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrPluginNotAvailable {
		t.Fatalf("want code 50 from the lease, got %v", err)
	}
	if !slices.Equal(e.api.reads, []string{"tenant-a/web-0-net0"}) {
		t.Fatalf("reads %v", e.api.reads)
	}
}

func TestACacheBehindTheAttachmentDoesNotRefuseIt(t *testing.T) {
	// The cache has not yet seen the controller make the attachment
	// ready; etcd has.
	e := newObjectEnv(t, readyAttachment("tenant-a", "web-0-net0", "w", "10.20.0.5/16"))
	stale := readyAttachment("tenant-a", "web-0-net0", "w")
	stale.Status = v1alpha1.VPCAttachmentStatus{}
	e.api.cached = map[string]*v1alpha1.VPCAttachment{"tenant-a/web-0-net0": stale}
	err := e.p.cmdAdd(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/c1", Args: podCNIArgs, StdinData: podStanza(`"network.galactic.dev/attachment":"{pod}-net0"`)})
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrPluginNotAvailable {
		t.Fatalf("want code 50 from the lease, got %v", err)
	}
	if want := []string{"tenant-a/web-0-net0", "tenant-a/web-0-net0 from etcd"}; !slices.Equal(e.api.reads, want) {
		t.Fatalf("reads %v, want %v", e.api.reads, want)
	}
}

func TestAnInlineStanzaOnANodeThatRequiresObjectsIsRefusedByEveryVerbThatNeedsIt(t *testing.T) {
	e := newObjectEnv(t)
	vars := map[string]string{}
	get := e.p.getenv
	e.p.getenv = func(k string) string {
		if k == settings.EnvRequireAttachmentObjects {
			return "true"
		}
		if v, ok := vars[k]; ok {
			return v
		}
		return get(k)
	}
	stanza := []byte(`{"cniVersion":"1.1.0","name":"vm","type":"galactic-cni","routing":"table","vpc":"blue","attachment":"vm-1","addresses":["10.20.0.5/24"]}`)
	err := e.p.cmdAdd(&skel.CmdArgs{ContainerID: "c1", IfName: "net0", Netns: "/var/run/netns/c1", StdinData: stanza})
	var terr *types.Error
	if !errors.As(err, &terr) || terr.Code != types.ErrInvalidNetworkConfig || !strings.Contains(terr.Msg, "requireAttachmentObjects") {
		t.Fatalf("want code 7 naming requireAttachmentObjects, got %v", err)
	}
	if len(e.api.reads) != 0 {
		t.Fatalf("reads %v", e.api.reads)
	}
}

func TestTheAttachmentIsReadFromTheAPIServersCache(t *testing.T) {
	queries := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries <- r.URL.Path + "?" + r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"network.galactic.dev/v1alpha1","kind":"VPCAttachment","metadata":{"namespace":"tenant-a","name":"web"}}`))
	}))
	defer srv.Close()
	cs, err := client.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	get, terr := (&plugin{}).attachmentReader(&invocation{cs: cs})
	if terr != nil {
		t.Fatal(terr)
	}
	if _, err := get(context.Background(), "tenant-a", "web", true); err != nil {
		t.Fatal(err)
	}
	if q, want := <-queries, "/apis/network.galactic.dev/v1alpha1/namespaces/tenant-a/vpcattachments/web?resourceVersion=0"; q != want {
		t.Errorf("read %s, want %s", q, want)
	}
}
