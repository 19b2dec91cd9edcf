package routing

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestAddAnnouncesOneType5RoutePerPrefixAndDelWithdrawsThem(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24", "fd20::5/64"}}
	from := f.LogOffset()
	c := a.Add(t, att)
	f.WaitPaths(t, 1, att.Prefixes()...)

	mac := strings.TrimSpace(show(a.Node, "cat", "/sys/class/net/"+routing.VXLANDeviceName("blue")+"/address"))
	for _, p := range att.Prefixes() {
		paths := f.Paths(t, p)
		got := paths[0]
		if got.NextHop != a.Underlay.String() || !strings.HasPrefix(got.RD, a.Underlay.String()+":") {
			t.Errorf("%s: next hop %s RD %s, want %s and an RD of router ID %s", p, got.NextHop, got.RD, a.Underlay, a.Underlay)
		}
		for _, want := range []string{"RT:65000:10100", "ET:8", "Rmac:" + mac} {
			if !strings.Contains(got.Extended, want) {
				t.Errorf("%s: extended communities %q lack %s", p, got.Extended, want)
			}
		}
		if !strings.Contains(got.Large, "65000:1:0") {
			t.Errorf("%s: large communities %q lack the holderGeneration 65000:1:0", p, got.Large)
		}
	}
	log := readFile(t, f.LogPath(), from)
	for _, p := range att.Prefixes() {
		want := fmt.Sprintf("[5]:[0]:[%d]:[%s] label 10100", p.Bits(), p.Addr())
		if !strings.Contains(log, want) {
			t.Errorf("FRR's log has no %q", want)
		}
	}
	env.WaitCondition(t, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)

	a.Del(t, att, c)
	f.WaitPaths(t, 0, att.Prefixes()...)
}

func TestAnAdvertisementWithoutVNIIsNotAnnouncedAndProgrammedFollowsThePeer(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	novni := harness.Attachment{VPC: "blue", Name: "novni", Addresses: []string{"10.20.1.5/24"}}
	a.Add(t, novni)
	env.WaitCondition(t, novni, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonNoVNI)
	if paths := f.Paths(t, novni.Prefixes()[0]); len(paths) != 0 {
		t.Fatalf("FRR holds %v for an advertisement without vni", paths)
	}

	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, att)
	env.WaitCondition(t, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	f.StopFRR()
	env.WaitCondition(t, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonNoEstablishedPeer)
	if err := f.StartFRR(); err != nil {
		t.Fatal(err)
	}
	env.WaitCondition(t, att, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	f.WaitPaths(t, 1, att.Prefixes()...)
}

func readFile(t *testing.T, path string, from int64) string {
	t.Helper()
	b := readAll(t, path)
	if int(from) > len(b) {
		return ""
	}
	return string(b[from:])
}

func TestAnEBGPPeerOnAnotherPortWithATCPMD5PasswordGetsTheRoutes(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabricWith(t, harness.FabricOptions{ASN: 65000, NodeASN: 65010, Port: 1179, Password: "galactic-md5"})
	a := f.NewRouted(t, env, "node-a")
	att := harness.Attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}}
	a.Add(t, att)
	f.WaitPaths(t, 1, att.Prefixes()...)
	if got := f.Paths(t, att.Prefixes()[0])[0].Extended; !strings.Contains(got, "RT:65000:10100") {
		t.Errorf("route target over eBGP: %s", got)
	}
	if out, err := a.Router.Get("/healthz"); err != nil || !strings.Contains(out, "ok") {
		t.Errorf("/healthz: %q %v", out, err)
	}
	if v, err := a.Router.Metric(`galactic_router_peers{state="established"}`); err != nil || v != 1 {
		t.Errorf("established peers metric: %v %v", v, err)
	}
	if v, err := a.Router.Metric("galactic_router_paths_announced"); err != nil || v != 1 {
		t.Errorf("announced paths metric: %v %v", v, err)
	}

	// A node with the wrong key never gets a session.
	b := f.NewRouted(t, env, "node-b", func(c *config.File) { c.Peers[0].Password = "wrong" })
	other := harness.Attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}}
	b.Add(t, other)
	env.WaitCondition(t, other, "node-b", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonNoEstablishedPeer)
	if paths := f.Paths(t, other.Prefixes()[0]); len(paths) != 0 {
		t.Fatalf("a node with the wrong TCP MD5 key got its route in: %+v", paths)
	}
}
