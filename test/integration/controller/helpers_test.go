// Package controller runs the real galactic-controller binary, two
// replicas with leader election under the controller's own service
// account and RBAC from installer/manifests, against a real
// kube-apiserver and etcd with the cluster's kube-controller-manager
// (which aggregates the tenants' roles into admin, edit and view), and
// checks what tenants and nodes see through the API.
package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// Leader election settings of the package's controllers: short, so a
// failover fits a test.
var electionArgs = []string{"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}

type fixture struct {
	c    *harness.Cluster
	dir  string
	api  *client.Clients
	kube kubernetes.Interface
	// ctrls are the two replicas.
	ctrls []*harness.Controller
	// release undoes what tests added to the fixture (node environments).
	release []func()
}

var (
	fx     *fixture
	fxErr  error
	fxOnce sync.Once
)

func TestMain(m *testing.M) {
	harness.Main(m, func() {
		if fx != nil {
			fx.close()
		}
	})
}

func (f *fixture) close() {
	for _, r := range f.release {
		r()
	}
	for _, c := range f.ctrls {
		c.Terminate()
	}
	if f.c != nil {
		f.c.Close()
	}
	if f.dir != "" {
		_ = harness.RemoveDir(f.dir)
	}
}

// setup starts, on first use, the cluster's control plane (no nodes) and
// two galactic-controller replicas.
func setup(t *testing.T) *fixture {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the control plane and the controller manager on the first run")
	}
	harness.RequireRoot(t)
	fxOnce.Do(func() { fx, fxErr = start() })
	if fxErr != nil {
		t.Fatal(fxErr)
	}
	for _, c := range fx.ctrls {
		if c.Exited() || c.Pid() == 0 {
			t.Fatalf("controller %s is not running:\n%s", c.Identity, c.LogTail(30))
		}
	}
	// The controller's own identity must be allowed everything it does.
	t.Cleanup(func() {
		for _, c := range fx.ctrls {
			b, _ := os.ReadFile(c.LogPath)
			var refused []string
			for line := range strings.SplitSeq(string(b), "\n") {
				// A write into a namespace being deleted (a test's tenant
				// going) is refused with 403 too, by the namespace's
				// lifecycle, not by RBAC.
				if strings.Contains(line, "forbidden") && !strings.Contains(line, "because it is being terminated") {
					refused = append(refused, line)
				}
			}
			if len(refused) > 0 {
				t.Errorf("controller %s was refused requests by RBAC:\n%s", c.Identity, strings.Join(refused, "\n"))
			}
		}
	})
	return fx
}

func start() (f *fixture, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	f = &fixture{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.dir, err = harness.MkdirTemp("galactic-controller-test-"); err != nil {
		return f, err
	}
	if f.c, err = harness.StartCluster(ctx, os.Stderr); err != nil {
		return f, err
	}
	f.kube = f.c.Kube
	if f.api, err = client.New(f.c.Admin); err != nil {
		return f, err
	}
	if err = harness.ApplyControllerManifests(ctx, f.c.ControlPlane); err != nil {
		return f, err
	}
	bin, err := harness.BuildController(f.dir)
	if err != nil {
		return f, err
	}
	kc := filepath.Join(f.dir, "controller.kubeconfig")
	if err = harness.ServiceAccountKubeconfig(ctx, f.c.ControlPlane, harness.Namespace, harness.ControllerServiceAccount, kc); err != nil {
		return f, err
	}
	for i := range 2 {
		c, err := harness.NewController(bin, kc, f.dir, fmt.Sprintf("controller-%d", i),
			append([]string{"--vni-hold=5s"}, electionArgs...)...)
		if err != nil {
			return f, err
		}
		if err := c.Start(); err != nil {
			return f, err
		}
		f.ctrls = append(f.ctrls, c)
	}
	if _, err := f.leader(ctx); err != nil {
		return f, err
	}
	return f, nil
}

// leader waits until one of the replicas leads and returns it.
func (f *fixture) leader(ctx context.Context) (*harness.Controller, error) {
	var leader *harness.Controller
	err := harness.Poll(ctx, time.Minute, "a controller leads", func() error {
		l, err := f.kube.CoordinationV1().Leases(harness.Namespace).Get(ctx, "galactic-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil {
			return errors.New("the lease has no holder")
		}
		for _, c := range f.ctrls {
			if c.Identity == *l.Spec.HolderIdentity && c.Pid() != 0 {
				if v, ok, _ := c.Metric("galactic_controller_leader"); ok && v == 1 {
					leader = c
					return nil
				}
			}
		}
		return fmt.Errorf("lease held by %s, which does not report leading", *l.Spec.HolderIdentity)
	})
	if err != nil {
		var logs strings.Builder
		for _, c := range f.ctrls {
			fmt.Fprintf(&logs, "--- %s\n%s\n", c.Identity, c.LogTail(20))
		}
		return nil, fmt.Errorf("%w\n%s", err, logs.String())
	}
	return leader, nil
}

// ensureBoth restarts a replica a test stopped, as the Deployment would.
func (f *fixture) ensureBoth(t *testing.T) {
	t.Helper()
	for _, c := range f.ctrls {
		if c.Pid() == 0 || c.Exited() {
			c.Kill()
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// tenant creates a namespace for the test; it is deleted afterwards (the
// namespace controller deletes its objects, which the controller lets go).
func (f *fixture) tenant(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	_, err := f.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	t.Cleanup(func() { _ = f.kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}) })
	return name
}

func vpcObject(ns, name string, networks ...string) *v1alpha1.VPC {
	v := &v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, n := range networks {
		v.Spec.Networks = append(v.Spec.Networks, v1alpha1.CIDR(n))
	}
	return v
}

func attachmentObject(ns, name, vpc string, addrs ...string) *v1alpha1.VPCAttachment {
	a := &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.VPCAttachmentSpec{VPC: vpc}}
	for _, s := range addrs {
		a.Spec.Addresses = append(a.Spec.Addresses, v1alpha1.IPAddress(s))
	}
	return a
}

func (f *fixture) createVPC(t *testing.T, v *v1alpha1.VPC) *v1alpha1.VPC {
	t.Helper()
	out, err := f.api.VPCs(v.Namespace).Create(context.Background(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating VPC %s/%s: %v", v.Namespace, v.Name, err)
	}
	return out
}

func (f *fixture) createAttachment(t *testing.T, a *v1alpha1.VPCAttachment) *v1alpha1.VPCAttachment {
	t.Helper()
	out, err := f.api.VPCAttachments(a.Namespace).Create(context.Background(), a, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating VPCAttachment %s/%s: %v", a.Namespace, a.Name, err)
	}
	return out
}

// waitObject waits until check accepts the object read from the API (not
// found reads as nil), and returns it. limit bounds the wait; it is not
// a speed requirement.
func waitObject[T any](t *testing.T, limit time.Duration, what string, get func() (*T, error), check func(*T) error) *T {
	t.Helper()
	var obj *T
	harness.Eventually(t, limit, what, func() error {
		o, err := get()
		if apierrors.IsNotFound(err) {
			o, err = nil, nil
		}
		if err != nil {
			return err
		}
		if err := check(o); err != nil {
			return err
		}
		obj = o
		return nil
	})
	return obj
}

const waitLimit = time.Minute

func (f *fixture) waitVPC(t *testing.T, ns, name string, check func(*v1alpha1.VPC) error) *v1alpha1.VPC {
	t.Helper()
	return waitObject(t, waitLimit, "VPC "+ns+"/"+name, func() (*v1alpha1.VPC, error) {
		return f.api.VPCs(ns).Get(context.Background(), name, metav1.GetOptions{})
	}, check)
}

func (f *fixture) waitAttachment(t *testing.T, ns, name string, check func(*v1alpha1.VPCAttachment) error) *v1alpha1.VPCAttachment {
	t.Helper()
	return waitObject(t, waitLimit, "VPCAttachment "+ns+"/"+name, func() (*v1alpha1.VPCAttachment, error) {
		return f.api.VPCAttachments(ns).Get(context.Background(), name, metav1.GetOptions{})
	}, check)
}

// condition checks a condition of conds: status, and reason when given.
func condition(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c.Status != status || (reason != "" && c.Reason != reason) {
		return fmt.Errorf("%s=%s %s (%s), want %s %s", typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return nil
}

func readyVPC(v *v1alpha1.VPC) error {
	if v == nil {
		return errors.New("not found")
	}
	return condition(v.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonAllocated)
}

func readyAttachment(a *v1alpha1.VPCAttachment) error {
	if a == nil {
		return errors.New("not found")
	}
	return condition(a.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonAllocated)
}

func notReady(reason string) func(*v1alpha1.VPCAttachment) error {
	return func(a *v1alpha1.VPCAttachment) error {
		if a == nil {
			return errors.New("not found")
		}
		return condition(a.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, reason)
	}
}

func gone[T any](obj *T) error {
	if obj != nil {
		return errors.New("still exists")
	}
	return nil
}

func readyMessage(a *v1alpha1.VPCAttachment) string {
	if c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		return c.Message
	}
	return ""
}

// attachmentLock is the handoff Lock of a Ready attachment's lease, as
// the data path takes it: named from the data-plane names, labelled with
// the attachment's namespace and UID on every write.
func (f *fixture) attachmentLock(t *testing.T, a *v1alpha1.VPCAttachment) *handoff.Lock {
	t.Helper()
	if a.Status.Dataplane == nil {
		t.Fatalf("VPCAttachment %s/%s has no data-plane names", a.Namespace, a.Name)
	}
	name := names.Lease(a.Status.Dataplane.VPC, a.Status.Dataplane.Attachment)
	l, err := handoff.New(f.api.Leases(harness.Namespace), harness.Namespace, name, handoff.Options{LeaseDuration: 60 * time.Second,
		Identity: handoff.Identity{Namespace: a.Namespace, UID: string(a.UID)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.kube.CoordinationV1().Leases(harness.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return l
}

// advertise publishes node's advertisement of a Ready attachment as
// galactic-bgp does for an object-backed one, with one entry.
func (f *fixture) advertise(t *testing.T, a *v1alpha1.VPCAttachment, node string, generation int64) *v1alpha1.BGPAdvertisement {
	t.Helper()
	dp := a.Status.Dataplane
	labels := names.AdvertisementLabels(dp.VPC, dp.Attachment, node)
	labels[v1alpha1.LabelNamespace] = a.Namespace
	labels[v1alpha1.LabelAttachmentUID] = string(a.UID)
	var prefixes []v1alpha1.Prefix
	for _, p := range a.Status.Addresses {
		addr, _, _ := strings.Cut(string(p), "/")
		bits := "/32"
		if strings.Contains(addr, ":") {
			bits = "/128"
		}
		prefixes = append(prefixes, v1alpha1.Prefix(addr+bits))
	}
	adv := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Namespace: harness.Namespace, Name: names.Advertisement(dp.VPC, dp.Attachment, node), Labels: labels},
		Spec: v1alpha1.BGPAdvertisementSpec{VPC: dp.VPC, Attachment: dp.Attachment, Node: node, VNI: a.Status.VNI, Prefixes: prefixes,
			Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "eth0", Netns: "/var/run/netns/x", Prefixes: prefixes,
				HolderGeneration: generation, AttachmentUID: string(a.UID)}}},
	}
	out, err := f.api.BGPAdvertisements(harness.Namespace).Create(context.Background(), adv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("advertising %s on %s: %v", a.Name, node, err)
	}
	t.Cleanup(func() {
		_ = f.api.BGPAdvertisements(harness.Namespace).Delete(context.Background(), adv.Name, metav1.DeleteOptions{})
	})
	return out
}
