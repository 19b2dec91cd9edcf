package installer

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

var manifestsDir = filepath.Join(harness.RepoRoot(), "installer", "manifests")

// kustomizationResources are the files kustomization.yaml lists, in order.
func kustomizationResources(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(manifestsDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := utilyaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k.Resources
}

// applyManifests server-side applies what `kubectl apply -k` would.
func applyManifests(t *testing.T, env *harness.Env) {
	t.Helper()
	var paths []string
	for _, r := range kustomizationResources(t) {
		paths = append(paths, filepath.Join(manifestsDir, r))
	}
	if err := harness.ApplyManifests(context.Background(), env.CP.Admin, paths...); err != nil {
		t.Fatalf("applying installer/manifests: %v", err)
	}
}

// serviceAccountToken is a token of the DaemonSet's service account on
// node-a from the TokenRequest API, bound to a pod there, as the kubelet
// gets one for the pod.
func serviceAccountToken(t *testing.T, env *harness.Env) string {
	t.Helper()
	token, err := env.NodeToken(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func TestTheKustomizationListsEveryManifestAndNothingElse(t *testing.T) {
	var want []string
	for _, pattern := range []string{"*.yaml", "crds/*.yaml"} {
		matches, _ := filepath.Glob(filepath.Join(manifestsDir, pattern))
		for _, m := range matches {
			rel, _ := filepath.Rel(manifestsDir, m)
			if rel != "kustomization.yaml" {
				want = append(want, rel)
			}
		}
	}
	got := kustomizationResources(t)
	sort.Strings(want)
	sorted := slices.Sorted(slices.Values(got))
	if !slices.Equal(sorted, want) {
		t.Errorf("kustomization.yaml resources %v, the directory holds %v", got, want)
	}
	if got[0] != "namespace.yaml" {
		t.Errorf("the namespace must come first so a plain apply of the list works on a new cluster: %v", got)
	}
}

func TestTheManifestsApplyServerSideAgainAndAgain(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	// The harness installed the CRD already; applying it again with the
	// rest, twice, and as a directory must all be clean.
	applyManifests(t, env)
	applyManifests(t, env)
	if err := harness.ApplyManifests(ctx, env.CP.Admin, manifestsDir); err != nil {
		t.Fatalf("applying the directory: %v", err)
	}

	ds, err := env.Kube.AppsV1().DaemonSets(harness.Namespace).Get(ctx, "galactic-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkDaemonSet(t, ds)
}

// checkDaemonSet asserts the shape that matters for the node: the
// containers, the host namespaces, and capabilities no wider than needed.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	// Only dedicated nodes, whose taint it tolerates.
	if spec.NodeSelector[harness.VPCNodeLabel] != "true" {
		t.Errorf("nodeSelector %v, want %s=true", spec.NodeSelector, harness.VPCNodeLabel)
	}
	taint := harness.VPCNodeTaint()
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
		t.Errorf("tolerations %v do not tolerate the dedicated nodes' taint %v", spec.Tolerations, taint)
	}
	if !spec.HostNetwork || !spec.HostPID {
		t.Errorf("hostNetwork %v hostPID %v: the GC needs both", spec.HostNetwork, spec.HostPID)
	}
	if spec.ServiceAccountName != harness.ServiceAccount {
		t.Errorf("service account %q", spec.ServiceAccountName)
	}
	if len(spec.InitContainers) != 1 || !slices.Equal(spec.InitContainers[0].Command, []string{"galactic-installer", "install"}) {
		t.Errorf("init containers: want one running galactic-installer install, got %+v", spec.InitContainers)
	}
	commands := map[string][]string{}
	for _, c := range spec.Containers {
		commands[c.Name] = c.Command
	}
	if !slices.Equal(commands["gc"], []string{"galactic-gc"}) || !slices.Equal(commands["router"], []string{"galactic-router"}) ||
		!slices.Equal(commands["token-refresher"], []string{"galactic-installer", "run"}) || len(commands) != 3 {
		t.Errorf("containers: want gc (galactic-gc), router (galactic-router) and token-refresher (galactic-installer run), got %v", commands)
	}
	wantAdd := map[string][]corev1.Capability{"gc": {"NET_ADMIN", "SYS_PTRACE", "BPF", "SYS_ADMIN"}, "router": {"NET_ADMIN", "BPF", "SYS_ADMIN"}}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if c.Image != "galactic.example/galactic:REPLACE_ME" {
			t.Errorf("%s: image %q is not the documented placeholder", c.Name, c.Image)
		}
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil {
			t.Errorf("%s: no capabilities section", c.Name)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s is privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s allows privilege escalation", c.Name)
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, wantAdd[c.Name]) {
			t.Errorf("%s: capabilities drop %v add %v, want drop [ALL] add %v", c.Name, sc.Capabilities.Drop, sc.Capabilities.Add, wantAdd[c.Name])
		}
	}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/var/run/netns" && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
				t.Errorf("%s: /var/run/netns must be mounted with HostToContainer propagation", c.Name)
			}
		}
	}
	checkRouterContainers(t, spec)
	var projected bool
	for _, v := range spec.Volumes {
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				projected = projected || s.ServiceAccountToken != nil
			}
		}
	}
	if !projected || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pod must carry exactly one token: the projected one, with automount off")
	}
}

// checkRouterContainers asserts how the router gets its config and what it
// mounts: the node's config read-only, the state dir, and the netns dir to
// judge entries' liveness.
func checkRouterContainers(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	mounts := func(c corev1.Container) map[string]corev1.VolumeMount {
		m := map[string]corev1.VolumeMount{}
		for _, vm := range c.VolumeMounts {
			m[vm.MountPath] = vm
		}
		return m
	}
	var configMap string
	for _, v := range spec.Volumes {
		if v.Name == "router-config" && v.ConfigMap != nil {
			configMap = v.ConfigMap.Name
		}
	}
	if configMap != "galactic-router" {
		t.Errorf("the router-config volume must be the galactic-router ConfigMap, got %q", configMap)
	}
	install := spec.InitContainers[0]
	if m, ok := mounts(install)["/etc/galactic-router"]; !ok || m.Name != "router-config" || !m.ReadOnly {
		t.Errorf("install must mount the router ConfigMap read-only at /etc/galactic-router: %+v", m)
	}
	if !slices.Contains(install.Args, "--router-config-file=/etc/galactic-router/router.json") || !slices.Contains(install.Args, "--router-underlay=$(HOST_IP)") {
		t.Errorf("install args %v: want the ConfigMap file and the node's own underlay", install.Args)
	}
	hostIP := false
	for _, e := range install.Env {
		hostIP = hostIP || (e.Name == "HOST_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP")
	}
	if !hostIP {
		t.Error("install must get HOST_IP from status.hostIP")
	}
	for _, c := range spec.Containers {
		if c.Name != "router" {
			continue
		}
		m := mounts(c)
		if vm, ok := m["/etc/galactic"]; !ok || !vm.ReadOnly {
			t.Errorf("router: /etc/galactic must be mounted read-only: %+v", vm)
		}
		if vm, ok := m["/var/lib/galactic"]; !ok || vm.ReadOnly {
			t.Errorf("router: the state dir must be mounted read-write: %+v", vm)
		}
		if vm, ok := m["/var/run/netns"]; !ok || !vm.ReadOnly {
			t.Errorf("router: /var/run/netns must be mounted read-only: %+v", vm)
		}
		for _, p := range []struct {
			what  string
			probe *corev1.Probe
			path  string
		}{
			{"startup", c.StartupProbe, "/healthz"},
			{"liveness", c.LivenessProbe, "/healthz"},
			{"readiness", c.ReadinessProbe, "/readyz"},
		} {
			if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Host != "127.0.0.1" {
				t.Errorf("router: %s must probe %s on the loopback metrics address: %+v", p.what, p.path, p.probe)
			}
		}
	}
}

func TestTheServiceAccountCanDoWhatThePluginsGCAndRouterNeedAndNothingElse(t *testing.T) {
	env := harness.Setup(t)
	ctx := context.Background()
	applyManifests(t, env)
	cfg := env.TokenConfig(serviceAccountToken(t, env))
	api, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Everything galactic-bgp and galactic-gc do to advertisements.
	advs := api.BGPAdvertisements(harness.Namespace)
	adv := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement("blue", "rbac-0", "node-a"), Labels: names.AdvertisementLabels("blue", "rbac-0", "node-a")},
		Spec: v1alpha1.BGPAdvertisementSpec{VPC: "blue", Attachment: "rbac-0", Node: "node-a", Prefixes: []v1alpha1.Prefix{"10.20.0.9/32"},
			Containers: []v1alpha1.ContainerEntry{{ContainerID: "c1", IfName: "net0", Netns: "/var/run/netns/x", Prefixes: []v1alpha1.Prefix{"10.20.0.9/32"}}}},
	}
	created, err := advs.Create(ctx, adv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create advertisement as the service account: %v", err)
	}
	t.Cleanup(func() { _ = env.API.BGPAdvertisements(harness.Namespace).Delete(ctx, adv.Name, metav1.DeleteOptions{}) })
	got, err := advs.Get(ctx, adv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get advertisement: %v", err)
	}
	if _, err := advs.List(ctx, metav1.ListOptions{LabelSelector: names.AttachmentSelector("blue", "rbac-0")}); err != nil {
		t.Fatalf("list advertisements by label: %v", err)
	}
	got.Spec.Containers = nil
	got.Spec.Prefixes = nil
	updated, err := advs.Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update advertisement: %v", err)
	}
	// What galactic-router does: one label-selected watch of this node's
	// advertisements, status written through the subresource, and a watch
	// of the leases its holders hold.
	w, err := advs.Watch(ctx, metav1.ListOptions{LabelSelector: names.NodeSelector("node-a"), ResourceVersion: updated.ResourceVersion})
	if err != nil {
		t.Fatalf("watch advertisements by node label: %v", err)
	}
	w.Stop()
	updated.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonNoVNI, Message: "rbac", LastTransitionTime: metav1.Now()}}
	if updated, err = advs.UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update advertisement status: %v", err)
	}
	if _, err := api.Leases(harness.Namespace).List(ctx, metav1.ListOptions{LabelSelector: names.HolderNodeSelector("node-a")}); err != nil {
		t.Fatalf("list leases by holder node: %v", err)
	}
	lw, err := api.Leases(harness.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: names.HolderNodeSelector("node-a")})
	if err != nil {
		t.Fatalf("watch leases by holder node: %v", err)
	}
	lw.Stop()
	// And a list and watch of every namespace's VPCAttachments, which
	// say what an object-backed advertisement may announce.
	atts, err := api.VPCAttachments("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list VPCAttachments of every namespace: %v", err)
	}
	aw, err := api.VPCAttachments("").Watch(ctx, metav1.ListOptions{ResourceVersion: atts.ResourceVersion})
	if err != nil {
		t.Fatalf("watch VPCAttachments of every namespace: %v", err)
	}
	aw.Stop()
	rv := updated.ResourceVersion
	if err := advs.Delete(ctx, adv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID, ResourceVersion: &rv}}); err != nil {
		t.Fatalf("guarded delete of the advertisement: %v", err)
	}

	// Everything the handoff does to its lease.
	leases := api.Leases(harness.Namespace)
	holder := "node-a/c1"
	lease, err := leases.Create(ctx, handoff.LeaseFromRecord(harness.Namespace, names.Lease("blue", "rbac-0"), "", handoff.Record{HolderIdentity: holder, LeaseDurationSeconds: 5}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}
	t.Cleanup(func() {
		_ = env.Kube.CoordinationV1().Leases(harness.Namespace).Delete(ctx, lease.Name, metav1.DeleteOptions{})
	})
	if lease, err = leases.Get(ctx, lease.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("get lease: %v", err)
	}
	lease.Spec.HolderIdentity = nil
	lease.Labels = nil
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update lease: %v", err)
	}

	// Another namespace with the same kinds in it, and a Node.
	other := "galactic-rbac-other"
	if _, err := env.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = env.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "galactic-rbac-node"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.CoreV1().Nodes().Delete(ctx, "galactic-rbac-node", metav1.DeleteOptions{}) })

	for _, c := range []struct {
		what string
		call func() error
	}{
		{"read a Secret", func() error {
			_, err := kube.CoreV1().Secrets(harness.Namespace).Get(ctx, "any", metav1.GetOptions{})
			return err
		}},
		{"list Secrets", func() error {
			_, err := kube.CoreV1().Secrets(harness.Namespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list advertisements in another namespace", func() error {
			_, err := api.BGPAdvertisements(other).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create an advertisement in another namespace", func() error {
			a := adv.DeepCopy()
			a.ResourceVersion = ""
			_, err := api.BGPAdvertisements(other).Create(ctx, a, metav1.CreateOptions{})
			return err
		}},
		{"get a lease in another namespace", func() error {
			_, err := api.Leases(other).Get(ctx, "any", metav1.GetOptions{})
			return err
		}},
		{"update a Node", func() error {
			n, err := env.Kube.CoreV1().Nodes().Get(ctx, "galactic-rbac-node", metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Labels = map[string]string{"touched": "yes"}
			_, err = kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}},
		{"patch a Node", func() error {
			_, err := kube.CoreV1().Nodes().Patch(ctx, "galactic-rbac-node", types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"delete a Node", func() error {
			return kube.CoreV1().Nodes().Delete(ctx, "galactic-rbac-node", metav1.DeleteOptions{})
		}},
		{"read a Node", func() error {
			_, err := kube.CoreV1().Nodes().Get(ctx, "galactic-rbac-node", metav1.GetOptions{})
			return err
		}},
		{"delete a lease", func() error {
			return leases.Delete(ctx, lease.Name, metav1.DeleteOptions{})
		}},
		{"patch an advertisement's status", func() error {
			_, err := advs.Patch(ctx, adv.Name, types.MergePatchType, []byte(`{"status":{"conditions":[]}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"patch an advertisement", func() error {
			_, err := advs.Patch(ctx, adv.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"delete all advertisements at once", func() error {
			return advs.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		}},
		{"watch advertisements in another namespace", func() error {
			w, err := api.BGPAdvertisements(other).Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"watch leases in another namespace", func() error {
			w, err := api.Leases(other).Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"create a VPCAttachment", func() error {
			_, err := api.VPCAttachments(other).Create(ctx, &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: "web-0"},
				Spec: v1alpha1.VPCAttachmentSpec{VPC: "blue"}}, metav1.CreateOptions{})
			return err
		}},
		{"write a VPCAttachment's status", func() error {
			_, err := api.VPCAttachments(other).UpdateStatus(ctx, &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: "web-0"},
				Spec: v1alpha1.VPCAttachmentSpec{VPC: "blue"}}, metav1.UpdateOptions{})
			return err
		}},
		{"list pods", func() error {
			_, err := kube.CoreV1().Pods(harness.Namespace).List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		if err := c.call(); !apierrors.IsForbidden(err) {
			t.Errorf("the service account must be forbidden to %s, got %v", c.what, err)
		}
	}

	// The exact rule set the API server computes for the service account,
	// for our two API groups: no verb more than the components use.
	want := []string{
		"coordination.k8s.io/leases:create,get,list,update,watch",
		"network.galactic.dev/bgpadvertisements/status:update",
		"network.galactic.dev/bgpadvertisements:create,delete,get,list,update,watch",
		"network.galactic.dev/vpcattachments:get,list,watch",
		"network.galactic.dev/vpcs:get,list,watch",
	}
	if got := galacticRules(t, kube, harness.Namespace); !slices.Equal(got, want) {
		t.Errorf("rules in %s:\n got %v\nwant %v", harness.Namespace, got, want)
	}
	// Elsewhere it reads the tenants' attachments and nothing more.
	if got, want := galacticRules(t, kube, other), want[3:]; !slices.Equal(got, want) {
		t.Errorf("rules in %s:\n got %v\nwant %v", other, got, want)
	}
}

// galacticRules asks the API server what the caller may do in namespace,
// keeping the rules for the coordination and galactic groups.
func galacticRules(t *testing.T, kube kubernetes.Interface, namespace string) []string {
	t.Helper()
	review, err := kube.AuthorizationV1().SelfSubjectRulesReviews().Create(context.Background(),
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("rules review: %v", err)
	}
	var out []string
	for _, r := range review.Status.ResourceRules {
		for _, g := range r.APIGroups {
			if g != "coordination.k8s.io" && g != v1alpha1.SchemeGroupVersion.Group && g != "*" {
				continue
			}
			verbs := slices.Sorted(slices.Values(r.Verbs))
			for _, res := range r.Resources {
				out = append(out, g+"/"+res+":"+strings.Join(verbs, ","))
			}
		}
	}
	sort.Strings(out)
	return out
}

// The one core permission: the installer's exchange of the pod's token for
// one bound to the Node, for its own service account only.
func TestTheServiceAccountMayRequestTokensOnlyForItself(t *testing.T) {
	env := harness.Setup(t)
	applyManifests(t, env)
	kube, err := kubernetes.NewForConfig(env.TokenConfig(serviceAccountToken(t, env)))
	if err != nil {
		t.Fatal(err)
	}
	for account, want := range map[string]bool{harness.ServiceAccount: true, "default": false, "": false} {
		review, err := kube.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: harness.Namespace, Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: account}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != want {
			t.Errorf("create serviceaccounts/token %q: allowed %v, want %v", account, review.Status.Allowed, want)
		}
	}
}
