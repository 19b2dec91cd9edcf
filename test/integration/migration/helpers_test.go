package migration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/routing"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
)

func TestMain(m *testing.M) { harness.Main(m) }

const (
	vpc    = "blue"
	vni    = 10100
	ifName = "net0"
	// hangGuard bounds waits for something that must happen; it is never
	// a speed limit.
	hangGuard = 30 * time.Second
	// waitSeconds is the attachment's handoff.waitSeconds: how long a
	// promote waits on a source that did not release.
	waitSeconds = 3
)

// cluster is three routed nodes: the VM moves between a and b, c is the
// client's node. The routers keep the shipped withdrawal hold: no wait
// here outlasts it.
type cluster struct {
	env     *harness.Env
	f       *harness.Fabric
	a, b, c *harness.Routed
}

func newCluster(t *testing.T) *cluster {
	env := harness.Setup(t)
	harness.RequireFRR(t)
	f := harness.NewFabric(t)
	return &cluster{env: env, f: f, a: f.NewRouted(t, env, "node-a", harness.ShippedHold),
		b: f.NewRouted(t, env, "node-b", harness.ShippedHold), c: f.NewRouted(t, env, "node-c", harness.ShippedHold)}
}

// vm is the migrating attachment of one test, veth unless the test says
// otherwise: handoff on, and the pod annotations capability (a migration
// target's runtime passes network.galactic.dev/standby). Its lease and
// advertisements go when the test ends (the API server is the package's).
func (cl *cluster) vm(t *testing.T, name string) harness.Attachment {
	t.Helper()
	cl.env.ForgetAttachment(t, vpc, name)
	return harness.Attachment{VPC: vpc, Name: name, Addresses: []string{"10.20.0.5/24"}, VNI: vni,
		Handoff: &harness.Handoff{WaitSeconds: waitSeconds, LeaseSeconds: 60}, PodAnnotations: true}
}

// migration is the driver's migration of vm from one side to the other,
// with no VMM: a veth workload on each side stands in for the guest.
func (cl *cluster) migration(t *testing.T, vm harness.Attachment, from, to *harness.Routed, src *harness.Netns) *migration.Migration {
	t.Helper()
	to.Install(t, vm)
	return &migration.Migration{
		VPC: vpc, Attachment: vm.Name, Network: vm.Network(), IfName: vm.Interface(),
		Source: migration.Side{Node: from.Node, Container: src},
		Target: migration.Side{Node: to.Node, Container: harness.NewContainer(t)},
	}
}

// client adds the client workload on c and waits until it reaches vm.
func (cl *cluster) client(t *testing.T, vm harness.Attachment) *harness.Netns {
	t.Helper()
	cl.env.ForgetAttachment(t, harness.Client.VPC, harness.Client.Name)
	return cl.c.AddClient(t, vm.Addr(false))
}

// watchRoute watches n's kernel route for p for the rest of the test.
func watchRoute(t *testing.T, n *harness.Routed, p netip.Prefix) *harness.RouteWatch {
	t.Helper()
	w, err := n.WatchRoute(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// watchLease records every version of vm's lease for the rest of the test.
func (cl *cluster) watchLease(t *testing.T, vm harness.Attachment) *harness.LeaseWatch {
	t.Helper()
	w, err := cl.env.WatchLease(t.Context(), vm.LeaseName())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// settled waits until FRR holds only the VM's path via node n and
// node-c's router has passed over it: a withdrawal that reached node-c
// late has been acted on.
func (cl *cluster) settled(t *testing.T, vm harness.Attachment, n *harness.Routed) {
	t.Helper()
	harness.Eventually(t, hangGuard, "FRR holds only "+n.Name+"'s path", func() error {
		if paths := cl.f.Paths(t, vm.Prefix()); len(paths) != 1 || paths[0].NextHop != n.Underlay.String() {
			return fmt.Errorf("%+v", paths)
		}
		return nil
	})
	harness.WaitPasses(t, 1, cl.c.Router)
}

// hostRoute is n's route for p straight to a local interface (galactic-cni's
// host route), nil when there is none.
func hostRoute(t *testing.T, n *harness.Routed, p netip.Prefix) *netlink.Route {
	t.Helper()
	r, err := n.KernelRoute(vpc, p)
	if err != nil {
		t.Fatal(err)
	}
	if r == nil || r.Protocol != routing.Protocol {
		return nil
	}
	return r
}

// advertisement is n's advertisement of vm, nil when there is none.
func (cl *cluster) advertisement(t *testing.T, vm harness.Attachment, n *harness.Routed) *v1alpha1.BGPAdvertisement {
	t.Helper()
	obj, err := cl.env.API.BGPAdvertisements(harness.Namespace).Get(context.Background(), names.Advertisement(vm.DataplaneVPC(), vm.DataplaneName(), n.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// records are the node's galactic-cni records of vm.
func records(t *testing.T, n *harness.Routed, vm harness.Attachment) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(n.Settings.StateDir, "records", "*", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), `"attachment":"`+vm.DataplaneName()+`"`) {
			out = append(out, f)
		}
	}
	return out
}

// hostInterfaces are the node's interfaces with vm's ifalias.
func hostInterfaces(t *testing.T, n *harness.Routed, vm harness.Attachment) []string {
	t.Helper()
	var out []string
	err := n.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().Alias == vm.Alias() {
				out = append(out, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func metavListOptions(selector string) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: selector}
}
